"""`relax-gym probe gsm8k`: the operator's check of an installation, with the real verifier scored by
the session's shared resources server through `--verifier-url`: tests/e2e/test_probe.py covers the command
starting its own)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from relax_gym_core.testing.gym import Verifier
from relax_gym_core.testing.web import run_cli

pytestmark = pytest.mark.e2e  # the real CLI and the real verifier


def test_the_cli_probe_passes_for_gsm8k(no_judge: None, relax_gym_verifier: Callable[..., Verifier]) -> None:
    result = run_cli("probe", "gsm8k", "--json", "--verifier-url", relax_gym_verifier("gsm8k").url)
    assert result.returncode == 0, result.stderr
    assert "starting NeMo Gym server" not in result.stderr  # it used the running one
    outcomes = json.loads(result.stdout)
    assert [(o["probe"], o["expected"], o["reward"], o["ok"]) for o in outcomes] == [
        ("example0:boxed_answer", 1.0, 1.0, True),
        ("example0:wrong_number", 0.0, 0.0, True),
        ("example4:boxed_answer", 1.0, 1.0, True),
        ("example4:wrong_number", 0.0, 0.0, True),
    ]
