"""Registration and row conversion of the workplace plugin, on the upstream example rows."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from relax_gym_core.plugin import CleanupContract, RowError
from relax_gym_core.protocol import Generation, InterruptPolicy
from relax_gym_core.testing import (
    REFERENCE_NORMALISED,
    Hooks,
    check_conversion,
    check_registration,
    converted_row,
)

ENV = "workplace_assistant"
ROLLOUT = f"{7:032x}-0"


def test_registration_follows_the_contract_and_the_brief(hooks: Hooks) -> None:
    definition = check_registration(hooks, ENV, installed=False)
    assert definition.configs == ("workplace-assistant-v1",)
    assert definition.agent == "workplace_assistant_simple_agent"
    servers = {server.name: server for server in definition.servers}
    assert set(servers) == {"workplace_assistant", "workplace_assistant_simple_agent"}
    resources = servers["workplace_assistant"]
    assert (resources.kind, resources.implementation) == ("resources_servers", "workplace_assistant")
    assert resources.server_class == "relax_gym_workplace.server:CleanupWorkbenchResourcesServer"
    assert dict(resources.config) == {"domain": "agent"}
    agent = servers["workplace_assistant_simple_agent"]
    assert (agent.kind, agent.implementation) == ("responses_api_agents", "simple_agent")
    assert agent.server_class == "responses_api_agents.simple_agent.app:SimpleAgent"
    assert dict(agent.config) == {
        "max_steps": 6,
        "resources_server": {"type": "resources_servers", "name": "workplace_assistant"},
        "model_server": {"type": "responses_api_models", "name": "policy_model"},
    }
    assert definition.interrupt_policy is InterruptPolicy.PROTECTED
    assert (definition.max_concurrency, definition.queue_capacity, definition.max_deadline_s) == (8, 32, 1800)
    assert set(definition.readiness or ()) == set(servers)
    assert hooks.environments.get(ENV).cleanup == CleanupContract(
        server="workplace_assistant",
        abort_path="/cleanup/{rollout_id}",
        force_path="/cleanup/{rollout_id}",
        probe_path="/cleanup/{rollout_id}",
    )


def test_example_rows_pass_the_conversion_contract(hooks: Hooks, rows: list[dict[str, Any]]) -> None:
    converted = check_conversion(hooks, ENV, rows, normalised=REFERENCE_NORMALISED | {"ground_truth"})
    assert len(converted) == 5
    for row, relax_row in zip(rows, converted, strict=True):
        params = row["responses_create_params"]
        assert relax_row["input"] == params["input"]
        metadata = relax_row["metadata"]
        # The model sees exactly the row's own tool schemas; the verifier gets its fields back.
        assert metadata["tools"] == params["tools"]
        assert len(metadata["tools"]) == 27
        assert metadata["parallel_tool_calls"] is False
        assert metadata["responses_create_params"] == {"temperature": 1.0}
        for key in ("id", "category", "environment_name", "ground_truth"):
            assert metadata[key] == row[key]


def test_a_json_string_ground_truth_becomes_the_list_form(hooks: Hooks, rows: list[dict[str, Any]]) -> None:
    row = copy.deepcopy(rows[2])
    calls = row["ground_truth"]
    row["ground_truth"] = json.dumps(calls)
    assert converted_row(hooks.environments.get(ENV), row)["metadata"]["ground_truth"] == calls
    # arguments given as an object are serialised to the JSON string upstream requires
    row["ground_truth"] = [
        {"name": call["name"], "arguments": json.loads(call["arguments"])} for call in calls
    ]
    normalised = converted_row(hooks.environments.get(ENV), row)["metadata"]["ground_truth"]
    assert all(isinstance(call["arguments"], str) for call in normalised)
    assert [json.loads(call["arguments"]) for call in normalised] == [
        json.loads(c["arguments"]) for c in calls
    ]


def _without(key: str) -> Any:
    return lambda row: row.pop(key)


def _set(key: str, value: Any) -> Any:
    return lambda row: row.__setitem__(key, value)


def _params(key: str, value: Any) -> Any:
    return lambda row: row["responses_create_params"].__setitem__(key, value)


GOOD_CALL = {"name": "email_reply_email", "arguments": '{"email_id": "00000057", "body": "ok"}'}

BAD_ROWS = {
    "no tools": (lambda row: row["responses_create_params"].pop("tools"), "responses_create_params.tools"),
    "empty tools": (_params("tools", []), "responses_create_params.tools"),
    "tools not a list": (_params("tools", {"type": "function"}), "responses_create_params.tools"),
    "tool not a schema": (_params("tools", ["email_reply_email"]), "responses_create_params.tools[0]"),
    "tool without name": (_params("tools", [{"type": "function"}]), "responses_create_params.tools[0].name"),
    "no params": (_without("responses_create_params"), "responses_create_params"),
    "empty input": (_params("input", []), "responses_create_params.input"),
    "no ground truth": (_without("ground_truth"), "ground_truth"),
    "ground truth not JSON": (_set("ground_truth", "reply to carlos"), "ground_truth"),
    "ground truth JSON of a string": (_set("ground_truth", '"reply"'), "ground_truth"),
    "ground truth an object": (_set("ground_truth", GOOD_CALL), "ground_truth"),
    "call not an object": (_set("ground_truth", ["email_reply_email"]), "ground_truth[0]"),
    "call without name": (_set("ground_truth", [{"arguments": "{}"}]), "ground_truth[0].name"),
    "call to an unknown tool": (
        _set("ground_truth", [GOOD_CALL, {"name": "mcp__email_reply_email", "arguments": "{}"}]),
        "ground_truth[1].name",
    ),
    "arguments not JSON": (
        _set("ground_truth", [{"name": "email_reply_email", "arguments": "{email_id: 57"}]),
        "ground_truth[0].arguments",
    ),
    "arguments not an object": (
        _set("ground_truth", [{"name": "email_reply_email", "arguments": "[57]"}]),
        "ground_truth[0].arguments",
    ),
    "arguments missing": (_set("ground_truth", [{"name": "email_reply_email"}]), "ground_truth[0].arguments"),
    "no id": (_without("id"), "id"),
    "id a string": (_set("id", "0"), "id"),
    "id a boolean": (_set("id", True), "id"),
    "no category": (_without("category"), "category"),
    "environment_name not a string": (_set("environment_name", 5), "environment_name"),
}


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_bad_rows_raise_row_error_naming_the_field(
    hooks: Hooks, rows: list[dict[str, Any]], case: str
) -> None:
    breaks, field = BAD_ROWS[case]
    row = copy.deepcopy(rows[0])
    breaks(row)
    with pytest.raises(RowError) as caught:
        converted_row(hooks.environments.get(ENV), row)
    assert str(caught.value).startswith(field), str(caught.value)


def test_run_body_carries_the_normalised_verifier_fields(hooks: Hooks, rows: list[dict[str, Any]]) -> None:
    relax_row = converted_row(hooks.environments.get(ENV), copy.deepcopy(rows[1]))
    task = {"messages": relax_row["input"], "metadata": copy.deepcopy(relax_row["metadata"])}
    task["metadata"]["ground_truth"] = json.dumps(rows[1]["ground_truth"])  # e.g. an older converter's row
    body = hooks.environments.get(ENV).build_run_body(task, Generation(), ROLLOUT)
    assert body["ground_truth"] == rows[1]["ground_truth"]
    assert body["responses_create_params"]["tools"] == rows[1]["responses_create_params"]["tools"]
    assert (body["_ng_task_index"], body["_ng_rollout_index"]) == (f"{7:032x}", "0")
    assert (body["id"], body["category"]) == (rows[1]["id"], rows[1]["category"])


def test_a_raw_row_passed_through_as_task_is_normalised_too(hooks: Hooks, rows: list[dict[str, Any]]) -> None:
    raw = copy.deepcopy(rows[0])
    raw["ground_truth"] = json.dumps(raw["ground_truth"])
    body = hooks.environments.get(ENV).build_run_body(raw, Generation(), ROLLOUT)
    assert body["ground_truth"] == rows[0]["ground_truth"]


def test_a_task_with_unusable_ground_truth_is_refused_before_the_run(
    hooks: Hooks, rows: list[dict[str, Any]]
) -> None:
    relax_row = converted_row(hooks.environments.get(ENV), copy.deepcopy(rows[0]))
    relax_row["metadata"]["ground_truth"] = "reply to carlos"
    with pytest.raises(RowError, match=r"^ground_truth"):
        hooks.environments.get(ENV).build_run_body(
            {"messages": relax_row["input"], "metadata": relax_row["metadata"]}, Generation(), ROLLOUT
        )
