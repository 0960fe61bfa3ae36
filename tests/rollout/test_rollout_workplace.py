"""The oracle path on a real NeMo Gym environment: Workplace Assistant's servers and gateway (`relax-gym
up`, shared with the other end-to-end tests), `relax-gym rollout --policy oracle:P` replaying the plugin's
known-good (or, drawn at rate P, known-bad) trajectories, then `relax-gym report` comparing two runs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from statistics import fmean

import pytest

from relax_gym_core.plugin.host import make_plugin_manager
from relax_gym_core.rollout.data import example_rows
from relax_gym_core.rollout.policy import oracle_token
from relax_gym_core.testing.web import GatewayProcess

from .conftest import check_report_numbers, pngs, relax_gym, trial_lines, write_rows

pytest.importorskip("relax_gym_workplace")

WORKPLACE = "workplace_assistant"
BAD_RATE, REPEATS = 0.3, 4


@pytest.mark.nemo_gym(WORKPLACE)
def test_oracle_rollout_scores_the_mix_and_the_report_compares_two_runs(
    tmp_path: Path, relax_gym_up: Callable[..., GatewayProcess]
) -> None:
    gateway = relax_gym_up(WORKPLACE)
    data = write_rows(tmp_path / "examples.jsonl", example_rows(make_plugin_manager(), WORKPLACE))
    base, trained = tmp_path / "base", tmp_path / "trained"
    common = ("--data", str(data), "--concurrency", "8", "--gateway", gateway.url)
    first = relax_gym(
        "rollout", *common, "--policy", f"oracle:{BAD_RATE}", "--repeats", str(REPEATS), "--out", str(base)
    )
    assert first.returncode == 0, first.stderr

    lines = trial_lines(base)
    assert len(lines) == 5 * REPEATS
    # Every trial was scored by the real verifier and released: no failures, every cleanup confirmed.
    assert {(line["status"], line["failure_kind"], line["cleanup"]) for line in lines} == {
        ("completed", None, "confirmed")
    }

    # Known-good replays score 1 and known-bad ones 0, so the rewards are exactly the seeded mix ...
    def drawn(row: int, repeat: int) -> float:
        return 0.0 if oracle_token(0, BAD_RATE, row, repeat).startswith("oracle-bad") else 1.0

    assert {(x["row"], x["repeat"]): x["reward"] for x in lines} == {
        (x["row"], x["repeat"]): drawn(x["row"], x["repeat"]) for x in lines
    }
    # ... and the mean is 1 - P within sampling (4 standard deviations of 20 draws).
    mean = fmean(line["reward"] for line in lines)
    assert abs(mean - (1 - BAD_RATE)) <= 4 * ((BAD_RATE * (1 - BAD_RATE)) / len(lines)) ** 0.5
    assert json.loads((base / "summary.json").read_text())["environments"][WORKPLACE][
        "mean_reward"
    ] == pytest.approx(mean)

    second = relax_gym("rollout", *common, "--policy", "oracle", "--out", str(trained))
    assert second.returncode == 0, second.stderr
    assert {line["reward"] for line in trial_lines(trained)} == {1.0}

    report = relax_gym("report", str(base), str(trained))
    assert report.returncode == 0, report.stderr
    page = (base / "compare.html").read_text()
    summaries = [json.loads((run / "summary.json").read_text()) for run in (base, trained)]
    assert check_report_numbers(page, summaries) >= 20
    row_means: dict[int, list[float]] = {}
    for line in lines:
        row_means.setdefault(line["row"], []).append(line["reward"])
    improved = sum(1 for rewards in row_means.values() if fmean(rewards) < 1.0)
    assert f"data-field=rows.better>{improved}</span>" in page
    assert "data-field=rows.worse>0</span>" in page
    assert {
        "reward-workplace_assistant",
        "pass-at-k-workplace_assistant",
        "latency-workplace_assistant",
    } <= set(pngs(page))

    # Each line says what its trajectory holds, and the trial pages of the comparison show its tool calls
    # with their outputs, both runs side by side; reverify refuses: the verifier reads the trial's session.
    assert all(line["tool_calls"] == line["metrics"]["tool_calls"] for line in trial_lines(trained))
    assert all(line["tool_outputs"] == line["tool_calls"] and line["answered_calls"] >= 1 for line in lines)
    side_by_side = (base / "compare_files" / "trials" / "1-1.html").read_text()
    assert (
        side_by_side.count("<h2>") == 2
        and "turn tool_call" in side_by_side
        and "turn tool_output" in side_by_side
    )
    again = relax_gym("reverify", str(base))
    assert again.returncode == 2 and "cleanup contract is not stateless" in again.stderr, again.stderr
