"""The mcqa plugin: the conformance kit (registration, conversion, result mapping, and its probes scored
by upstream's real mcqa verifier), and rows that would score a silent 0 upstream refused by name."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from relax_gym_core.plugin import RowError
from relax_gym_core.testing import EnvironmentContract

import relax_gym_mcqa


class TestMcqaContract(EnvironmentContract):
    environment = "mcqa"

    def rows(self) -> list[dict[str, Any]]:
        return relax_gym_mcqa.example_rows()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"options": []}, "options must be a non-empty list"),
        ({"options": [{"A": "x", "B": "y"}]}, r"options\[0\] must be one"),
        ({"options": [{"a": "x"}]}, r"options\[0\] must map one capital letter"),
        ({"options": [{"A": "x"}, {"A": "y"}]}, "options repeat a letter"),
        ({"expected_answer": "Z"}, "expected_answer must be one of the option letters"),
        ({"grading_mode": "vibes"}, "grading_mode must be one of"),
    ],
)
def test_a_row_upstream_would_score_zero_is_refused_by_name(change: dict[str, Any], message: str) -> None:
    row = {**copy.deepcopy(relax_gym_mcqa.example_rows()[0]), **change}
    with pytest.raises(RowError, match=message):
        relax_gym_mcqa.MCQA.convert_row(row)
