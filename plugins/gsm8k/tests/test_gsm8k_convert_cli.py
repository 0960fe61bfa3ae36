"""`relax-gym convert gsm8k|math_with_judge` as users run it: the real CLI in a subprocess, real rows in,
file:line errors out, and a refused file leaves the output exactly as it was."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from relax_gym_core.testing.web import run_cli

from relax_gym_gsm8k.judge import API_KEY_VAR, MODEL_VAR, URL_VAR
from relax_gym_gsm8k.rows import prompt

pytestmark = pytest.mark.e2e  # the real CLI

SAFETY_S = 120  # guards against hangs only
NO_JUDGE = {URL_VAR: "", MODEL_VAR: "", API_KEY_VAR: ""}  # set to nothing: the judge is off (judge.py)


def convert(environment: str, source: Path, output: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    command = ("convert", environment, "--input", str(source), "--output", str(output), *extra)
    return run_cli(*command, env=NO_JUDGE, timeout_s=SAFETY_S)


def jsonl(*rows: Any) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def test_both_gsm8k_shapes_convert(tmp_path: Path, gsm8k_rows: dict[str, list[dict[str, Any]]]) -> None:
    benchmark, original = gsm8k_rows["benchmark"][0], gsm8k_rows["original"][1]
    source = tmp_path / "gsm8k_benchmark.jsonl"
    source.write_text(jsonl(benchmark) + "\n" + jsonl(original), encoding="utf-8")
    output = tmp_path / "out" / "gsm8k_relax.jsonl"
    result = convert("gsm8k", source, output)
    assert result.returncode == 0, result.stderr
    assert "Converted 2 row(s)" in result.stdout
    rows = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    assert [row["metadata"]["expected_answer"] for row in rows] == ["32", "-3"]
    assert rows[0]["input"] == [{"role": "user", "content": prompt(benchmark["question"])}]
    assert rows[1]["metadata"]["answer"] == original["answer"]


def test_math_rows_convert_with_their_own_prompt(tmp_path: Path, math_rows: list[dict[str, Any]]) -> None:
    source = tmp_path / "math.jsonl"
    source.write_text(jsonl(*math_rows), encoding="utf-8")
    output = tmp_path / "math_relax.jsonl"
    result = convert("math_with_judge", source, output, "--limit", "3")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    assert [row["input"] for row in rows] == [
        row["responses_create_params"]["input"] for row in math_rows[:3]
    ]
    assert rows[2]["metadata"]["expected_answer"] == r"\(\frac{333}{1997}\)"


@pytest.mark.parametrize(
    ("bad_row", "message"),
    [
        ({"question": "q"}, "raw.jsonl:3: expected_answer is missing"),
        ({"question": "q", "expected_answer": "eighteen"}, "raw.jsonl:3: expected_answer must be a number"),
        (
            {"question": "q", "answer": "It is 18."},
            "raw.jsonl:3: answer must end with a '#### <number>' line",
        ),
        ({"expected_answer": 18}, "raw.jsonl:3: question is missing"),
    ],
)
def test_a_bad_row_names_file_line_and_field_and_writes_nothing(
    tmp_path: Path, gsm8k_rows: dict[str, list[dict[str, Any]]], bad_row: dict[str, Any], message: str
) -> None:
    good = gsm8k_rows["benchmark"][0]
    source = tmp_path / "raw.jsonl"
    source.write_text(jsonl(good) + "\n" + jsonl(bad_row, good), encoding="utf-8")  # the bad row is line 3
    output = tmp_path / "relax.jsonl"
    output.write_bytes(b"previous output\n")
    result = convert("gsm8k", source, output)
    assert result.returncode == 2
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert output.read_bytes() == b"previous output\n"  # untouched: no half-written file
    assert sorted(path.name for path in tmp_path.iterdir()) == ["raw.jsonl", "relax.jsonl"]  # no temp left


def test_a_converted_file_is_not_a_raw_one(
    tmp_path: Path, gsm8k_rows: dict[str, list[dict[str, Any]]]
) -> None:
    """Feeding the converted preview back in (relax-nemo-gym/v1 PITFALL 8.1.2) fails loudly at line 1."""
    source = tmp_path / "raw.jsonl"
    source.write_text(jsonl(gsm8k_rows["benchmark"][0]), encoding="utf-8")
    first = convert("gsm8k", source, tmp_path / "relax.jsonl")
    assert first.returncode == 0, first.stderr
    again = convert("gsm8k", tmp_path / "relax.jsonl", tmp_path / "twice.jsonl")
    assert again.returncode == 2
    assert "relax.jsonl:1: question is missing" in again.stderr
    assert not (tmp_path / "twice.jsonl").exists()


def test_relax_gym_plugins_lists_both_environments() -> None:
    result = run_cli("plugins", "--json", timeout_s=SAFETY_S)
    assert result.returncode == 0, result.stderr
    (ours,) = [p for p in json.loads(result.stdout)["plugins"] if p["distribution"] == "relax-gym-gsm8k"]
    assert [(e["name"], e["configs"], e["agent"]) for e in ours["environments"]] == [
        ("gsm8k", ["gsm8k-v1"], "gsm8k_math_with_judge_simple_agent"),
        ("math_with_judge", ["math-with-judge-v1"], "math_with_judge_simple_agent"),
    ]
