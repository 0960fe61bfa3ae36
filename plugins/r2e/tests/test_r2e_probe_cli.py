"""`relax-gym probe r2e_gym`: the seed's "golden mode" and more, for every bundled task, scored by the real
verifier (the session's shared resources server, through `--verifier-url`: tests/e2e/test_probe.py covers
the command starting its own)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from relax_gym_core.testing.gym import Verifier
from relax_gym_core.testing.web import run_cli

from relax_gym_r2e import tasks

pytestmark = pytest.mark.e2e  # the real CLI and the real verifier

SAFETY_S = 280  # guards against hangs only


def test_the_cli_probe_passes_on_every_bundled_task(relax_gym_verifier: Callable[..., Verifier]) -> None:
    url = relax_gym_verifier("r2e_gym").url
    result = run_cli("probe", "r2e_gym", "--json", "--verifier-url", url, timeout_s=SAFETY_S)
    assert result.returncode == 0, result.stderr
    assert "starting NeMo Gym server" not in result.stderr  # it used the running one
    outcomes = {outcome["probe"]: outcome for outcome in json.loads(result.stdout)}
    expected = {"golden": 1.0, "wrong": 0.1, "empty": 0.0}
    assert set(outcomes) == {f"{name}:{kind}" for name in tasks.load_tasks() for kind in expected}
    for name, outcome in outcomes.items():
        assert outcome["ok"] and outcome["reward"] == expected[name.split(":")[1]], outcome
