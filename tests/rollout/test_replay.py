"""Replaying a recorded trajectory (policies/replay.py), as a probe's replay server and the oracle use it:
its model turns split at what the environment produced, answered in order by how many turns a request
already holds after its prompt, and which trial a request belongs to known exactly, never guessed."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from relax_gym_core.plugin import VerifierProbe
from relax_gym_core.policies.replay import ReplayPlan, replay_app, rollout_of, turns_of
from relax_gym_core.rollout.data import task_identity
from relax_gym_core.rollout.policy import oracle_line, oracle_token

PROMPT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]
REASONING = {"type": "reasoning", "id": "rs_1", "summary": []}
CALL = {"type": "function_call", "name": "add", "arguments": '{"a": 2, "b": 2}', "call_id": "c1"}
CALL_OUTPUT = {"type": "function_call_output", "call_id": "c1", "output": "4"}
OBSERVATION = {"role": "user", "content": "the board now"}  # a gymnasium observation: no "type" key
ANSWER = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "4"}]}


def probe(output: list[dict[str, Any]]) -> VerifierProbe:
    row = {"responses_create_params": {"input": PROMPT}}
    return VerifierProbe(name="r0", row=row, output=tuple(output), expected_reward=1.0, replay=True)


def test_model_turns_are_split_at_what_the_environment_produced() -> None:
    output = [REASONING, CALL, CALL_OUTPUT, ANSWER, OBSERVATION, REASONING, ANSWER]
    assert turns_of(output) == [[REASONING, CALL], [ANSWER], [REASONING, ANSWER]]


def test_a_request_gets_the_turn_after_those_its_input_holds() -> None:
    plan = ReplayPlan.of(probe([REASONING, CALL, CALL_OUTPUT, ANSWER]))
    first = plan.reply({"input": PROMPT, "model": "m"})
    assert first is not None and first["output"] == [REASONING, CALL] and first["status"] == "completed"
    # The prompt's own assistant turns (a multi-turn prompt) are not counted: only what follows it.
    second = plan.reply({"input": [*PROMPT, REASONING, CALL, CALL_OUTPUT]})
    assert second is not None and second["output"] == [ANSWER]
    past = {"input": [*PROMPT, REASONING, CALL, CALL_OUTPUT, ANSWER, OBSERVATION]}
    assert plan.reply(past) is None  # the environment diverged from the recording


def test_a_reasoning_only_turn_is_answered_complete_and_asking_again_is_past_the_recording() -> None:
    """NeMo Gym's recordings do not keep whether a reasoning-only turn was cut off: it is answered as a model
    may end one, so an agent that would loop on it asks past the recording and the replay fails there."""
    plan = ReplayPlan.of(probe([REASONING]))
    reply = plan.reply({"input": PROMPT})
    assert reply is not None and reply["output"] == [REASONING]
    assert (reply["status"], reply["incomplete_details"]) == ("completed", None)
    assert plan.reply({"input": [*PROMPT, REASONING]}) is None


def test_the_rollout_id_comes_from_the_path_prefix_or_the_tag() -> None:
    assert rollout_of("/ng-rollout/7-0/v1/responses", {}) == "7-0"
    assert rollout_of("/v1/responses", {"metadata": {"relax_gym_rollout": "3-1"}}) == "3-1"
    assert rollout_of("/v1/responses", {"metadata": {}}) is None


@pytest.mark.anyio
async def test_the_replay_server_answers_by_rollout_and_refuses_past_the_end() -> None:
    plan = ReplayPlan.of(probe([ANSWER]))
    divergences: dict[str, str] = {}
    app = replay_app(lambda path, body: plan if rollout_of(path, body) == "1-0" else None, divergences)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://replay") as client:
        ok = await client.post("/ng-rollout/1-0/v1/responses", json={"input": PROMPT})
        assert ok.status_code == 200 and ok.json()["output"] == [ANSWER]
        unknown = await client.post("/v1/responses", json={"input": PROMPT, "metadata": {}})
        assert unknown.status_code == 404
        past = await client.post(
            "/ng-rollout/1-0/v1/responses", json={"input": [*PROMPT, ANSWER, OBSERVATION]}
        )
        assert past.status_code == 409
    assert divergences == {"1-0": past.json()["detail"]}
    assert "the recording has 1 model turn(s) and the agent asked for turn 2" in divergences["1-0"]


def test_an_oracle_trials_key_names_its_data_line() -> None:
    token = oracle_token(0, 0.0, 12, 3)
    assert token.startswith("oracle-good-") and oracle_line(token) == 12
    assert oracle_line(oracle_token(0, 1.0, 12, 3)) is None  # a known-bad trial is not a replay
    assert oracle_line(None) is None and oracle_line("sk-anything") is None


def test_a_task_is_the_same_task_whether_mix_tagged_it_or_not() -> None:
    metadata = {"expected_answer": "4"}
    tagged = {**metadata, "environment": "x", "config": "x-v1", "data_source": "x"}
    assert task_identity(PROMPT, metadata) == task_identity(PROMPT, tagged)
    assert task_identity(PROMPT, metadata) != task_identity(PROMPT, {"expected_answer": "5"})
