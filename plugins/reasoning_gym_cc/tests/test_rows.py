"""Registration, conversion, /run bodies and result mapping of reasoning_gym, through the conformance kit
and on real rows: the bundled examples (written by the generator) and upstream's own example rows (their
verifier probes are checked against the real server in test_verifier.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from relax_gym_core.gym.installed import example_rows as upstream_example_rows
from relax_gym_core.ingym import CLEANUP_PATH
from relax_gym_core.plugin import CleanupContract, EnvironmentDefinition, EnvironmentFailure, RowError, answer
from relax_gym_core.protocol import Generation, TrialStatus
from relax_gym_core.testing import (
    Hooks,
    check_conversion,
    check_registration,
    check_result_mapping,
    converted_row,
    make_plugin_manager,
    unscored_answers,
)

from relax_gym_reasoning_gym_cc import plugin
from relax_gym_reasoning_gym_cc.data import example_rows
from relax_gym_reasoning_gym_cc.prompts import prompt

ENV = "reasoning_gym"
ROLLOUT = f"{7:032x}-0"
UPSTREAM = "resources_servers.reasoning_gym"


@pytest.fixture
def environment(hooks: Hooks) -> EnvironmentDefinition:
    return hooks.environments.get(ENV)


@pytest.fixture(scope="module")
def upstream_rows() -> list[dict[str, Any]]:
    """Upstream's 5 knights_knaves example rows (their own prompt, no <answer> tags asked)."""
    return upstream_example_rows(UPSTREAM)


def unprompted(row: dict[str, Any]) -> dict[str, Any]:
    """A row as reasoning-gym's create_dataset gives it: question, answer, metadata."""
    return {key: copy.deepcopy(row[key]) for key in ("question", "answer", "metadata")}


# ---- registration ----------------------------------------------------------------------------------------


def test_the_installed_plugin_registers_the_recipe_names() -> None:
    hooks = make_plugin_manager()  # through the entry point, as relax-gym finds it
    definition = check_registration(hooks, ENV)
    owner = hooks.owner(ENV)
    assert owner is not None and owner.distribution == "relax-gym-reasoning-gym-cc"
    assert (definition.configs, definition.agent) == (("reasoning-gym-cc-v1",), plugin.AGENT)
    servers = {server.name: server for server in definition.servers}
    resources = servers["reasoning_gym"]
    assert (resources.kind, resources.implementation) == ("resources_servers", "reasoning_gym")
    assert resources.server_class == "resources_servers.reasoning_gym.app:ReasoningGymResourcesServer"
    assert servers[plugin.AGENT].config["resources_server"] == {
        "type": "resources_servers",
        "name": "reasoning_gym",
    }
    assert hooks.environments.get(ENV).cleanup == CleanupContract.at(plugin.AGENT, CLEANUP_PATH)


# ---- conversion ------------------------------------------------------------------------------------------


def test_real_rows_of_every_shape_pass_the_conversion_contract(
    hooks: Hooks, upstream_rows: list[dict[str, Any]]
) -> None:
    bundled = example_rows()
    rows = [*bundled, *upstream_rows, *(unprompted(row) for row in bundled)]
    converted = check_conversion(hooks, ENV, rows, max_examples=40)
    for row, relax_row in zip(rows, converted, strict=True):
        assert relax_row["metadata"]["question"] == row["question"]  # the scorer gets the question as is
        assert relax_row["metadata"]["metadata"]["source_dataset"] == row["metadata"]["source_dataset"]
    # upstream's rows keep their own prompt; the bundled ones carry the one a bare row gets
    assert converted[len(bundled)]["input"] == upstream_rows[0]["responses_create_params"]["input"]
    for generated, bare in zip(converted[: len(bundled)], converted[-len(bundled) :], strict=True):
        assert generated["input"] == bare["input"]


def test_a_bare_row_is_asked_for_answer_tags(environment: EnvironmentDefinition) -> None:
    row = unprompted(example_rows()[0])
    (message,) = converted_row(environment, row)["input"]
    assert message == {"role": "user", "content": prompt(row["question"])}
    assert "<answer>answer here</answer>" in message["content"]
    assert message["content"].endswith("\n\n" + row["question"])


def test_agent_ref_is_dropped_on_the_way_in_and_out(environment: EnvironmentDefinition) -> None:
    """Published rows name upstream's agent; relax-gym routes by environment and config."""
    row = {
        **example_rows()[2],
        "agent_ref": {"type": "responses_api_agents", "name": "reasoning_gym_simple_agent"},
    }
    converted = converted_row(environment, copy.deepcopy(row))
    assert "agent_ref" not in converted["metadata"]
    task = {
        "messages": converted["input"],
        "metadata": {**converted["metadata"], "agent_ref": row["agent_ref"]},
    }
    body = environment.build_run_body(task, Generation(), ROLLOUT)
    assert "agent_ref" not in body
    assert (body["question"], body["answer"], body["metadata"]) == (
        row["question"],
        row["answer"],
        row["metadata"],
    )
    assert body["responses_create_params"]["input"] == row["responses_create_params"]["input"]
    assert (body["_ng_task_index"], body["_ng_rollout_index"]) == (f"{7:032x}", "0")


def good() -> dict[str, Any]:
    return unprompted(example_rows()[0])


def without(field: str) -> dict[str, Any]:
    row = good()
    del row[field]
    return row


def with_fields(**fields: Any) -> dict[str, Any]:
    return {**good(), **fields}


BAD: dict[str, tuple[dict[str, Any], str]] = {
    "no source_dataset": (
        with_fields(metadata={"source_index": 0}),
        "metadata.source_dataset is missing: it names the reasoning-gym task",
    ),
    "source_dataset null": (
        with_fields(metadata={"source_dataset": None}),
        "metadata.source_dataset is missing",
    ),
    "source_dataset a number": (
        with_fields(metadata={"source_dataset": 3}),
        "metadata.source_dataset must be",
    ),
    "source_dataset blank": (
        with_fields(metadata={"source_dataset": " "}),
        "metadata.source_dataset must be",
    ),
    "no metadata": (without("metadata"), "metadata must be an object naming source_dataset"),
    "metadata a list": (with_fields(metadata=[]), "metadata must be an object"),
    "no question": (without("question"), "question is missing"),
    "blank question": (with_fields(question=" "), "question must be a non-empty string"),
    "no answer": (without("answer"), "answer is missing"),
    "numeric answer": (with_fields(answer=4), "answer must be a string or null, not int"),
    "params not an object": (
        with_fields(responses_create_params=[]),
        "responses_create_params must be an object",
    ),
    "empty prompt": (
        with_fields(responses_create_params={"input": []}),
        "responses_create_params.input must be a non-empty",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_rows_raise_row_error_naming_the_field(environment: EnvironmentDefinition, case: str) -> None:
    row, message = BAD[case]
    with pytest.raises(RowError) as caught:
        converted_row(environment, copy.deepcopy(row))
    assert str(caught.value).startswith(message), str(caught.value)


def test_a_null_answer_is_a_row(environment: EnvironmentDefinition) -> None:
    """Upstream's verify request allows it (tasks whose scorer checks the answer itself)."""
    converted = converted_row(environment, with_fields(answer=None))
    assert converted["metadata"]["answer"] is None


def test_rows_of_no_reasoning_gym_task_are_dropped_from_mixes(environment: EnvironmentDefinition) -> None:
    kept = converted_row(environment, good())
    assert environment.drop_reason(kept) is None
    typo = converted_row(environment, with_fields(metadata={"source_dataset": "leg_count"}))
    assert environment.drop_reason(typo) == "unknown reasoning-gym task"
    mixer = converted_row(environment, with_fields(metadata={"source_dataset": "composite"}))
    assert environment.drop_reason(mixer) == "unknown reasoning-gym task"


# ---- /run bodies -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({"question": "q", "answer": "1", "metadata": {}}, "metadata.source_dataset is missing"),
        ({"answer": "1", "metadata": {"source_dataset": "gcd"}}, "question is missing"),
        ({"question": "q", "metadata": {"source_dataset": "gcd"}}, "answer is missing"),
    ],
)
def test_a_task_the_verifier_cannot_score_is_refused_before_the_run(
    environment: EnvironmentDefinition, metadata: dict[str, Any], message: str
) -> None:
    task = {"messages": [{"role": "user", "content": "q"}], "metadata": metadata}
    with pytest.raises(RowError, match=f"^{message}"):
        environment.build_run_body(task, Generation(), ROLLOUT)


def test_a_task_without_a_prompt_is_refused(environment: EnvironmentDefinition) -> None:
    task = {
        "messages": [],
        "metadata": {"question": "q", "answer": "1", "metadata": {"source_dataset": "gcd"}},
    }
    with pytest.raises(RowError, match=r"^responses_create_params\.input must be a non-empty"):
        environment.build_run_body(task, Generation(), ROLLOUT)


# ---- results ---------------------------------------------------------------------------------------------

# The shape of a real /run answer of claude_code_agent over reasoning_gym (a verify response + the agent's
# turns_used / finished_naturally).
REAL_BODY: dict[str, Any] = {
    "responses_create_params": {"input": [{"role": "user", "content": prompt("Calculate 6 * 7.")}]},
    "question": "Calculate 6 * 7.",
    "answer": "42",
    "metadata": {"source_dataset": "basic_arithmetic", "source_index": 0},
    "response": {
        "id": "resp_1",
        "output": [
            {"type": "function_call", "call_id": "c1", "name": "Bash", "arguments": "{}", "id": "fc_1"},
            {"type": "function_call_output", "call_id": "c1", "output": "42\n"},
            *answer("<answer>42</answer>", "1"),
        ],
    },
    "reward": 1.0,
    "task_name": "basic_arithmetic",
    "score": 1.0,
    "extracted_answer": "42",
    "turns_used": 1,
    "finished_naturally": True,
}

FAILURES: dict[str, tuple[dict[str, Any], str]] = {
    **{case: (body, "verifier_error") for case, body in unscored_answers(REAL_BODY).items()},
    "empty answer": ({}, "verifier_error"),
    "empty output": ({**REAL_BODY, "response": {"id": "r", "output": []}, "reward": 0.0}, "agent_error"),
}


def test_result_mapping_contract(hooks: Hooks) -> None:
    check_result_mapping(hooks, ENV, body=REAL_BODY, failure_bodies=[body for body, _ in FAILURES.values()])


@pytest.mark.parametrize("case", sorted(FAILURES))
def test_an_unverified_answer_is_a_failure_never_a_zero(
    environment: EnvironmentDefinition, case: str
) -> None:
    body, kind = FAILURES[case]
    with pytest.raises(EnvironmentFailure) as caught:
        environment.map_result(copy.deepcopy(body))
    assert caught.value.kind == kind


def test_results_carry_reasoning_gyms_own_figures(environment: EnvironmentDefinition) -> None:
    result = environment.map_result(copy.deepcopy(REAL_BODY))
    assert (result.status, result.reward) == (TrialStatus.COMPLETED, 1.0)
    assert result.metrics == {
        "model_output_items": 3,
        "tool_calls": 1,
        "tool_outputs": 1,
        "assistant_messages": 1,
        "task_name": "basic_arithmetic",
        "turns_used": 1,
        "answer_extracted": True,
        "finished_naturally": True,
    }
    untagged = environment.map_result({**copy.deepcopy(REAL_BODY), "reward": 0.0, "extracted_answer": ""})
    assert (untagged.reward, untagged.metrics["answer_extracted"]) == (0.0, False)


def test_a_run_stopped_before_its_final_message_is_truncated_with_its_score(
    environment: EnvironmentDefinition,
) -> None:
    body = copy.deepcopy(REAL_BODY)
    body["response"]["output"] = body["response"]["output"][:2]  # max turns hit after the Bash call
    body.update(reward=0.0, extracted_answer="", turns_used=0, finished_naturally=False)
    result = environment.map_result(body)
    assert (result.status, result.reward, result.metrics["finished_naturally"]) == (
        TrialStatus.TRUNCATED,
        0.0,
        False,
    )
