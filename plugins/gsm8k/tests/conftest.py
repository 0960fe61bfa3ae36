"""Fixtures of the gsm8k plugin's tests: a plugin manager with only this plugin (judge variables
cleared), and real rows from the installed nemo-gym package in each raw shape gsm8k accepts."""

from __future__ import annotations

from typing import Any

import pytest
from relax_gym_core.testing import Hooks, plugin_hooks

from relax_gym_gsm8k import plugin
from relax_gym_gsm8k.judge import API_KEY_VAR, MODEL_VAR, URL_VAR
from relax_gym_gsm8k.plugin import example_rows, numeric_example_rows


@pytest.fixture
def no_judge(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (URL_VAR, MODEL_VAR, API_KEY_VAR):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def hooks(no_judge: None) -> Hooks:
    return plugin_hooks("gsm8k", plugin)


@pytest.fixture(scope="session")
def math_rows() -> list[dict[str, Any]]:
    """math_with_judge's 5 upstream example rows (prompted, string answers)."""
    return example_rows()


@pytest.fixture(scope="session")
def gsm8k_rows() -> dict[str, list[dict[str, Any]]]:
    """The example rows with a number answer, as each raw shape a gsm8k dataset comes in:

    - prompted: upstream's row as it is (responses_create_params, question, expected_answer "32");
    - benchmark: NeMo Gym's gsm8k prepare.py shape (question, expected_answer as an int);
    - original: the GSM8K file's shape (question, answer = worked solution + "#### 32").
    """
    prompted = list(numeric_example_rows().values())
    return {
        "prompted": prompted,
        "benchmark": [
            {"question": row["question"], "expected_answer": int(row["expected_answer"])} for row in prompted
        ],
        "original": [
            {
                "question": row["question"],
                "answer": f"Work it out step by step.\n#### {row['expected_answer']}",
            }
            for row in prompted
        ],
    }
