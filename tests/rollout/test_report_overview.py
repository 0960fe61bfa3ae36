"""The report opens with one overview table across environments: readable column names, summary.json's
figures, a row per environment (per run when two runs are compared), sortable by any column."""

from __future__ import annotations

import re
from typing import Any

from attrs import define

from relax_gym_core.rollout.overview import COLUMNS, overview


@define
class Run:
    label: str
    summary: dict[str, Any]


def stats(trials: int, mean: float | None, p50: float | None = 1.5, **extra: Any) -> dict[str, Any]:
    return {
        "trials": trials,
        "scored": trials - 1,
        "mean_reward": mean,
        "pass_at_k": {"1": 0.5, "2": 0.75, "10": 0.9},
        "infra_failures": 1,
        "latency_s": {"p50": p50, "p90": 3.25},
        "answered_calls": {"mean": 2.0},
        "tokens": {"mean": 812.4},
        **extra,
    }


RUN = Run("A", {"environments": {"xlam_fc": stats(10, 0.25), "mcqa": stats(20, 0.75, p50=None)}})


def cells(page: str) -> list[list[str]]:
    return [re.findall(r"<td[^>]*>([^<]*)</td>", row) for row in re.findall(r"<tr data-env=.*?</tr>", page)]


def test_one_row_per_environment_with_readable_columns() -> None:
    page = overview([RUN])
    headers = re.findall(r"<th [^>]*>([^<]*)</th>", page)
    assert headers == ["environment", *(column.title for column in COLUMNS)]
    assert "mean reward" in headers and "pass@k (all repeats)" in headers and "latency p90 (s)" in headers
    assert cells(page) == [
        ["mcqa", "20", "19", "0.750", "0.500", "0.900", "1", "n/a", "3.25", "2.0", "812"],
        ["xlam_fc", "10", "9", "0.250", "0.500", "0.900", "1", "1.50", "3.25", "2.0", "812"],
    ]
    assert 'data-v="0.75"' in page  # what the sort reads: the value, not its rounding


def test_two_runs_compared_get_a_row_each_per_environment() -> None:
    other = Run("B", {"environments": {"mcqa": stats(20, 0.5)}})
    page = overview([RUN, other])
    assert re.findall(r"<th [^>]*>([^<]*)</th>", page)[:2] == ["environment", "run"]
    assert [row[:2] for row in cells(page)] == [["mcqa", "A"], ["xlam_fc", "A"], ["mcqa", "B"]]
