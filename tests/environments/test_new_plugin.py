"""`relax-gym new NAME --own-server`: the plugin as generated installs, is listed, probes green with its own
verifier in the NeMo Gym environment, and passes the conformance kit, nothing filled in; refusals say why
and write nothing. The generated plugin is installed the way a user installs one outside this repository
(a wheel built from it, here into a directory of its own on PYTHONPATH, for both interpreters)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from relax_gym_core.commands.new import render
from relax_gym_core.testing.processes import run_cli

ROOT = Path(__file__).resolve().parents[2]
SAFETY_S = 600


def uv() -> str:
    return os.environ.get("RELAX_GYM_UV") or str(ROOT / ".tools/bin/uv")


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """`relax-gym new arith --own-server` in an empty directory, built and installed into site/."""
    where = tmp_path_factory.mktemp("new")
    made = run_cli("new", "arith", "--own-server", cwd=where, timeout_s=SAFETY_S)
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith(f"Created {where / 'arith'}\nFill in:\n")
    assert "src/relax_gym_arith/server.py         verify(): how an answer is scored" in made.stdout
    site = where / "site"
    subprocess.run(
        [uv(), "pip", "install", "--quiet", "--no-deps", "--python", sys.executable, "--target", str(site),
         str(where / "arith")],
        check=True,
        timeout=SAFETY_S,
    )  # fmt: skip
    environ = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, (str(site), os.environ.get("PYTHONPATH")))),
    }
    return where, environ


def test_the_files_are_the_templates_and_nothing_else(generated: tuple[Path, dict[str, str]]) -> None:
    where, _ = generated
    made = (path.relative_to(where / "arith") for path in (where / "arith").rglob("*") if path.is_file())
    # (what running its tests leaves beside them is not the generator's: caches, Hypothesis' database)
    files = sorted(
        str(path)
        for path in made
        if not any(part.startswith(".") or part == "__pycache__" for part in path.parts)
    )
    assert files == sorted(render("arith", workspace=False))
    init = ast.parse((where / "arith/src/relax_gym_arith/__init__.py").read_text())
    assert not [node for node in ast.walk(init) if isinstance(node, ast.Import | ast.ImportFrom)]
    pyproject = (where / "arith/pyproject.toml").read_text()
    assert 'arith = "relax_gym_arith.plugin"' in pyproject and "workspace" not in pyproject


@pytest.mark.e2e
def test_as_generated_it_is_listed_and_passes_the_kit_probes_and_a_real_trial_included(
    generated: tuple[Path, dict[str, str]],
) -> None:
    where, environ = generated
    listed = run_cli("plugins", env=environ, timeout_s=SAFETY_S)
    assert listed.returncode == 0, listed.stderr
    assert any(line.split()[:1] == ["arith"] for line in listed.stdout.splitlines()), listed.stdout
    # The kit's own tests: its probes scored by the generated verifier (what `relax-gym probe` does) and a
    # real trial through `relax-gym up` with the oracle.
    kit = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            str(where / "arith/tests"),
        ],
        env=environ,
        cwd=where / "arith",
        capture_output=True,
        text=True,
        timeout=SAFETY_S,
        check=False,
    )
    assert kit.returncode == 0, kit.stdout[-3000:] + kit.stderr[-2000:]
    assert kit.stdout.splitlines()[-1].startswith("5 passed")  # the real trial through `up` too


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("Count-down", "--own-server"), "'Count-down' is not a usable environment name"),
        (("class", "--own-server"), "'class' is not a usable environment name"),
        (("mcqa", "--own-server"), "environment 'mcqa' is already registered by an installed plugin"),
        (("arith",), "relax-gym new makes an environment with a verifier of its own: add --own-server"),
    ],
)
def test_refusals_say_why_and_write_nothing(tmp_path: Path, args: tuple[str, ...], says: str) -> None:
    done = run_cli("new", *args, "--dir", str(tmp_path), cwd=tmp_path, timeout_s=SAFETY_S)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_existing_directory_is_never_written_over(tmp_path: Path) -> None:
    (tmp_path / "arith").mkdir()
    (tmp_path / "arith" / "mine.txt").write_text("keep")
    done = run_cli("new", "arith", "--own-server", "--dir", str(tmp_path), cwd=tmp_path, timeout_s=SAFETY_S)
    assert done.returncode == 2 and "already exists: nothing was written" in done.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["arith"]
    assert [p.name for p in (tmp_path / "arith").iterdir()] == ["mine.txt"]


def test_the_countdown_example_is_the_scaffold_plus_its_verifier_and_rows() -> None:
    """plugins/countdown (docs/plugins.md's second worked example) was made by `relax-gym new countdown
    --own-server` inside this repository: every file is the generator's, but the two a user writes (the
    verifier and the rows); nothing was copied from another plugin."""
    plugin = ROOT / "plugins" / "countdown"
    written = {"src/relax_gym_countdown/server.py", "src/relax_gym_countdown/data/example.jsonl"}
    generated = render("countdown", workspace=True)
    made = [p.relative_to(plugin) for p in plugin.rglob("*") if p.is_file()]
    mine = sorted(
        str(p) for p in made if not any(part.startswith(".") or part == "__pycache__" for part in p.parts)
    )
    assert mine == sorted(generated)
    for path, text in generated.items():
        if path not in written:
            assert (plugin / path).read_text() == text, path
    for path in written:
        assert (plugin / path).read_text() != generated[path], path
