"""The NeMo Gym lock covers what the environments need: nemo-gym/requirements.in and every plugin's
plugins/<name>/nemo-gym-requirements.txt. `make gym` installs only the lock, so a requirement missing
from it would vanish from .gym/venv at the next `make gym`; the fix is `make gym-lock`."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "nemo-gym/requirements.txt"


def requirement_lines(path: Path) -> list[str]:
    """The requirement lines of a pip requirements file (comments, blanks and options left out)."""
    lines = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line and not line.startswith(("#", "-")):
            lines.append(line)
    return lines


def parse(path: Path) -> list[Requirement]:
    parsed = []
    for line in requirement_lines(path):
        try:
            parsed.append(Requirement(line))
        except InvalidRequirement as exc:
            pytest.fail(f"{path.relative_to(ROOT)}: {line!r} is not a requirement line ({exc})")
    return parsed


def pinned(lock: Path) -> dict[str, Version]:
    """Name -> pinned version of every `name==version [; marker]` line of a uv-compiled lock."""
    pins: dict[str, Version] = {}
    for requirement in parse(lock):
        (spec,) = requirement.specifier  # a compiled lock pins each package exactly once
        assert spec.operator == "==", f"{lock.name}: {requirement} is not an exact pin"
        pins[canonicalize_name(requirement.name)] = Version(spec.version)
    return pins


def unmet(declared: Path, pins: dict[str, Version]) -> list[str]:
    """The requirements of `declared` that no pin satisfies."""
    missing = []
    for requirement in parse(declared):
        version = pins.get(canonicalize_name(requirement.name))
        if version is None or not requirement.specifier.contains(version, prereleases=True):
            missing.append(f"{requirement} (lock: {version or 'absent'})")
    return missing


DECLARED = [ROOT / "nemo-gym/requirements.in", *sorted(ROOT.glob("plugins/*/nemo-gym-requirements.txt"))]


@pytest.mark.parametrize("declared", DECLARED, ids=lambda path: str(path.relative_to(ROOT)))
def test_lock_satisfies_declared_requirements(declared: Path) -> None:
    missing = unmet(declared, pinned(LOCK))
    assert not missing, f"{declared.relative_to(ROOT)}: not in the lock, run `make gym-lock`: {missing}"


def test_a_requirement_missing_from_the_lock_is_reported(tmp_path: Path) -> None:
    # The check above can fail: a package the lock lacks, and one pinned outside the declared range.
    declared = tmp_path / "nemo-gym-requirements.txt"
    declared.write_text(
        "# why this plugin needs them\nnemo-gym>=0.5\nsurely-not-in-the-lock==1.0  # comment\n-r other.txt\n",
        encoding="utf-8",
    )
    assert unmet(declared, pinned(LOCK)) == [
        "nemo-gym>=0.5 (lock: 0.4.0)",
        "surely-not-in-the-lock==1.0 (lock: absent)",
    ]
