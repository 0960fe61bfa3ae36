"""`relax-gym convert reasoning_gym` as users run it: the real CLI in a subprocess, real rows in, file:line
errors out (a row without metadata.source_dataset above all: upstream answers it with HTTP 500), and a
refused file leaves the output exactly as it was."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from relax_gym_core.testing.web import run_cli

from relax_gym_reasoning_gym_cc.data import example_rows

pytestmark = pytest.mark.e2e  # the real CLI

SAFETY_S = 120  # guards against hangs only


def convert(source: Path, output: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    command = ("convert", "reasoning_gym", "--input", str(source), "--output", str(output), *extra)
    return run_cli(*command, timeout_s=SAFETY_S)


def jsonl(*rows: Any) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def test_generated_and_published_shapes_convert(tmp_path: Path) -> None:
    generated = example_rows()[2]
    published = {  # the published dataset's shape: the bare question as prompt, upstream's agent_ref
        "responses_create_params": {"input": [{"role": "user", "content": generated["question"]}]},
        "question": generated["question"],
        "answer": generated["answer"],
        "metadata": generated["metadata"],
        "agent_ref": {"type": "responses_api_agents", "name": "reasoning_gym_simple_agent"},
    }
    source = tmp_path / "rows.jsonl"
    source.write_text(jsonl(generated) + "\n" + jsonl(published), encoding="utf-8")
    output = tmp_path / "out" / "relax.jsonl"
    result = convert(source, output)
    assert result.returncode == 0, result.stderr
    assert "Converted 2 row(s)" in result.stdout
    rows = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    assert [row["input"] for row in rows] == [
        generated["responses_create_params"]["input"],
        published["responses_create_params"]["input"],
    ]
    for row in rows:
        # agent_ref gone; the route tags of `relax-gym convert` added
        assert set(row["metadata"]) == {
            "question",
            "answer",
            "metadata",
            "environment",
            "config",
            "data_source",
        }
        assert (row["metadata"]["environment"], row["metadata"]["config"]) == (
            "reasoning_gym",
            "reasoning-gym-cc-v1",
        )
        assert row["metadata"]["metadata"]["source_dataset"] == "leg_counting"


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        (
            {"source_index": 3},
            "rows.jsonl:3: metadata.source_dataset is missing: it names the reasoning-gym task",
        ),
        ({"source_dataset": 7}, "rows.jsonl:3: metadata.source_dataset must be a reasoning-gym task name"),
    ],
)
def test_a_row_without_its_task_names_file_line_and_field_and_writes_nothing(
    tmp_path: Path, metadata: dict[str, Any], message: str
) -> None:
    good = example_rows()[0]
    bad = {**good, "metadata": metadata}
    source = tmp_path / "rows.jsonl"
    source.write_text(jsonl(good) + "\n" + jsonl(bad, good), encoding="utf-8")  # the bad row is line 3
    output = tmp_path / "relax.jsonl"
    output.write_bytes(b"previous output\n")
    result = convert(source, output)
    assert result.returncode == 2
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert output.read_bytes() == b"previous output\n"  # untouched: no half-written file
    assert sorted(path.name for path in tmp_path.iterdir()) == ["relax.jsonl", "rows.jsonl"]  # no temp left


def test_relax_gym_plugins_lists_the_environment() -> None:
    result = run_cli("plugins", "--json", timeout_s=SAFETY_S)
    assert result.returncode == 0, result.stderr
    (ours,) = [
        p for p in json.loads(result.stdout)["plugins"] if p["distribution"] == "relax-gym-reasoning-gym-cc"
    ]
    assert [(e["name"], e["configs"], e["agent"]) for e in ours["environments"]] == [
        ("reasoning_gym", ["reasoning-gym-cc-v1"], "reasoning_gym_claude_code_agent_model_server"),
    ]
