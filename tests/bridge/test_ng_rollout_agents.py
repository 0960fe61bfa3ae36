"""Agents that address the bridge as NeMo Gym >= 0.5 does are answered exactly as metadata-tagged ones.

NeMo Gym >= 0.5 with observability on joins the /run body's ``_ng_task_index`` and ``_ng_rollout_index``
into ``<task>-<rollout>`` and prefixes every model call with ``/ng-rollout/<task>-<rollout>``
(``nemo_gym/base_responses_api_agent.py``: ``url_path_for_run``, ``base_url_for_run``; claude_code_agent
puts it in ``ANTHROPIC_BASE_URL``, so the CLI first sends ``HEAD <base>/api/hello``). NeMo Gym 0.4.0
cannot, so the agent here is a scripted one that does exactly that with the official SDKs (openai for
Chat and Responses, anthropic for Messages, streamed as Claude Code streams), against a real `relax-gym
serve` process; its twin tags each call's metadata instead, as 0.4.0's simple_agent resends it. Both
trials' calls must reach the policy identically, with the trial's own token.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from relax_gym_core.protocol import PROTOCOL_VERSION
from relax_gym_core.testing import RecordedRequest, ScriptedReply, reply_text
from relax_gym_core.testing.web import GatewayProcess, PolicyByToken, ThreadedServer, start_gateway

from . import sdks

ANSWERS = {"chat/completions": "from chat", "responses": "from responses", "messages": "from messages"}
SAFETY_S = 60.0  # a bound for a hung test, not a timing assertion


class NemoGymAgent:
    """A NeMo Gym agent's /run: three model calls of each API, by the trial's prefix or its tag."""

    def __init__(self) -> None:
        self.gateway = ""
        self.hello: list[int] = []  # HEAD <base>/api/hello statuses, prefixed runs only
        self.rollout_ids: list[str] = []
        self.app = Starlette(routes=[Route("/run", self.run, methods=["POST"])])

    async def run(self, request: Request) -> JSONResponse:
        body = await request.json()
        rollout_id = (
            f"{body['_ng_task_index']}-{body['_ng_rollout_index']}"  # as NeMo Gym <= 0.5.0 joins them
        )
        assert body["_ng_rollout_id"] == rollout_id  # NeMo Gym main's explicit id: the same
        self.rollout_ids.append(rollout_id)
        params = body["responses_create_params"]
        prefixed = body["style"] != "tagged"
        base = f"{self.gateway}/ng-rollout/{rollout_id}" if prefixed else self.gateway
        if body["style"] == "attempt":  # main: a re-dispatched attempt (-a<n>) with training token capture
            base = f"{self.gateway}/ng-rollout/{body['_ng_rollout_id']}-a2/training-token-capture"
        tag = {} if prefixed else {"metadata": params["metadata"]}  # what 0.4.0's simple_agent resends
        answers: list[str] = []
        if prefixed:
            async with httpx.AsyncClient(trust_env=False, timeout=SAFETY_S) as http:
                self.hello.append((await http.head(f"{base}/api/hello")).status_code)
        key = "agent-side-key"  # what an agent holds; never forwarded
        async with sdks.openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=key, timeout=SAFETY_S) as chat:
            completion = await chat.chat.completions.create(
                model="agent-model", messages=params["input"], temperature=0.5, **tag
            )
            answers.append(completion.choices[0].message.content or "")
            response = await chat.responses.create(model="agent-model", input=params["input"], **tag)
            answers.append(response.output_text)
        extra = {"extra_body": tag} if tag else {}
        async with sdks.anthropic.AsyncAnthropic(base_url=base, api_key=key, timeout=SAFETY_S) as claude:
            messages = claude.messages.stream(
                model="agent-model", max_tokens=64, messages=params["input"], **extra
            )
            async with messages as stream:  # Claude Code streams every call
                answers.append(await stream.get_final_text())
        reward = 1.0 if answers == list(ANSWERS.values()) else 0.0
        message = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]}
        return JSONResponse({"reward": reward, "response": {"output": [message]}, "answers": answers})


def answer(request: RecordedRequest) -> ScriptedReply:
    return reply_text(ANSWERS[request.resource or "chat/completions"])


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[GatewayProcess, PolicyByToken, NemoGymAgent]]:
    agent = NemoGymAgent()
    server = ThreadedServer(agent.app)
    server.start()
    policy = PolicyByToken(answer)
    specs = {
        "ng-v1": {"environment": "ng", "agent_name": "ng_agent", "agent_url": server.url, "stateless": True}
    }
    try:
        with policy, start_gateway(specs) as gateway:
            agent.gateway = gateway.url
            yield gateway, policy, agent
    finally:
        server.stop()


def trial(gateway: GatewayProcess, policy: PolicyByToken, style: str) -> dict[str, Any]:
    token = f"session-token-{style}-{time.monotonic_ns()}"
    body = {
        "protocol_version": PROTOCOL_VERSION,
        "request_id": f"ng-{style}-{time.monotonic_ns()}",
        "session": {"session_id": f"session-{style}", "group_id": "g", "rollout_mode": "train"},
        "environment": {
            "name": "ng",
            "config": "ng-v1",
            "task": {"messages": [{"role": "user", "content": "hi"}], "metadata": {"style": style}},
        },
        "model_endpoint": {"base_url": policy.server.base_url, "api_key": token, "model": "policy-alias"},
        "interrupt_policy": "protected",
        "deadline_s": 120,
        "lease_s": 120,
        "generation": {"sampling_params": {"temperature": 0.0}},
    }
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=SAFETY_S) as http:
        assert http.post("/v1/trials", json=body).status_code == 202
        stop = time.monotonic() + SAFETY_S
        while (snapshot := http.get(f"/v1/trials/{body['request_id']}").json())["status"] in (
            "queued",
            "running",
        ):
            assert time.monotonic() < stop, "trial did not finish"
            time.sleep(0.05)
    return {"snapshot": snapshot, "token": token}


def forwarded(policy: PolicyByToken, token: str) -> list[tuple[str | None, str, Any]]:
    calls = [r for r in policy.server.model_requests() if r.bearer == token]
    return [(r.resource, r.path, r.body) for r in calls]


def test_prefixed_and_tagged_agents_reach_their_trial_identically(
    stack: tuple[GatewayProcess, PolicyByToken, NemoGymAgent],
) -> None:
    gateway, policy, agent = stack
    prefixed = trial(gateway, policy, "prefixed")
    tagged = trial(gateway, policy, "tagged")
    for done in (prefixed, tagged):
        assert (done["snapshot"]["status"], done["snapshot"]["reward"]) == ("completed", 1.0)
    assert agent.hello[-1:] == [200]  # Claude Code's probe of its base URL, under the trial's prefix
    via_prefix, via_tag = forwarded(policy, prefixed["token"]), forwarded(policy, tagged["token"])
    assert [resource for resource, _path, _body in via_prefix] == list(ANSWERS)
    # The same upstream paths and bodies: model alias forced, sampling overlaid, no tag, no agent key.
    assert via_prefix == via_tag
    for _resource, _path, sent in via_prefix:
        assert sent["model"] == "policy-alias" and sent["temperature"] == 0.0
        assert "relax_gym_rollout" not in str(sent)


def test_an_attempt_with_training_token_capture_reaches_its_trial(
    stack: tuple[GatewayProcess, PolicyByToken, NemoGymAgent],
) -> None:
    """NeMo Gym main calls models at /ng-rollout/<id>-a<n>/training-token-capture/v1/... for a re-dispatched
    attempt with token capture on: the same trial's calls, forwarded as any other."""
    gateway, policy, agent = stack
    attempt = trial(gateway, policy, "attempt")
    tagged = trial(gateway, policy, "tagged")
    assert (attempt["snapshot"]["status"], attempt["snapshot"]["reward"]) == ("completed", 1.0)
    assert agent.hello[-1:] == [200]
    assert forwarded(policy, attempt["token"]) == forwarded(policy, tagged["token"])
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=SAFETY_S) as http:
        late = http.post(f"/ng-rollout/{agent.rollout_ids[-2]}-a2/v1/responses", json={"model": "m"})
        assert late.status_code == 410  # the attempt's trial is over: refused like its own id


def test_a_prefixed_call_of_a_finished_trial_is_refused(
    stack: tuple[GatewayProcess, PolicyByToken, NemoGymAgent],
) -> None:
    gateway, policy, agent = stack
    done = trial(gateway, policy, "prefixed")
    assert done["snapshot"]["status"] == "completed"
    calls = [r for r in policy.server.model_requests() if r.bearer == done["token"]]
    before = len(policy.server.model_requests())
    # The agent's own prefix, after the trial: its rollout id is not live any more.
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=SAFETY_S) as http:
        late_id = agent.rollout_ids[-1]
        for path in ("/v1/chat/completions", "/v1/responses", "/v1/messages"):
            late = http.post(f"/ng-rollout/{late_id}{path}", json={"model": "m", "messages": []})
            assert late.status_code == 410
            assert late.json() == {"detail": "callback capability is unavailable"}
    assert len(calls) == 3 and len(policy.server.model_requests()) == before
