"""Every bridged model call reaches the observers once, with the trial it belongs to, the status it ended with
and the upstream attempts it took; calls that name no live trial are observed too, without a trial."""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from relax_gym_core.observe import TrialEvent
from relax_gym_core.testing import RecordingObserver, reply_error, reply_text
from relax_gym_core.testing.web import ScriptedPolicy


def test_calls_and_transitions_are_observed(gateway_factory: Any, policy: ScriptedPolicy) -> None:
    seen = RecordingObserver()
    gateway = gateway_factory(observers=(seen,))
    trial = gateway.create_trial(policy.base_url)
    url = f"{gateway.url}/ng-rollout/{trial.rollout_id}/v1/chat/completions"
    policy.enqueue(reply_text("hello"))
    policy.enqueue(reply_error(400, "too long", code="context_length_exceeded"))
    assert httpx.post(url, json={"messages": []}, trust_env=False, timeout=60).status_code == 200
    assert httpx.post(url, json={"messages": []}, trust_env=False, timeout=60).status_code == 400
    gone = f"{gateway.url}/ng-rollout/no-such-rollout/v1/messages"
    assert httpx.post(gone, json={"messages": []}, trust_env=False, timeout=60).status_code == 410
    calls = seen.callbacks
    assert [(c.request_id, c.environment, c.resource, c.status, c.attempts) for c in calls] == [
        (trial.request_id, "echo", "chat/completions", 200, 1),
        (trial.request_id, "echo", "chat/completions", 400, 1),
        ("", "", "messages", 410, 0),
    ]
    assert all(c.seconds >= 0 for c in calls)
    assert trial.rollout_id not in repr(calls) and trial.token not in repr(calls)
    assert seen.events_of(trial.request_id)[:2] == [TrialEvent.QUEUED, TrialEvent.RUNNING]


def test_retried_calls_count_their_attempts(gateway_factory: Any, policy: ScriptedPolicy) -> None:
    seen = RecordingObserver()
    gateway = gateway_factory(observers=(seen,))
    trial = gateway.create_trial(policy.base_url)
    policy.enqueue(reply_error(503, "busy"))  # retried after a 1 s back-off
    policy.enqueue(reply_text("hello"))
    url = f"{gateway.url}/ng-rollout/{trial.rollout_id}/v1/chat/completions"
    assert httpx.post(url, json={"messages": []}, trust_env=False, timeout=60).status_code == 200
    assert [(c.status, c.attempts) for c in seen.callbacks] == [(200, 2)]


def test_model_calls_reach_the_metrics(gateway_factory: Any, policy: ScriptedPolicy) -> None:
    gateway = gateway_factory()
    trial = gateway.create_trial(policy.base_url)
    policy.enqueue(reply_text("hello"))
    url = f"{gateway.url}/ng-rollout/{trial.rollout_id}/v1/chat/completions"
    assert httpx.post(url, json={"messages": []}, trust_env=False, timeout=60).status_code == 200
    gone = f"{gateway.url}/ng-rollout/no-such-rollout/v1/responses"
    assert httpx.post(gone, json={"input": []}, trust_env=False, timeout=60).status_code == 410
    text = gateway.http.get("/metrics").text
    found = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    env = (("config", "echo"), ("environment", "echo"))
    none = (("config", "none"), ("environment", "none"))
    assert (
        found[("relax_gym_model_calls_total", (("code", "200"), *env, ("resource", "chat/completions")))] == 1
    )
    assert found[("relax_gym_model_calls_total", (("code", "410"), *none, ("resource", "responses")))] == 1
    assert found[("relax_gym_model_call_seconds_count", (*env, ("resource", "chat/completions")))] == 1
    assert trial.rollout_id not in text and trial.token not in text
