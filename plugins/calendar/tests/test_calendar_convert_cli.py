"""`relax-gym convert calendar` as users run it: the real CLI in a subprocess, upstream's rows in,
file:line errors out, and a refused file leaves the output exactly as it was."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from relax_gym_core.testing.web import run_cli

pytestmark = pytest.mark.e2e  # the real CLI

SAFETY_S = 120  # guards against hangs only


def convert(source: Path, output: Path) -> subprocess.CompletedProcess[str]:
    return run_cli("convert", "calendar", "--input", str(source), "--output", str(output), timeout_s=SAFETY_S)


def jsonl(*rows: Any) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def test_the_example_rows_convert(tmp_path: Path, rows: list[dict[str, Any]]) -> None:
    source = tmp_path / "calendar_example.jsonl"
    source.write_text(jsonl(*rows), encoding="utf-8")
    output = tmp_path / "calendar_relax.jsonl"
    result = convert(source, output)
    assert result.returncode == 0, result.stderr
    assert "Converted 5 row(s)" in result.stdout
    converted = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    assert [row["metadata"]["exp_cal_state"] for row in converted] == [row["exp_cal_state"] for row in rows]
    assert [row["input"] for row in converted] == [row["responses_create_params"]["input"] for row in rows]


def test_a_bad_event_names_file_line_and_field_and_writes_nothing(
    tmp_path: Path, rows: list[dict[str, Any]]
) -> None:
    bad = copy.deepcopy(rows[1])
    bad["exp_cal_state"]["5"]["constraint"] = "at lunchtime"
    source = tmp_path / "raw.jsonl"
    source.write_text(jsonl(rows[0], bad, rows[2]), encoding="utf-8")
    output = tmp_path / "relax.jsonl"
    output.write_bytes(b"previous output\n")
    result = convert(source, output)
    assert result.returncode == 2
    assert (
        "raw.jsonl:2: exp_cal_state[\"5\"].constraint 'at lunchtime': 'lunchtime' is not a time"
        in result.stderr
    )
    assert "Traceback" not in result.stderr
    assert output.read_bytes() == b"previous output\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["raw.jsonl", "relax.jsonl"]


def test_converting_a_converted_file_fails_at_line_one(tmp_path: Path, rows: list[dict[str, Any]]) -> None:
    source = tmp_path / "raw.jsonl"
    source.write_text(jsonl(rows[0]), encoding="utf-8")
    assert convert(source, tmp_path / "relax.jsonl").returncode == 0
    again = convert(tmp_path / "relax.jsonl", tmp_path / "twice.jsonl")
    assert again.returncode == 2
    assert "relax.jsonl:1: responses_create_params is missing" in again.stderr
    assert not (tmp_path / "twice.jsonl").exists()


def test_relax_gym_plugins_lists_calendar() -> None:
    result = run_cli("plugins", "--json", timeout_s=SAFETY_S)
    assert result.returncode == 0, result.stderr
    (ours,) = [p for p in json.loads(result.stdout)["plugins"] if p["distribution"] == "relax-gym-calendar"]
    assert [(e["name"], e["configs"], e["agent"]) for e in ours["environments"]] == [
        ("calendar", ["calendar-v1"], "calendar_simple_agent")
    ]
