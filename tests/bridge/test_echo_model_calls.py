"""The echo environment can call its model through the bridge (end to end through a real gateway)."""

from __future__ import annotations

import time

import httpx
import pytest

from relax_gym_core.testing.web import ScriptedPolicy, start_gateway

ECHO = {"echo": {"environment": "echo", "runtime": "echo", "max_concurrency": 4, "queue_capacity": 4}}


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_echo_trial_calls_its_model_through_the_bridge(api: str) -> None:
    with ScriptedPolicy() as policy, start_gateway(ECHO) as gateway:
        body = {
            "protocol_version": "relax-nemo-gym/v1",
            "request_id": f"echo-model-{api}",
            "session": {"session_id": "s", "group_id": "g", "rollout_mode": "train"},
            "environment": {
                "name": "echo",
                "config": "echo",
                "task": {
                    "messages": [{"role": "user", "content": "hello"}],
                    "metadata": {"echo": {"model": {"api": api, "calls": 2}, "reward": 0.5}},
                },
            },
            "model_endpoint": {"base_url": policy.base_url, "api_key": "trial-token", "model": "alias"},
            "interrupt_policy": "protected",
        }
        assert httpx.post(f"{gateway.url}/v1/trials", json=body, trust_env=False).status_code == 202
        stop = time.monotonic() + 60
        snapshot = httpx.get(f"{gateway.url}/v1/trials/{body['request_id']}", trust_env=False).json()
        while snapshot["status"] in ("queued", "running") and time.monotonic() < stop:
            time.sleep(0.05)
            snapshot = httpx.get(f"{gateway.url}/v1/trials/{body['request_id']}", trust_env=False).json()
    outcome = (snapshot["status"], snapshot["reward"], snapshot["metrics"]["model_calls"])
    assert outcome == ("completed", 0.5, 2)
    calls = [request for request in policy.requests if request.resource is not None]
    assert len(calls) == 2
    assert {request.bearer for request in calls} == {"trial-token"}
    assert {request.model for request in calls} == {"alias"}
