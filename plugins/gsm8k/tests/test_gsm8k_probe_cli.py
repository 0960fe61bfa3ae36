"""`relax-gym probe gsm8k`: the operator's check of an installation, with the real verifier (the command
starts its own resources server, hence a module of its own)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # the real CLI, with a resources server of its own

CLI = str(Path(sys.executable).with_name("relax-gym"))
SAFETY_S = 300  # guards against hangs only


def test_the_cli_probe_passes_for_gsm8k(no_judge: None) -> None:
    result = subprocess.run(
        [CLI, "probe", "gsm8k", "--json"], capture_output=True, text=True, timeout=SAFETY_S, check=False
    )
    assert result.returncode == 0, result.stderr
    outcomes = json.loads(result.stdout)
    assert [(o["probe"], o["expected"], o["reward"], o["ok"]) for o in outcomes] == [
        ("example0:boxed_answer", 1.0, 1.0, True),
        ("example0:wrong_number", 0.0, 0.0, True),
        ("example4:boxed_answer", 1.0, 1.0, True),
        ("example4:wrong_number", 0.0, 0.0, True),
    ]
