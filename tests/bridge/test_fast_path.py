"""The model-call fast path (GatewayApp answers model calls before Starlette) takes exactly the bridge's
routes, leaves everything else, including other methods on those paths, to the router, and keeps the two
guards every request passes: errors contained, bodies capped."""

from __future__ import annotations

import logging
import socket
from typing import Any

import pytest
from starlette.routing import Route

from relax_gym_core.bridge import Bridge
from relax_gym_core.bridge.routes import RESOURCES, match_model_call
from relax_gym_core.testing import reply_text
from relax_gym_core.testing.web import ScriptedPolicy

from .conftest import AGENT_KEY, BridgeGateway


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/ng-rollout/abc-0/v1/chat/completions", ("abc-0", "chat/completions")),
        ("/ng-rollout/abc-0/v1/responses", ("abc-0", "responses")),
        ("/ng-rollout/abc-0/v1/messages", ("abc-0", "messages")),
        ("/ng-rollout/abc-0/training-token-capture/v1/responses", ("abc-0", "responses")),  # NeMo Gym main
        (
            "/ng-rollout/abc-0-a2/v1/responses",
            ("abc-0-a2", "responses"),
        ),  # an attempt: the bridge resolves it
        ("/ng-rollout/abc-0/training-token-capture/training-token-capture/v1/responses", None),
        ("/v1/chat/completions", (None, "chat/completions")),
        ("/v1/responses", (None, "responses")),
        ("/v1/messages", (None, "messages")),
        ("/ng-rollout//v1/messages", None),  # no capability in the path
        ("/ng-rollout/abc-0/v1/messages/", None),
        ("/ng-rollout/abc-0/v1/completions", None),
        ("/ng-rollout/abc-0/api/hello", None),
        ("/ng-rollout/a/b/v1/messages", None),
        ("/v1/trials", None),
        ("/v1/chat/completions/x", None),
        ("/", None),
    ],
)
def test_match_model_call(path: str, expected: tuple[str | None, str] | None) -> None:
    assert match_model_call(path) == expected


def test_fast_path_and_router_agree(gateway: BridgeGateway) -> None:
    """The fast path takes every POST route of the bridge, with the same parameters, and no other route."""
    taken = []
    for route in gateway.app.routes:
        if not isinstance(route, Route) or "POST" not in (route.methods or ()):
            continue
        concrete = route.path.replace("{rollout_id}", "r-1").replace("{request_id}", "t-1")
        matched = match_model_call(concrete)
        is_model_call = any(route.path.endswith("/v1/" + resource) for resource in RESOURCES)
        assert (matched is not None) == is_model_call, route.path
        if matched is not None:
            rollout_id, resource = matched
            assert concrete.endswith("/v1/" + resource)
            assert rollout_id == ("r-1" if "{rollout_id}" in route.path else None)
            taken.append(route.path)
    assert len(taken) == 3 * len(RESOURCES)  # /ng-rollout/<id>, with training token capture, unprefixed


def test_other_methods_still_reach_the_router(gateway: BridgeGateway) -> None:
    answer = gateway.http.get("/ng-rollout/r-1/v1/chat/completions")
    assert answer.status_code == 405
    assert answer.json() == {"detail": "Method Not Allowed"}
    assert gateway.http.get("/ng-rollout/r-1/api/hello").status_code == 200


def test_bad_bodies_get_the_error_table(gateway: BridgeGateway, policy: ScriptedPolicy) -> None:
    trial = gateway.create_trial(policy.base_url)
    path = f"/ng-rollout/{trial.rollout_id}/v1/chat/completions"
    headers = {"Authorization": f"Bearer {AGENT_KEY}", "Content-Type": "application/json"}
    not_json = gateway.http.post(path, content=b"{nope", headers=headers)
    assert not_json.status_code == 400
    assert "detail" in not_json.json()
    not_object = gateway.http.post(path, content=b"[1, 2]", headers=headers)
    assert (not_object.status_code, not_object.json()) == (
        422,
        {"detail": "Callback body must be a JSON object"},
    )
    unknown = gateway.http.post("/ng-rollout/no-such-trial/v1/chat/completions", json={}, headers=headers)
    assert unknown.status_code == 410
    assert unknown.headers["x-should-retry"] == "false"
    assert policy.requests == []  # none of these went upstream


def test_a_client_that_leaves_mid_body_costs_nothing(gateway: BridgeGateway, policy: ScriptedPolicy) -> None:
    trial = gateway.create_trial(policy.base_url)
    host, port = gateway.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port))) as sock:
        head = (
            f"POST /ng-rollout/{trial.rollout_id}/v1/chat/completions HTTP/1.1\r\n"
            f"Host: {host}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        )
        sock.sendall(head.encode() + b'{"model": "m", "messages": [')  # then hang up
    policy.enqueue(reply_text("still serving"))
    answer: Any = gateway.openai_client(trial.rollout_id).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}]
    )
    assert answer.choices[0].message.content == "still serving"
    assert len(policy.requests) == 1  # the abandoned call never went upstream


def test_a_long_context_crosses_the_bridge_whole(gateway: BridgeGateway, policy: ScriptedPolicy) -> None:
    trial = gateway.create_trial(policy.base_url)
    policy.enqueue(reply_text("read it all"))
    long_turn = "x" * 5_000_000  # a long agent context arrives in many receive() chunks
    answer = gateway.openai_client(trial.rollout_id).chat.completions.create(
        model="m", messages=[{"role": "user", "content": long_turn}]
    )
    assert answer.choices[0].message.content == "read it all"
    assert policy.requests[0].body["messages"][0]["content"] == long_turn


def test_an_unexpected_error_in_a_model_call_is_contained(
    gateway: BridgeGateway,
    policy: ScriptedPolicy,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    trial = gateway.create_trial(policy.base_url)
    secret = "sk-never-logged"

    async def explode(*_args: Any) -> Any:
        raise ValueError(f"Invalid header value: Bearer {secret}")  # a bug, quoting what it was given

    monkeypatch.setattr(Bridge, "handle", explode)
    with caplog.at_level(logging.DEBUG):
        answer = gateway.http.post(
            f"/ng-rollout/{trial.rollout_id}/v1/chat/completions", json={"messages": []}
        )
    assert (answer.status_code, answer.json()) == (500, {"detail": "internal error"})
    assert "unhandled error in the gateway: ValueError (message withheld)" in caplog.text
    assert secret not in caplog.text
    assert policy.requests == []
