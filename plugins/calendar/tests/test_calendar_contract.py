"""Registration, conversion and result mapping of the calendar plugin, through the conformance kit and on
upstream's example rows (probe rewards are checked against the real grader in test_calendar_verifier.py)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from relax_gym_core.plugin import STATELESS, RowError, answer
from relax_gym_core.protocol import Generation, InterruptPolicy
from relax_gym_core.testing import (
    Hooks,
    check_conversion,
    check_registration,
    check_result_mapping,
    converted_row,
    make_plugin_manager,
    unscored_answers,
)

ENV = "calendar"
ROLLOUT = f"{7:032x}-0"


def test_the_installed_plugin_registers_the_recipe_names() -> None:
    hooks = make_plugin_manager()  # through the entry point, as relax-gym finds it
    definition = check_registration(hooks, ENV)
    owner = hooks.owner(ENV)
    assert owner is not None and owner.distribution == "relax-gym-calendar"
    assert (definition.configs, definition.agent) == (("calendar-v1",), "calendar_simple_agent")
    servers = {server.name: server for server in definition.servers}
    assert set(servers) == {"calendar", "calendar_simple_agent"}
    assert servers["calendar"].server_class == "resources_servers.calendar.app:CalendarResourcesServer"
    assert servers["calendar"].implementation == "calendar"
    assert servers["calendar_simple_agent"].config == {
        "max_steps": 1,  # one generation per trial
        "resources_server": {"type": "resources_servers", "name": "calendar"},
        "model_server": {"type": "responses_api_models", "name": "policy_model"},
    }
    assert definition.interrupt_policy is InterruptPolicy.PROTECTED
    assert (definition.max_concurrency, definition.queue_capacity, definition.max_deadline_s) == (8, 32, 1800)
    assert hooks.environments.get(ENV).cleanup is STATELESS


def test_example_rows_keep_the_whole_conversation_and_the_expected_state(
    hooks: Hooks, rows: list[dict[str, Any]]
) -> None:
    converted = check_conversion(hooks, ENV, rows)
    assert len(converted) == 5
    for row, relax_row in zip(rows, converted, strict=True):
        assert relax_row["input"] == row["responses_create_params"]["input"]  # every turn, in order
        assert relax_row["metadata"] == {"exp_cal_state": row["exp_cal_state"], "tools": []}
    assert [len(relax_row["input"]) for relax_row in converted] == [10, 42, 38, 22, 18]


def _state(key: str, field: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda row: row["exp_cal_state"][key].__setitem__(field, value)


def _params(field: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda row: row["responses_create_params"].__setitem__(field, value)


def _drop_state_field(key: str, field: str) -> Callable[[dict[str, Any]], None]:
    return lambda row: row["exp_cal_state"][key].pop(field)


TOOL = {"type": "function", "name": "create_event", "parameters": {}}
STATE = 'exp_cal_state["1"]'
BAD_ROWS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "no expected state": (lambda row: row.pop("exp_cal_state"), "exp_cal_state is missing"),
    "state a list": (lambda row: row.__setitem__("exp_cal_state", []), "exp_cal_state must be an object"),
    "event not an object": (
        lambda row: row["exp_cal_state"].__setitem__("1", "x"),
        f"{STATE} must be an event",
    ),
    "id not the key": (_state("1", "event_id", 2), f"{STATE}.event_id must be the integer '1'"),
    "id text": (_state("1", "event_id", "1"), f"{STATE}.event_id must be the integer '1'"),
    "duration zero": (_state("1", "duration", 0), f"{STATE}.duration must be a positive"),
    "duration text": (_state("1", "duration", "60"), f"{STATE}.duration must be a positive"),
    "no min_time": (_drop_state_field("1", "min_time"), f"{STATE}.min_time must be a time string"),
    "unreadable max_time": (_state("1", "max_time", "4 PM"), f"{STATE}.max_time: '4 PM' is not a time"),
    "does not fit": (_state("1", "duration", 400), f"{STATE}: a 400-minute event does not fit"),
    "unknown constraint": (
        _state("1", "constraint", "around noon"),
        f"{STATE}.constraint 'around noon': not one of 'before X', 'after X', 'between X and Y', 'at X'",
    ),
    "constraint time": (
        _state("1", "constraint", "before 1:45PM"),
        f"{STATE}.constraint 'before 1:45PM': '1:45PM' is not a time",
    ),
    "reversed span": (
        _state("1", "constraint", "between 2pm and 1pm"),
        f"{STATE}.constraint 'between 2pm and 1pm': the 'between' span ends before it starts",
    ),
    "constraint a number": (_state("1", "constraint", 13), f"{STATE}.constraint must be null or text"),
    "no params": (lambda row: row.pop("responses_create_params"), "responses_create_params is missing"),
    "empty conversation": (_params("input", []), "responses_create_params.input must be a non-empty"),
    "message without role": (_params("input", [{"content": "hi"}]), "responses_create_params.input[0].role"),
    "ends with the assistant": (
        _params("input", [{"role": "user", "content": "a"}, {"role": "assistant", "content": "[]"}]),
        "responses_create_params.input must end with the user's turn",
    ),
    "with tools": (_params("tools", [TOOL]), "responses_create_params.tools must be empty"),
}


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_bad_rows_raise_row_error_naming_the_field(
    hooks: Hooks, rows: list[dict[str, Any]], case: str
) -> None:
    breaks, message = BAD_ROWS[case]
    row = copy.deepcopy(rows[0])
    breaks(row)
    with pytest.raises(RowError) as caught:
        converted_row(hooks.environments.get(ENV), row)
    assert str(caught.value).startswith(message), str(caught.value)


def test_an_empty_expected_state_is_a_valid_row(hooks: Hooks, rows: list[dict[str, Any]]) -> None:
    row = {**copy.deepcopy(rows[0]), "exp_cal_state": {}}  # nothing to schedule: upstream grades it 1
    assert converted_row(hooks.environments.get(ENV), row)["metadata"]["exp_cal_state"] == {}


def test_the_run_body_carries_the_state_and_no_tools(hooks: Hooks, rows: list[dict[str, Any]]) -> None:
    relax_row = converted_row(hooks.environments.get(ENV), copy.deepcopy(rows[1]))
    task = {"messages": relax_row["input"], "metadata": relax_row["metadata"]}
    body = hooks.environments.get(ENV).build_run_body(copy.deepcopy(task), Generation(), ROLLOUT)
    assert body["exp_cal_state"] == rows[1]["exp_cal_state"]
    assert body["responses_create_params"] == {
        "input": rows[1]["responses_create_params"]["input"],
        "tools": [],
    }
    assert (body["_ng_task_index"], body["_ng_rollout_index"]) == (f"{7:032x}", "0")


def test_a_task_without_its_state_is_refused_before_the_run(hooks: Hooks, rows: list[dict[str, Any]]) -> None:
    """A converted file fed back as raw data (relax-nemo-gym/v1 PITFALL 8.3.6) would otherwise be a 422
    inside the agent's /verify."""
    relax_row = converted_row(hooks.environments.get(ENV), copy.deepcopy(rows[0]))
    task = {"messages": relax_row["input"], "metadata": {"tools": []}}
    with pytest.raises(RowError, match=r"^exp_cal_state is missing"):
        hooks.environments.get(ENV).build_run_body(task, Generation(), ROLLOUT)


REAL_BODY: dict[str, Any] = {
    "responses_create_params": {"input": [{"role": "user", "content": "Schedule it."}], "tools": []},
    "exp_cal_state": {},
    "response": {"id": "resp_1", "output": list(answer("[]", "1"))},
    "reward": 1.0,
}

FAILURES = unscored_answers(REAL_BODY)


def test_result_mapping_contract(hooks: Hooks) -> None:
    check_result_mapping(
        hooks, ENV, body=REAL_BODY, failure_bodies=list(FAILURES.values()), failure_kind="verifier_error"
    )


def test_results_say_whether_the_model_answered(hooks: Hooks) -> None:
    assert hooks.environments.get(ENV).map_result(copy.deepcopy(REAL_BODY)).metrics["answered"] is True
    reasoning_only = copy.deepcopy(REAL_BODY)
    reasoning_only["response"]["output"] = [{"type": "reasoning", "id": "rs_1", "summary": []}]
    result = hooks.environments.get(ENV).map_result({**reasoning_only, "reward": 0.0})
    assert (result.reward, result.metrics["answered"]) == (0.0, False)
