"""relax-gym-reasoning-gym-generate as users run it: the real console script of relax-gym's environment,
which runs itself again in the NeMo Gym environment (where the reasoning-gym library is), real tasks out,
bad task names refused before anything is written."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.resources import files
from pathlib import Path

import pytest
from relax_gym_core.gym import installed
from relax_gym_core.gym.processes import gym_python
from relax_gym_core.testing import converted_row, plugin_hooks

from relax_gym_reasoning_gym_cc import plugin
from relax_gym_reasoning_gym_cc.data import EXAMPLE_FILE, TASKS
from relax_gym_reasoning_gym_cc.prompts import ANSWER_FORMAT

# The real console script; the tests marked e2e also load the NeMo Gym environment's library (seconds).

GENERATE = str(Path(sys.executable).with_name("relax-gym-reasoning-gym-generate"))
SAFETY_S = 300  # guards against hangs only
# How the bundled examples were made (README, "Data").
EXAMPLES_ARGS = ("--tasks", "basic_arithmetic,leg_counting,knights_knaves", "--size", "2", "--seed", "1")


def generate(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GENERATE, *args], capture_output=True, text=True, timeout=SAFETY_S, check=False, cwd=cwd
    )


def test_relax_gyms_environment_has_no_reasoning_gym() -> None:
    """Why the script runs itself again: the library is the NeMo Gym environment's only."""
    with pytest.raises(ModuleNotFoundError):
        __import__("reasoning_gym")


@pytest.mark.e2e
def test_the_bundled_examples_are_exactly_what_the_generator_writes(tmp_path: Path) -> None:
    output = tmp_path / "out" / "rows.jsonl"
    result = generate(*EXAMPLES_ARGS, "-o", str(output))
    assert result.returncode == 0, result.stderr
    assert f"Wrote 6 row(s) (3 task(s) x 2, seed 1) to {output}" in result.stdout
    assert "Warning" not in result.stderr  # reasoning-gym's dependencies' compile noise is kept out
    bundled = files("relax_gym_reasoning_gym_cc").joinpath(EXAMPLE_FILE).read_text(encoding="utf-8")
    assert output.read_text(encoding="utf-8") == bundled  # same tasks, size and seed: the same rows
    rows = [json.loads(line) for line in bundled.splitlines()]
    assert [row["metadata"]["source_dataset"] for row in rows] == [
        "basic_arithmetic",
        "basic_arithmetic",
        "leg_counting",
        "leg_counting",
        "knights_knaves",
        "knights_knaves",
    ]
    assert [row["metadata"]["source_index"] for row in rows] == [0, 1] * 3
    assert len({row["question"] for row in rows}) == 6
    assert all(isinstance(row["answer"], str) and row["answer"] for row in rows)
    hooks = plugin_hooks("reasoning_gym_cc", plugin)
    for row in rows:
        converted = converted_row(hooks.environments.get("reasoning_gym"), row)
        assert converted["input"] == row["responses_create_params"]["input"]
        assert hooks.environments.get("reasoning_gym").drop_reason(converted) is None


def test_an_unknown_task_is_named_with_the_valid_ones_before_the_library_loads(tmp_path: Path) -> None:
    output = tmp_path / "rows.jsonl"
    output.write_bytes(b"previous output\n")
    result = generate("--tasks", "leg_counting,leg_count,composite", "--size", "2", "-o", str(output))
    assert result.returncode == 2
    assert "unknown reasoning-gym task(s): leg_count, composite." in result.stderr, result.stderr
    assert "Valid tasks (105): ab, acre," in result.stderr
    assert "leg_counting" in result.stderr.split("Valid tasks", 1)[1]
    assert "Traceback" not in result.stderr
    assert output.read_bytes() == b"previous output\n"
    assert [path.name for path in tmp_path.iterdir()] == ["rows.jsonl"]  # no temporary file left


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--tasks", "gcd", "--size", "0"), "--size must be at least 1, got 0"),
        (("--tasks", " , ", "--size", "2"), "--tasks names no task"),
        (("--tasks", "gcd,lcm,gcd", "--size", "2"), "--tasks names gcd more than once"),
    ],
)
def test_bad_arguments_are_refused_before_the_library_loads(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    result = generate(*args, "-o", str(tmp_path / "rows.jsonl"))
    assert (result.returncode, result.stderr.strip()) == (
        2,
        f"relax-gym-reasoning-gym-generate: error: {message}",
    )
    assert list(tmp_path.iterdir()) == []


def test_it_finds_the_nemo_gym_python_by_relax_gyms_rule(tmp_path: Path) -> None:
    configured = tmp_path / "python"
    configured.touch()
    assert installed.gym_python({installed.PYTHON_VAR: str(configured)}) == str(configured)
    assert installed.gym_python({}) == gym_python({})  # the rule `relax-gym up` uses: .gym/venv here


def test_without_the_nemo_gym_environment_it_says_how_to_get_one(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-venv" / "bin" / "python"
    result = subprocess.run(
        [GENERATE, "--tasks", "gcd", "--size", "1", "-o", str(tmp_path / "rows.jsonl")],
        capture_output=True,
        text=True,
        timeout=SAFETY_S,
        check=False,
        env={"PATH": "/usr/bin:/bin", "RELAX_GYM_NEMO_GYM_PYTHON": str(missing)},
    )
    assert result.returncode == 2
    assert f"RELAX_GYM_NEMO_GYM_PYTHON={missing}" in result.stderr
    assert "run `make gym`" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "rows.jsonl").exists()


@pytest.mark.e2e
def test_prompt_and_task_names_are_the_installed_librarys() -> None:
    """reasoning_gym.utils.SYSTEM_PROMPTS["default"] and its registered tasks, read in the NeMo Gym
    environment (where the verifier imports the same library)."""
    script = (
        "import json, warnings; warnings.simplefilter('ignore')\n"
        "import reasoning_gym, reasoning_gym.utils\n"
        "prompt, tasks = reasoning_gym.utils.SYSTEM_PROMPTS['default'], reasoning_gym.factory.DATASETS\n"
        "print(json.dumps([prompt, sorted(tasks)]))"
    )
    done = subprocess.run(
        [gym_python(), "-c", script], capture_output=True, text=True, check=True, timeout=SAFETY_S
    )
    default_prompt, tasks = json.loads(done.stdout)
    assert default_prompt == ANSWER_FORMAT
    assert set(tasks) - {"composite"} == TASKS
