"""Result mapping of the workplace plugin: reward, status, turns; infrastructure failures never score."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from relax_gym_core.protocol import TrialStatus
from relax_gym_core.testing import Hooks, check_result_mapping, unscored_answers

from relax_gym_workplace.plugin import count_turns

ENV = "workplace_assistant"


def _call(n: int) -> dict[str, Any]:
    return {"type": "function_call", "name": "email_search_emails", "arguments": "{}", "call_id": f"c{n}"}


def _out(n: int) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": f"c{n}", "output": '{"output": []}'}


MESSAGE = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]}
REASONING = {"type": "reasoning", "summary": []}

# simple_agent's output: each response's items, then the outputs of its calls, then the next response.
REAL_OUTPUT = [_call(1), _call(2), _out(1), _out(2), _call(3), _out(3), MESSAGE]
REAL_BODY = {
    "responses_create_params": {"input": [{"role": "user", "content": "reply to carlos"}]},
    "response": {"id": "resp_1", "object": "response", "output": REAL_OUTPUT},
    "reward": 1.0,
    "id": 0,
    "category": "workplace_assistant_email",
    "environment_name": "workplace_assistant",
}


@pytest.mark.parametrize(
    ("output", "turns"),
    [
        ([], 0),
        ([MESSAGE], 1),
        (REAL_OUTPUT, 3),
        ([MESSAGE, _call(1), _out(1), MESSAGE], 2),  # a message and a call in one response count once
        ([REASONING, _call(1), _out(1), REASONING, MESSAGE], 2),
        ([_call(1), _out(1), _call(2), _out(2)], 2),  # max_steps hit after a tool round
    ],
)
def test_turns_count_model_responses(output: list[dict[str, Any]], turns: int) -> None:
    assert count_turns(output) == turns


def test_a_verified_run_keeps_reward_status_and_counts(hooks: Hooks) -> None:
    result = hooks.environments.get(ENV).map_result(copy.deepcopy(REAL_BODY))
    assert result.status is TrialStatus.COMPLETED
    assert result.reward == 1.0
    assert result.metrics == {
        "model_output_items": 7,
        "tool_calls": 3,
        "tool_outputs": 3,
        "assistant_messages": 1,
        "turns": 3,
    }


def test_a_zero_reward_is_a_score_and_truncation_is_kept(hooks: Hooks) -> None:
    result = hooks.environments.get(ENV).map_result(
        {**copy.deepcopy(REAL_BODY), "reward": 0.0, "truncated": True}
    )
    assert result.status is TrialStatus.TRUNCATED
    assert result.reward == 0.0
    assert result.metrics["turns"] == 3


FAILURES = unscored_answers(REAL_BODY)


def test_result_mapping_contract(hooks: Hooks) -> None:
    check_result_mapping(
        hooks, ENV, body=REAL_BODY, failure_bodies=list(FAILURES.values()), failure_kind="verifier_error"
    )
