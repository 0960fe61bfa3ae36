"""`relax-gym probe gsm8k`: the operator's check of an installation, with the real verifier scored by
the session's shared resources server through `--verifier-url`: tests/e2e/test_probe.py covers the command
starting its own)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from relax_gym_core.testing.gym import Verifier

pytestmark = pytest.mark.e2e  # the real CLI and the real verifier

CLI = str(Path(sys.executable).with_name("relax-gym"))
SAFETY_S = 300  # guards against hangs only


def test_the_cli_probe_passes_for_gsm8k(no_judge: None, relax_gym_verifier: Callable[..., Verifier]) -> None:
    result = subprocess.run(
        [CLI, "probe", "gsm8k", "--json", "--verifier-url", relax_gym_verifier("gsm8k").url],
        capture_output=True,
        text=True,
        timeout=SAFETY_S,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "starting NeMo Gym server" not in result.stderr  # it used the running one
    outcomes = json.loads(result.stdout)
    assert [(o["probe"], o["expected"], o["reward"], o["ok"]) for o in outcomes] == [
        ("example0:boxed_answer", 1.0, 1.0, True),
        ("example0:wrong_number", 0.0, 0.0, True),
        ("example4:boxed_answer", 1.0, 1.0, True),
        ("example4:wrong_number", 0.0, 0.0, True),
    ]
