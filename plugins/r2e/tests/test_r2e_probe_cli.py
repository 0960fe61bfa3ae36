"""`relax-gym probe r2e_gym`: the seed's "golden mode" and more, for every bundled task, scored by the real
verifier (the session's shared resources server, through `--verifier-url`: tests/e2e/test_probe.py covers
the command starting its own)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from relax_gym_core.testing.gym import Verifier

from relax_gym_r2e import tasks

pytestmark = pytest.mark.e2e  # the real CLI and the real verifier

CLI = str(Path(sys.executable).with_name("relax-gym"))
SAFETY_S = 280  # guards against hangs only


def test_the_cli_probe_passes_on_every_bundled_task(relax_gym_verifier: Callable[..., Verifier]) -> None:
    result = subprocess.run(
        [CLI, "probe", "r2e_gym", "--json", "--verifier-url", relax_gym_verifier("r2e_gym").url],
        capture_output=True,
        text=True,
        timeout=SAFETY_S,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "starting NeMo Gym server" not in result.stderr  # it used the running one
    outcomes = {outcome["probe"]: outcome for outcome in json.loads(result.stdout)}
    expected = {"golden": 1.0, "wrong": 0.1, "empty": 0.0}
    assert set(outcomes) == {f"{name}:{kind}" for name in tasks.load_tasks() for kind in expected}
    for name, outcome in outcomes.items():
        assert outcome["ok"] and outcome["reward"] == expected[name.split(":")[1]], outcome
