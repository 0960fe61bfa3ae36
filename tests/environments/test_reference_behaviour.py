"""The reference behaviour (relax_gym_core.plugin.reference, what EnvironmentDefinition's methods default
to): the reference converter, /run body builder and result normalisation."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from relax_gym_core.plugin import STATELESS, EnvironmentDefinition, RowError
from relax_gym_core.plugin.host import converted_row, make_plugin_manager, reference_environment
from relax_gym_core.plugin.reference import build_run_body, convert_row, map_result
from relax_gym_core.protocol import Generation, TrialStatus

R2E_ROW: dict[str, Any] = {
    "responses_create_params": {
        "input": [],
        "metadata": {"instance_id": "repo__1", "instance_dict": "{}"},
        "model": "model",
        "temperature": 0.7,
        "top_p": 0.8,
        "max_output_tokens": 32768,
    },
    "agent_ref": {"type": "responses_api_agents", "name": "swe_agents"},
    "instance_id": "repo__1",
    "problem_statement": "The parser crashes on empty input.",
}
WORKPLACE_ROW: dict[str, Any] = {
    "responses_create_params": {
        "input": [
            {"role": "system", "content": "You are an assistant."},
            {"role": "user", "content": "Mail Bob"},
        ],
        "tools": [{"type": "function", "name": "send_email", "parameters": {}}],
        "parallel_tool_calls": False,
        "instructions": "Be brief.",
        "temperature": 1.0,
    },
    "ground_truth": [{"name": "send_email", "arguments": '{"to": "bob"}'}],
    "category": "email",
    "id": 12,
}


def test_a_numeric_expected_answer_becomes_a_string() -> None:
    # math_with_judge answers 422 for a number (and /run then fails with 500); prepare.py writes numbers.
    row = {
        "responses_create_params": {"input": [{"role": "user", "content": "3 + 5?"}]},
        "expected_answer": 8,
    }
    converted = convert_row(row)
    assert converted == {
        "input": [{"role": "user", "content": "3 + 5?"}],
        "metadata": {"expected_answer": "8"},
    }
    assert row["expected_answer"] == 8  # the raw row is not changed


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"question": "q", "expected_answer": 1}, "must contain responses_create_params"),
        ({"expected_answer": 1}, "must contain responses_create_params"),
        ({"responses_create_params": "text"}, "responses_create_params must be an object"),
        (
            {"responses_create_params": {"input": "hi"}},
            "responses_create_params.input must be a messages array",
        ),
        ({"responses_create_params": {}}, "responses_create_params.input must be a messages array"),
    ],
)
def test_unusable_rows_raise_row_error_naming_the_field(row: dict[str, Any], message: str) -> None:
    with pytest.raises(RowError, match=message):
        convert_row(row)


def test_r2e_problem_statement_becomes_the_prompt_and_the_empty_input_is_preserved() -> None:
    converted = convert_row(copy.deepcopy(R2E_ROW))
    assert converted["input"] == [{"role": "user", "content": R2E_ROW["problem_statement"]}]
    preserved = converted["metadata"]["responses_create_params"]
    assert preserved == {**R2E_ROW["responses_create_params"], "input": []}
    assert converted["metadata"]["instance_id"] == "repo__1"
    assert converted["metadata"]["agent_ref"] == R2E_ROW["agent_ref"]


def test_empty_input_without_problem_statement_stays_empty() -> None:
    converted = convert_row({"responses_create_params": {"input": []}, "id": 1})
    assert converted == {"input": [], "metadata": {"id": 1}}


def test_tools_parallel_tool_calls_and_instructions_fan_out_into_metadata() -> None:
    converted = convert_row(copy.deepcopy(WORKPLACE_ROW))
    params = WORKPLACE_ROW["responses_create_params"]
    assert converted["input"] == params["input"]
    assert converted["metadata"] == {
        "ground_truth": WORKPLACE_ROW["ground_truth"],
        "category": "email",
        "id": 12,
        "responses_create_params": {"temperature": 1.0},
        "tools": params["tools"],
        "parallel_tool_calls": False,
        "developer_message": "Be brief.",
    }
    empty = convert_row({"responses_create_params": {"input": [], "instructions": ""}})
    assert "developer_message" not in empty["metadata"]


def test_run_body_merges_params_fans_metadata_out_and_sets_rollout_indices() -> None:
    converted = convert_row(copy.deepcopy(WORKPLACE_ROW))
    task = {"messages": converted["input"], "metadata": converted["metadata"], "extra": "kept"}
    before = copy.deepcopy(task)
    body = build_run_body(
        task=task,
        generation=Generation(responses_create_params={"temperature": 0.2, "max_output_tokens": 64}),
        rollout_id="abc-0",
    )
    assert task == before  # the trial's task is not mutated
    assert body["responses_create_params"] == {
        "input": WORKPLACE_ROW["responses_create_params"]["input"],
        "temperature": 0.2,  # generation overrides the preserved params
        "max_output_tokens": 64,
        "tools": WORKPLACE_ROW["responses_create_params"]["tools"],
        "parallel_tool_calls": False,
        "instructions": "Be brief.",
    }
    assert body["ground_truth"] == WORKPLACE_ROW["ground_truth"]
    assert body["category"] == "email"
    assert body["id"] == 12
    assert body["extra"] == "kept"
    assert not {"tools", "parallel_tool_calls", "developer_message", "messages", "metadata"} & set(body)
    assert (body["_ng_task_index"], body["_ng_rollout_index"]) == ("abc", "0")


def test_r2e_run_body_restores_the_empty_agent_input() -> None:
    converted = convert_row(copy.deepcopy(R2E_ROW))
    body = build_run_body(
        task={"messages": converted["input"], "metadata": converted["metadata"]},
        generation=Generation(),
        rollout_id="0123456789abcdef0123456789abcdef-3",
    )
    assert body["responses_create_params"] == R2E_ROW["responses_create_params"]
    assert body["problem_statement"] == R2E_ROW["problem_statement"]
    assert body["_ng_task_index"] == "0123456789abcdef0123456789abcdef"
    assert body["_ng_rollout_index"] == "3"


def test_raw_row_task_passes_through_with_indices() -> None:
    body = build_run_body(task=copy.deepcopy(WORKPLACE_ROW), generation=Generation(), rollout_id="t-1")
    assert body == {**WORKPLACE_ROW, "_ng_rollout_id": "t-1", "_ng_task_index": "t", "_ng_rollout_index": "1"}


@pytest.mark.parametrize(
    "task",
    [
        {"messages": "hi", "metadata": {}},
        {"messages": [], "metadata": []},
        {"metadata": {"responses_create_params": 1}},
    ],
)
def test_malformed_task_is_refused(task: dict[str, Any]) -> None:
    with pytest.raises(TypeError, match="Relax task"):
        build_run_body(task=task, generation=Generation(), rollout_id="t-0")


def test_result_counts_output_items_and_copies_metrics() -> None:
    body = {
        "reward": 1.0,
        "response": {
            "output": [
                {"type": "function_call", "name": "f"},
                {"type": "function_call_output", "output": "{}"},
                {"type": "function_call", "name": "g"},
                {"type": "message", "content": []},
                "not an item",
            ]
        },
        "metrics": {"steps": 3},
        "resolved": True,
        "artifact_ref": "runs/abc",
    }
    result = map_result(body)
    assert result.status is TrialStatus.COMPLETED
    assert result.reward == 1.0
    assert result.metrics == {
        "steps": 3,
        "model_output_items": 4,
        "tool_calls": 2,
        "tool_outputs": 1,
        "assistant_messages": 1,
    }  # environment-specific verdicts ("resolved" here) are their plugins' to map
    assert result.artifact_ref == "runs/abc"


def test_truncated_result_and_missing_reward_stays_none() -> None:
    result = map_result({"truncated": True, "artifact_ref": ""})
    assert result.status is TrialStatus.TRUNCATED
    assert result.reward is None  # never 0 for a run that produced no reward
    assert result.artifact_ref is None
    assert map_result({"reward": 0.0}).reward == 0.0


def test_an_environment_no_plugin_registers_behaves_as_the_reference() -> None:
    hooks = make_plugin_manager(load_entry_points=False)
    assert hooks.plugins == []  # the reference is part of the core, not a listed plugin
    math = hooks.environments.lookup("math")
    assert math == reference_environment("math")
    raw = {"responses_create_params": {"input": [{"role": "user", "content": "q"}]}, "expected_answer": 2.5}
    converted = converted_row(math, raw)
    assert converted == convert_row(raw)
    assert converted["metadata"]["expected_answer"] == "2.5"
    body = math.build_run_body(
        {"messages": converted["input"], "metadata": converted["metadata"]}, Generation(), "abc-0"
    )
    assert body["responses_create_params"] == {"input": converted["input"]}
    assert (body["_ng_task_index"], body["_ng_rollout_index"]) == ("abc", "0")
    assert math.map_result({"reward": 1}).reward == 1
    assert math.drop_reason(converted) is None
    assert list(math.verifier_probes()) == []
    assert math.cleanup.stateless


class Defaults(EnvironmentDefinition):
    """A subclass overriding nothing."""


def test_a_subclass_overriding_nothing_is_the_reference() -> None:
    environment = Defaults(name="d", configs=("c",), agent="", servers=(), cleanup=STATELESS, runtime="x")
    row = copy.deepcopy(WORKPLACE_ROW)
    assert environment.convert_row(row) == convert_row(copy.deepcopy(WORKPLACE_ROW))
    task = {"messages": [{"role": "user", "content": "q"}], "metadata": {"id": 1}}
    generation = Generation(responses_create_params={"temperature": 0.1})
    assert environment.build_run_body(task, generation, "t-2") == build_run_body(task, generation, "t-2")
    answer = {"reward": 0.5, "response": {"output": [{"type": "message"}]}, "truncated": True}
    assert environment.map_result(answer) == map_result(answer)


class Checked(EnvironmentDefinition):
    """Overrides check_row only: the default convert_row and build_run_body call it."""

    def check_row(self, row: dict[str, Any]) -> None:
        if not isinstance(row.get("ground_truth"), list):
            raise RowError("ground_truth must be a list of calls")


def test_check_row_guards_the_default_conversion_and_run_body() -> None:
    environment = Checked(name="c", configs=("c",), agent="", servers=(), cleanup=STATELESS, runtime="x")
    converted = environment.convert_row(copy.deepcopy(WORKPLACE_ROW))
    assert converted == convert_row(copy.deepcopy(WORKPLACE_ROW))
    with pytest.raises(RowError, match="ground_truth must be a list of calls"):
        environment.convert_row({**copy.deepcopy(WORKPLACE_ROW), "ground_truth": "send_email"})
    task = {"messages": converted["input"], "metadata": converted["metadata"]}
    assert (
        environment.build_run_body(task, Generation(), "t-0")["ground_truth"] == WORKPLACE_ROW["ground_truth"]
    )
    lost = {"messages": converted["input"], "metadata": {"category": "email"}}  # lost its verifier field
    with pytest.raises(RowError, match="ground_truth must be a list of calls"):
        environment.build_run_body(lost, Generation(), "t-0")
