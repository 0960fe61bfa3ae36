"""No secret in the gateway's log on the paths that log the most about a model call: a retried upstream
5xx (the bridge retries 500/502/503/504, logging each retry), an upstream 401 (the session's token was
refused), and the gateway's own 401 (a wrong API token on the trial API).

A real `relax-gym serve` (echo runtime, its model calls through the bridge) at debug level, in front of a
scripted policy; the session's API key, its id, an extra header's value, the gateway's API token and the
wrong token a client presented each have a value of their own, so a leak names which one leaked.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from relax_gym_core.policies.replies import default_script
from relax_gym_core.testing import ErrorReply, RecordedRequest, ScriptedReply
from relax_gym_core.testing.web import GatewayProcess, ScriptedPolicy, run_policy, start_gateway

from .conftest import ECHO, SAFETY_S, logged

TERMINAL = ("completed", "truncated", "failed", "aborted")
RETRIED_STATUS = 503  # one of the bridge's retried statuses (bridge/upstream.py RETRY_STATUSES)


def secret(kind: str) -> str:
    return f"{kind}-{secrets.token_hex(12)}"


API_TOKEN = secret("gateway-api-token")  # the gateway's RELAX_GYM_API_TOKEN
WRONG_TOKEN = secret("presented-wrong-token")  # what a misconfigured client sends instead
REFUSED_KEY = secret("sk-refused-session")  # a session token the policy answers 401


def script(request: RecordedRequest) -> ScriptedReply:
    """Answer like Relax: 401 for a session it does not know, else a plain answer."""
    if request.bearer == REFUSED_KEY:
        return ErrorReply(
            status=401, message="unknown session", type="authentication_error", code="authentication_error"
        )
    return default_script(request)


@pytest.fixture(scope="module")
def policy() -> Iterator[ScriptedPolicy]:
    with run_policy(script) as server:
        yield server


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    env = {"RELAX_GYM_API_TOKEN": API_TOKEN}
    with start_gateway(ECHO, env=env, extra_args=("--log-level", "debug")) as process:
        yield process


def trial_api(gateway: GatewayProcess, token: str = API_TOKEN) -> httpx.Client:
    return httpx.Client(
        base_url=gateway.url,
        headers={"Authorization": f"Bearer {token}"},
        trust_env=False,
        timeout=SAFETY_S,
    )


def session_body(make_body: Any, policy: ScriptedPolicy, key: str) -> tuple[dict[str, Any], list[str]]:
    """A trial making one chat call through the bridge, and its secrets (each a value of its own)."""
    body = make_body(echo={"model": {"api": "chat", "calls": 1}})
    session_id, header = secret("relax-session-id"), secret("extra-header-value")
    body["session"]["session_id"] = session_id
    body["model_endpoint"].update(base_url=policy.base_url, api_key=key, headers={"X-Relax-Session": header})
    return body, [key, session_id, header]


def run_to_the_end(gateway: GatewayProcess, body: dict[str, Any]) -> dict[str, Any]:
    with trial_api(gateway) as http:
        created = http.post("/v1/trials", json=body)
        assert created.status_code == 202, created.text
        stop = time.monotonic() + SAFETY_S
        while (snapshot := http.get(f"/v1/trials/{body['request_id']}").json())["status"] not in TERMINAL:
            assert time.monotonic() < stop, f"trial never ended: {snapshot}"
            time.sleep(0.05)
    return snapshot


def leaked(gateway: GatewayProcess, values: list[str]) -> list[str]:
    """Which of the values (named by their prefix, never printed whole) the gateway's output holds."""
    text = "\n".join(gateway.output)
    return [value.rsplit("-", 1)[0] for value in values if value in text]


def test_a_retried_5xx_logs_the_retry_but_no_secret(
    gateway: GatewayProcess, policy: ScriptedPolicy, make_body: Any
) -> None:
    policy.clear()
    policy.enqueue(ErrorReply(status=RETRIED_STATUS, message="upstream restarting", type="server_error"))
    key = secret("sk-session-token")
    body, values = session_body(make_body, policy, key)
    snapshot = run_to_the_end(gateway, body)
    assert (snapshot["status"], snapshot["reward"]) == ("completed", 1.0), snapshot
    calls = policy.model_requests("chat/completions")
    assert [call.bearer for call in calls] == [key, key]  # the 503, then its retry
    assert all(call.headers["x-relax-session"] == values[2] for call in calls)
    retried = logged(gateway, "retrying model callback")
    assert retried is not None and f"status={RETRIED_STATUS}" in retried  # the log under test was written
    assert logged(gateway, "model callback finished after retries") is not None
    assert leaked(gateway, values) == []


def test_an_upstream_401_logs_no_secret(
    gateway: GatewayProcess, policy: ScriptedPolicy, make_body: Any
) -> None:
    policy.clear()
    body, values = session_body(make_body, policy, REFUSED_KEY)
    snapshot = run_to_the_end(gateway, body)
    assert (snapshot["status"], snapshot["reward"]) == ("failed", None), snapshot
    (call,) = policy.model_requests("chat/completions")  # a 401 is not retried
    assert call.bearer == REFUSED_KEY
    assert logged(gateway, f"trial run failed request_id={body['request_id']}") is not None
    assert leaked(gateway, values) == []


def test_the_gateways_own_401_logs_neither_token(gateway: GatewayProcess, make_body: Any) -> None:
    body = make_body()
    with trial_api(gateway, WRONG_TOKEN) as http:
        refused = [
            http.post("/v1/trials", json=body),
            http.get(f"/v1/trials/{body['request_id']}"),
            http.post(f"/v1/trials/{body['request_id']}/abort"),
        ]
    assert [answer.status_code for answer in refused] == [401, 401, 401]
    for answer in refused:
        assert WRONG_TOKEN not in answer.text and API_TOKEN not in answer.text
    with trial_api(gateway) as http:
        assert http.post("/v1/trials", json=body).status_code == 202
    assert leaked(gateway, [API_TOKEN, WRONG_TOKEN]) == []
