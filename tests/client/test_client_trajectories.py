"""GatewayClient.trajectories: many ended trials' trajectories per request from a real gateway, the ids an
answer deferred asked again, and trial by trial from a gateway without GET /v1/trajectories."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from starlette.testclient import TestClient

from relax_gym_core.bridge import CallbackPolicy
from relax_gym_core.client import GatewayClient
from relax_gym_core.gateway import GatewaySettings, create_app, parse_environments, trajectory_api
from relax_gym_core.protocol import parse_create_request
from relax_gym_core.testing.web import GatewayProcess, ScriptedPolicy, start_gateway

pytestmark = pytest.mark.anyio

ECHO = {"echo": {"environment": "echo", "runtime": "echo", "max_concurrency": 4, "queue_capacity": 4}}
SAFETY_S = 60.0


def echo_trial(policy: ScriptedPolicy, request_id: str, calls: int) -> dict[str, Any]:
    return {
        "protocol_version": "relax-nemo-gym/v1",
        "request_id": request_id,
        "session": {"session_id": f"s-{request_id}", "group_id": "g", "rollout_mode": "train"},
        "environment": {
            "name": "echo",
            "config": "echo",
            "task": {
                "messages": [{"role": "user", "content": "hi"}],
                "metadata": {"echo": {"model": {"api": "chat", "calls": calls}}},
            },
        },
        "model_endpoint": {"base_url": policy.base_url, "api_key": "sk-many-0123456789", "model": "m"},
        "interrupt_policy": "protected",
    }


async def run_to_the_end(client: GatewayClient, bodies: list[dict[str, Any]]) -> list[str]:
    for body in bodies:
        await client.create(parse_create_request(body))
    with anyio.fail_after(SAFETY_S):
        for body in bodies:
            await client.settled(body["request_id"], timeout_s=SAFETY_S)
    return [body["request_id"] for body in bodies]


class Seen(httpx.AsyncBaseTransport):
    """The real transport, noting each request's path; `without_many` answers GET /v1/trajectories as a
    gateway without that route does (Starlette's 404 for an unknown path)."""

    def __init__(self, *, without_many: bool = False) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.without_many = without_many
        self.paths: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        if self.without_many and request.url.path == "/v1/trajectories":
            return httpx.Response(404, json={"detail": "Not Found"})
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.fixture(scope="module")
def policy() -> Iterator[ScriptedPolicy]:
    with ScriptedPolicy() as policy:
        yield policy


@pytest.fixture(scope="module")
def gateway(policy: ScriptedPolicy) -> Iterator[GatewayProcess]:
    with start_gateway(ECHO) as gateway:
        yield gateway


@pytest.mark.parametrize("without_many", [False, True], ids=["many-per-request", "older-gateway"])
async def test_trajectories_of_ended_trials_come_by_request_id(
    gateway: GatewayProcess, policy: ScriptedPolicy, without_many: bool
) -> None:
    seen = Seen(without_many=without_many)
    async with GatewayClient(gateway.url, transport=seen) as client:
        bodies = [echo_trial(policy, f"many-{without_many}-{calls}", calls) for calls in (1, 2, 3)]
        ended = await run_to_the_end(client, bodies)
        seen.paths.clear()
        found = await client.trajectories([*ended, "no-such-trial"])
        assert list(found) == [*ended, "no-such-trial"]
        assert found["no-such-trial"] is None
        for request_id, calls in zip(ended, (1, 2, 3), strict=True):
            document = found[request_id]
            assert document is not None
            assert document == await client.trajectory(request_id)
            assert len(document["model_calls"]) == calls
        asked = seen.paths[: -len(ended)]  # the single trajectory() reads above come last
        per_trial = [f"/v1/trials/{request_id}/trajectory" for request_id in (*ended, "no-such-trial")]
        assert asked == (["/v1/trajectories", *per_trial] if without_many else ["/v1/trajectories"])
        seen.paths.clear()
        await client.trajectories(ended[:1])
        # An older gateway is not asked for many again.
        assert seen.paths == ([per_trial[0]] if without_many else ["/v1/trajectories"])


class InProcess(httpx.AsyncBaseTransport):
    """A gateway app in this process (Starlette's TestClient: real routing and lifespan), for the client."""

    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.answers: list[dict[str, Any]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        answer = await anyio.to_thread.run_sync(
            lambda: self.client.request(request.method, str(request.url), content=body)
        )
        if request.url.path == "/v1/trajectories":
            self.answers.append(answer.json())
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)


async def test_ids_an_answer_deferred_are_asked_again(
    policy: ScriptedPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trajectory_api, "ANSWER_BUDGET", 1)  # one document an answer
    settings = GatewaySettings(
        environments=parse_environments(json.dumps(ECHO), source="test"),
        callback_policy=CallbackPolicy.parse(hosts=[], networks=["127.0.0.1/32"], proxy=None),
        public_url="http://testserver",
    )
    with TestClient(create_app(settings)) as test_client:
        transport = InProcess(test_client)
        async with GatewayClient("http://testserver", transport=transport) as client:
            bodies = [echo_trial(policy, f"deferred-{index}", 0) for index in range(3)]
            ended = await run_to_the_end(client, bodies)
            found = await client.trajectories(ended)
    assert all(found[request_id] is not None for request_id in ended)
    assert [list(answer["trajectories"]) for answer in transport.answers] == [[r] for r in ended]
    assert [answer["deferred"] for answer in transport.answers] == [ended[1:], ended[2:], []]
