"""`relax-gym probe r2e_gym`: the seed's "golden mode" and more, for every bundled task, scored by the real
verifier (the command starts its own resources server, hence a module of its own)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from relax_gym_r2e import tasks

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # the real CLI, with a resources server of its own

CLI = str(Path(sys.executable).with_name("relax-gym"))
SAFETY_S = 280  # guards against hangs only


def test_the_cli_probe_passes_on_every_bundled_task() -> None:
    result = subprocess.run(
        [CLI, "probe", "r2e_gym", "--json"], capture_output=True, text=True, timeout=SAFETY_S, check=False
    )
    assert result.returncode == 0, result.stderr
    outcomes = {outcome["probe"]: outcome for outcome in json.loads(result.stdout)}
    expected = {"golden": 1.0, "wrong": 0.1, "empty": 0.0}
    assert set(outcomes) == {f"{name}:{kind}" for name in tasks.load_tasks() for kind in expected}
    for name, outcome in outcomes.items():
        assert outcome["ok"] and outcome["reward"] == expected[name.split(":")[1]], outcome
