"""`relax-gym report` as a user runs it, on a real echo rollout: one self-contained HTML file whose plots
exist (embedded, and as PNG files beside it) and whose numbers are summary.json's."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from relax_gym_core.testing.web import GatewayProcess, ScriptedPolicy

from .conftest import SECRET, check_report_numbers, echo_row, pngs, relax_gym, write_rows

pytestmark = pytest.mark.e2e  # the real CLI

PNG = b"\x89PNG\r\n\x1a\n"


def test_report_of_a_rollout_shows_its_summary_and_plots(
    tmp_path: Path, echo_gateway: GatewayProcess, policy: ScriptedPolicy
) -> None:
    rows = [
        echo_row("one", reward=1.0, sleep_s=0.05),
        echo_row("half", reward=0.5, model={"api": "messages", "calls": 1}),
        echo_row("crash", fail=True),
    ]
    data = write_rows(tmp_path / "data.jsonl", rows)
    out = tmp_path / "run"
    rollout = relax_gym(
        "rollout", "echo", "--data", str(data), "--policy", policy.base_url, "--repeats", "2",
        "--out", str(out), "--gateway", echo_gateway.url, "--api-key-env", "POLICY_KEY",
        env={**os.environ, "POLICY_KEY": SECRET},
    )  # fmt: skip
    assert rollout.returncode == 0, rollout.stderr

    result = relax_gym("report", str(out))
    assert result.returncode == 0, result.stderr
    page = (out / "report.html").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert check_report_numbers(page, [summary]) >= 15
    embedded = pngs(page)
    assert set(embedded) == {"reward-echo", "pass-at-k-echo", "turns-echo", "latency-echo", "failures"}
    for name, png in embedded.items():
        assert png.startswith(PNG)
        assert (out / "report_files" / f"{name}.png").read_bytes() == png
    assert "agent_error" in page  # the failed trials are listed with their failure
    assert 'src="http' not in page and "<script src" not in page  # nothing to fetch: no server needed

    # Every trial links to its page, which shows its conversation the way people read one.
    links = re.findall(r"href='(report_files/trials/[^']+)'", page)
    assert {link.rsplit("/", 1)[1] for link in links} == {
        f"{row}-{k}.html" for row in (1, 2, 3) for k in (1, 2)
    }
    assert all((out / link).is_file() for link in links)
    half = (out / "report_files" / "trials" / "2-1.html").read_text()
    turns = re.findall(r"<div class='turn (\w+)'><div class=who>[^<]*</div><pre>([^<]*)</pre>", half)
    assert turns == [("user", "half"), ("assistant", "ok")]  # the Messages call's request and answer
    crash = (out / "report_files" / "trials" / "3-1.html").read_text()
    assert "class=failed>agent_error" in crash and "env_error:agent_error" in crash
    assert "href='../../report.html'" in crash


def test_report_of_something_else_is_one_clear_line(tmp_path: Path) -> None:
    result = relax_gym("report", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.strip() == f"relax-gym: error: {tmp_path}: not a rollout directory (no run.json)"
    assert list(tmp_path.iterdir()) == []
