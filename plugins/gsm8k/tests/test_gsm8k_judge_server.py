"""The LLM judge on, for REAL: upstream's math_with_judge resources server and upstream's openai_model as
the judge's model server (both configured by the plugin from RELAX_GYM_MATH_JUDGE_*), pointed at a scripted
Responses endpoint playing the judge. policy_model points at a port nobody listens on, so a judge call
sent there would fail the verify. These servers are this module's own (their config names the scripted
judge's port), started once for it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from attrs import define
from relax_gym_core.gym.processes import free_ports, run_gym_servers
from relax_gym_core.plugin import message, verify_body
from relax_gym_core.testing import Hooks, RecordedRequest, ScriptedReply, reply_json
from relax_gym_core.testing.web import ScriptedPolicy

from relax_gym_gsm8k import plugin
from relax_gym_gsm8k.judge import API_KEY_VAR, JUDGE_SERVER, MODEL_VAR, URL_VAR, judge_settings

pytestmark = pytest.mark.e2e


def judge_answer(text: str, model: str) -> dict[str, Any]:
    """A complete Responses object, as an OpenAI-compatible judge endpoint returns it."""
    return {
        "id": f"resp_judge_{time.monotonic_ns()}",
        "object": "response",
        "created_at": 0,
        "model": model,
        "status": "completed",
        "output": [message(text, "judge")],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }


@define
class Judge:
    verdict: str = "My final verdict is equivalent [[A=B]]"

    def __call__(self, request: RecordedRequest) -> ScriptedReply:
        return reply_json(200, judge_answer(self.verdict, str(request.model)))


@define
class JudgedStack:
    verifier: str
    judge: Judge
    endpoint: ScriptedPolicy


@pytest.fixture(scope="module")
def judged() -> Iterator[JudgedStack]:
    judge = Judge()
    with (
        ScriptedPolicy(judge, require_token="sk-judge-secret") as endpoint,
        pytest.MonkeyPatch.context() as mp,
    ):
        mp.setenv(API_KEY_VAR, "sk-judge-secret")  # inherited by the judge's server process
        settings = judge_settings({URL_VAR: f"{endpoint.base_url}/v1", MODEL_VAR: "judge-model"})
        servers = [
            server
            for server in plugin.definitions(settings)[1].servers
            if server.name in (plugin.MATH_RESOURCES, JUDGE_SERVER)  # the verifier and its judge, no agent
        ]
        (nobody,) = free_ports(1)
        with run_gym_servers(servers, gateway_host="127.0.0.1", gateway_port=nobody) as running:
            yield JudgedStack(running[plugin.MATH_RESOURCES].url, judge, endpoint)


def verify_answer(stack: JudgedStack, row: dict[str, Any], text: str) -> dict[str, Any]:
    body = verify_body(row, [message(text)])
    answer = httpx.post(f"{stack.verifier}/verify", json=body, timeout=120, trust_env=False)
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


def test_a_right_answer_in_words_is_scored_by_the_judge_at_its_own_endpoint(
    judged: JudgedStack, math_rows: list[dict[str, Any]], hooks: Hooks
) -> None:
    judged.endpoint.clear()
    judged.judge.verdict = "Both say the same number. [[A=B]]"
    result = verify_answer(judged, math_rows[0], "There are thirty-two such numbers.")
    assert (result["library_reward"], result["reward"]) == (0.0, 1.0)  # math-verify alone would say 0
    calls = judged.endpoint.model_requests("responses")
    assert len(calls) == 2  # asked in both orders, as upstream does
    for call in calls:
        assert call.bearer == "sk-judge-secret"
        assert call.model == "judge-model"
        assert "<|Problem|>" in json.dumps(call.body["input"])
    mapped = hooks.environments.get("math_with_judge").map_result(result)
    assert (mapped.reward, mapped.metrics["judge_calls"], mapped.metrics["library_reward"]) == (1.0, 2, 0.0)


def test_the_judge_can_say_no(judged: JudgedStack, math_rows: list[dict[str, Any]]) -> None:
    judged.endpoint.clear()
    judged.judge.verdict = "They differ. [[A!=B]]"
    result = verify_answer(judged, math_rows[0], "There are thirty-three such numbers.")
    assert result["reward"] == 0.0
    assert len(judged.endpoint.model_requests("responses")) == 1  # the first "no" settles it


def test_a_boxed_right_answer_needs_no_judge(judged: JudgedStack, math_rows: list[dict[str, Any]]) -> None:
    judged.endpoint.clear()
    assert verify_answer(judged, math_rows[0], "\\boxed{32}")["reward"] == 1.0
    assert judged.endpoint.model_requests() == []
