"""The distributions install the way users install them, in one fresh venv built for this module: first the
light core (no extras) with only pytest and hypothesis, as a plugin author's test environment (or Relax's
Python) has it; then one plugin on top."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from importlib.metadata import distribution
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
WEB = ("starlette", "uvicorn", "aiohttp", "pyreqwest")

pytestmark = pytest.mark.slow


def uv() -> str:
    found = os.environ.get("RELAX_GYM_UV") or shutil.which("uv") or str(ROOT / ".tools/bin/uv")
    if not Path(found).is_file():
        pytest.fail("uv not found: run the tests through `make test`")
    return found


def pinned_closure(*names: str) -> list[str]:
    """`name==version` of the installed distributions `names` and all they require (markers evaluated)."""
    pins: dict[str, str] = {}
    todo = [Requirement(name) for name in names]
    while todo:
        requirement = todo.pop()
        key = canonicalize_name(requirement.name)
        if key in pins or (requirement.marker is not None and not requirement.marker.evaluate({"extra": ""})):
            continue
        dist = distribution(key)
        pins[key] = dist.version
        todo.extend(Requirement(line) for line in dist.requires or ())
    return [f"{key}=={pinned}" for key, pinned in sorted(pins.items())]


class Venv:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.python = str(path / "bin/python")
        self.env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "VIRTUAL_ENV": str(path)}
        self.env.pop("UV_PROJECT_ENVIRONMENT", None)

    def install(self, *args: str) -> None:
        # Exact pins, no resolution. Not --offline: a cache filled by `uv sync` (make env) has the wheels
        # but not the registry's index pages, so an empty cache before `make` left "cattrs was not found in
        # the cache" here. The registry is reachable wherever `make` could install; the wheels still come
        # from the cache.
        subprocess.run(
            [uv(), "pip", "install", "--quiet", "--no-deps", "--python", self.python, *args],
            check=True,
            env=self.env,
            timeout=600,
        )

    def check(self) -> None:
        """Every installed distribution's requirements are installed too."""
        subprocess.run([uv(), "pip", "check", "--quiet", "--python", self.python], check=True, env=self.env)

    def run(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(args), capture_output=True, text=True, check=False, env=self.env, cwd=cwd, timeout=300
        )

    def importable(self, module: str) -> bool:
        return self.run(self.python, "-c", f"import {module}").returncode == 0


@pytest.fixture(scope="module")
def light(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Venv]:
    venv = Venv(tmp_path_factory.mktemp("install") / "venv")
    interpreter = Path(sys.executable).resolve()  # the 3.12 interpreter behind this test run
    subprocess.run(
        [uv(), "venv", "--quiet", "--python", str(interpreter), str(venv.path)], check=True, env=venv.env
    )
    # The core's requirements (no extras), pytest and hypothesis, at the versions this run uses (cached).
    pins = pinned_closure("relax-gym-core", "pytest", "hypothesis")
    venv.install(*(pin for pin in pins if not pin.startswith("relax-gym-core==")))
    venv.install(str(ROOT))  # the core without extras
    venv.check()
    yield venv


LIGHT_SUITE = """
import sys

import pytest
from relax_gym_core.testing import check_registration, corrupted_rows

WEB = {web!r}


def test_the_fixture_gives_a_plugin_manager(relax_gym_hooks):
    assert relax_gym_hooks.environments is not None
    assert callable(check_registration) and callable(corrupted_rows)


def test_the_shared_verifier_factory_loads(request):
    # Only the factory: calling it would start a NeMo Gym server, which this venv has none of.
    assert callable(request.getfixturevalue("relax_gym_verifier"))


@pytest.mark.e2e  # registered by the relax_gym plugin: --strict-markers accepts it
def test_no_web_stack_was_loaded():
    assert not [name for name in sys.modules if name.split(".")[0] in WEB]
"""


def test_light_core_runs_a_plugin_authors_tests(light: Venv, tmp_path: Path) -> None:
    assert not any(light.importable(module) for module in WEB)  # the core alone brings no web stack
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_light.py").write_text(textwrap.dedent(LIGHT_SUITE.format(web=WEB)))
    (suite / "pytest.ini").write_text("[pytest]\naddopts = --strict-markers\n")
    # No `-p relax_gym_core.testing.pytest_plugin`: the pytest11 entry point loads it.
    result = light.run(light.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", cwd=suite)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 passed" in result.stdout


def test_core_plus_workplace_lists_exactly_workplace(light: Venv) -> None:
    light.install(str(ROOT / "plugins/workplace"))
    light.check()
    result = light.run(str(light.path / "bin/relax-gym"), "plugins", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert [plugin["distribution"] for plugin in document["plugins"]] == ["relax-gym-workplace"]
    environments = [env["name"] for plugin in document["plugins"] for env in plugin["environments"]]
    assert environments == ["workplace_assistant"]
    # Only the light core was installed: no web server came along.
    assert not light.importable("starlette")
