"""Capability lifetime against real back-off, and proxies: abort cancels a waiting retry without another
attempt, and environment proxy variables are never used."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from relax_gym_core.testing import reply_error
from relax_gym_core.testing.web import ScriptedPolicy


def test_abort_cancels_the_back_off_without_another_attempt(gateway: Any, policy: ScriptedPolicy) -> None:
    policy.enqueue(reply_error(503, "router restarting"))  # retried after 1 s of back-off...
    trial = gateway.create_trial(policy.base_url)
    url = f"{gateway.url}/ng-rollout/{trial.rollout_id}/v1/chat/completions"
    with httpx.Client(trust_env=False, timeout=60) as client:
        answer: list[httpx.Response] = []
        thread = threading.Thread(target=lambda: answer.append(client.post(url, json={"messages": []})))
        thread.start()
        policy.wait_for_requests(1)
        gateway.abort(trial)  # ...but the trial is aborted during the back-off
        thread.join(60)
    assert answer[0].status_code == 410
    assert answer[0].headers["x-should-retry"] == "false"
    time.sleep(1.5)  # not a timing assertion: had the back-off survived, a second attempt would now exist
    assert len(policy.model_requests("chat/completions")) == 1


def test_environment_proxies_are_ignored(
    gateway_factory: Any, policy: ScriptedPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # nothing listens there: using it would fail
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    gateway = gateway_factory()
    trial = gateway.create_trial(policy.base_url)
    url = f"{gateway.url}/ng-rollout/{trial.rollout_id}/v1/chat/completions"
    response = httpx.post(url, json={"messages": []}, trust_env=False, timeout=60)
    assert response.status_code == 200
    assert len(policy.model_requests("chat/completions")) == 1


def test_token_refresh_on_replay_is_used_by_later_calls(
    gateway: Any, policy: ScriptedPolicy, make_body: Any
) -> None:
    body = make_body(
        echo={"sleep_s": 600},
        model_endpoint={"base_url": policy.base_url, "api_key": "token-before", "model": "m"},
    )
    assert gateway.http.post("/v1/trials", json=body).status_code == 202
    refreshed = {**body, "model_endpoint": {**body["model_endpoint"], "api_key": "token-after"}}
    assert gateway.http.post("/v1/trials", json=refreshed).status_code == 202  # same trial, not a conflict
    rollout_id = gateway.rollout_id(body["request_id"])
    url = f"{gateway.url}/ng-rollout/{rollout_id}/v1/chat/completions"
    assert httpx.post(url, json={"messages": []}, trust_env=False, timeout=60).status_code == 200
    assert [request.bearer for request in policy.model_requests("chat/completions")] == ["token-after"]
    gateway.http.post(f"/v1/trials/{body['request_id']}/abort")
