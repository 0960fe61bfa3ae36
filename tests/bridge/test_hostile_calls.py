"""Hostile model calls of a live trial (the capability comes from the in-process book, as in every bridge
test): bad text is a 4xx naming the field, a dead capability is refused before a stream starts, and an
upstream answer that cannot be re-encoded is a 502, never a 500."""

from __future__ import annotations

import json

import httpx
import pytest

from relax_gym_core.bridge import ROLLOUT_TAG
from relax_gym_core.testing import reply_raw
from relax_gym_core.testing.web import ScriptedPolicy

from .conftest import BridgeGateway

LONE = '"bad \\udc80 text"'  # a lone surrogate as any JSON encoder escapes it


def post(url: str, content: bytes) -> httpx.Response:
    return httpx.post(
        url, content=content, headers={"Content-Type": "application/json"}, trust_env=False, timeout=60
    )


@pytest.mark.parametrize("resource", ["chat/completions", "responses", "messages"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_lone_surrogate_in_a_live_call_is_a_422_naming_the_field(
    gateway: BridgeGateway, policy: ScriptedPolicy, resource: str, stream: bool
) -> None:
    trial = gateway.create_trial(policy.base_url)
    body = json.dumps({"messages": [{"role": "user", "content": "MARK"}], "stream": stream})
    raw = body.replace('"MARK"', LONE).encode()
    answer = post(f"{gateway.url}/ng-rollout/{trial.rollout_id}/v1/{resource}", raw)
    assert answer.status_code == 422
    assert answer.json() == {
        "detail": "messages[0].content must be valid Unicode (it contains a lone surrogate)"
    }
    assert policy.requests == []


def test_a_lone_surrogate_in_an_unprefixed_call_is_a_422_too(
    gateway: BridgeGateway, policy: ScriptedPolicy
) -> None:
    trial = gateway.create_trial(policy.base_url)
    body = {"input": "MARK", "metadata": {ROLLOUT_TAG: trial.rollout_id}}
    answer = post(f"{gateway.url}/v1/responses", json.dumps(body).replace('"MARK"', LONE).encode())
    assert (answer.status_code, answer.json()["detail"]) == (
        422,
        "input must be valid Unicode (it contains a lone surrogate)",
    )
    assert policy.requests == []


@pytest.mark.parametrize("resource", ["messages", "chat/completions", "responses"])
def test_a_streaming_call_with_a_dead_capability_gets_its_status_before_any_stream(
    gateway: BridgeGateway, policy: ScriptedPolicy, resource: str
) -> None:
    trial = gateway.create_trial(policy.base_url)
    gateway.abort(trial)
    body = {"model": "m", "max_tokens": 8, "messages": [], "stream": True}
    for url, sent in (
        (f"{gateway.url}/ng-rollout/{trial.rollout_id}/v1/{resource}", body),
        (f"{gateway.url}/v1/{resource}", {**body, "metadata": {ROLLOUT_TAG: trial.rollout_id}}),
    ):
        answer = post(url, json.dumps(sent).encode())
        assert answer.status_code == 410
        assert answer.headers["content-type"] == "application/json"
        assert answer.headers["x-should-retry"] == "false"
    assert policy.requests == []


def test_an_upstream_answer_with_nan_is_a_502(gateway: BridgeGateway, policy: ScriptedPolicy) -> None:
    trial = gateway.create_trial(policy.base_url)
    policy.enqueue(reply_raw(200, '{"id": "r1", "output": [], "temperature": NaN}'))
    answer = post(f"{gateway.url}/ng-rollout/{trial.rollout_id}/v1/responses", b'{"input": "hi"}')
    assert (answer.status_code, answer.json()) == (
        502,
        {"detail": "Upstream model callback returned invalid JSON"},
    )


def test_a_stream_is_refused_when_the_metadata_tag_is_dead_though_another_key_is_live(
    gateway: BridgeGateway, policy: ScriptedPolicy
) -> None:
    live = gateway.create_trial(policy.base_url)
    dead = gateway.create_trial(policy.base_url)
    gateway.abort(dead)
    # The raw-bytes search finds the live id (in a tool's schema); the capability is metadata's, and dead.
    body = {
        "model": "m",
        "max_tokens": 8,
        "messages": [],
        "stream": True,
        "tools": [{"name": "t", "input_schema": {ROLLOUT_TAG: live.rollout_id}}],
        "metadata": {ROLLOUT_TAG: dead.rollout_id},
    }
    answer = post(f"{gateway.url}/v1/messages", json.dumps(body).encode())
    assert (answer.status_code, answer.headers["content-type"]) == (410, "application/json")
    assert policy.requests == []


@pytest.mark.parametrize(
    ("upstream", "status", "detail"),
    [
        ("<html>Bad Gateway</html>", 502, "Upstream model callback returned a non-JSON response"),
        ('{"id": "c1"', 502, "Upstream model callback returned a non-JSON response"),
        ("[1, 2]", 502, "Upstream model callback response must be a JSON object"),
        # What the json module reads (and orjson does not) is an object all the same: passed on as it came.
        ('{"id": "c1", "score": NaN}', 200, None),
        ('\ufeff{"id": "c1"}', 200, None),
        ('{"id": "c1", "seed": 123456789012345678901234567890}', 200, None),
    ],
    ids=["html", "truncated", "array", "nan", "bom", "wide-int"],
)
def test_a_chat_answer_is_passed_on_as_it_came_if_it_is_one_json_object(
    gateway: BridgeGateway, policy: ScriptedPolicy, upstream: str, status: int, detail: str | None
) -> None:
    trial = gateway.create_trial(policy.base_url)
    policy.enqueue(reply_raw(200, upstream))
    answer = post(f"{gateway.url}/ng-rollout/{trial.rollout_id}/v1/chat/completions", b'{"messages": []}')
    assert answer.status_code == status
    if detail is None:
        assert answer.content == upstream.encode()
    else:
        assert answer.json() == {"detail": detail}
