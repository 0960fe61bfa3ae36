"""GET /metrics: Prometheus text with trial counts by status and cleanup outcome, phase times, admission
gauges read at scrape time, and nothing that identifies a trial or carries a token."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from relax_gym_core.gateway import GatewaySettings, create_app, parse_environments

from .test_gateway_app import terminal, wait_for

SPECS = {"echo": {"environment": "echo", "runtime": "echo", "max_concurrency": 1, "queue_capacity": 4}}
ECHO = {"environment": "echo", "config": "echo"}


@pytest.fixture
def client() -> Iterator[TestClient]:
    settings = GatewaySettings(
        environments=parse_environments(json.dumps(SPECS), source="test"),
        scan_interval_s=0.01,
        cleanup_grace_s=5,
    )
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def samples(client: TestClient) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return found.get((name, frozenset({**ECHO, **labels}.items())), 0.0)


def test_counts_phases_and_gauges(client: TestClient, make_body: Any) -> None:
    done = make_body(echo={"reward": 1.0})
    client.post("/v1/trials", json=done)
    wait_for(client, done["request_id"], terminal)
    running = make_body(echo={"sleep_s": 60})
    queued = make_body(echo={"sleep_s": 60})
    client.post("/v1/trials", json=running)
    client.post("/v1/trials", json=queued)
    wait_for(client, running["request_id"], lambda s: s["status"] == "running")

    live = samples(client)
    assert value(live, "relax_gym_trials_queued") == 1
    assert value(live, "relax_gym_trials_running") == 1
    assert value(live, "relax_gym_slots_held") == 1
    assert value(live, "relax_gym_max_concurrency") == 1

    client.post(f"/v1/trials/{queued['request_id']}/abort")
    client.post(f"/v1/trials/{running['request_id']}/abort")
    wait_for(client, running["request_id"], terminal)
    wait_for(client, queued["request_id"], terminal)
    after = samples(client)
    assert value(after, "relax_gym_trials_created_total") == 3
    assert value(after, "relax_gym_trials_finished_total", status="completed") == 1
    assert value(after, "relax_gym_trials_finished_total", status="aborted") == 2
    assert value(after, "relax_gym_trial_cleanups_total", outcome="confirmed") == 3
    assert value(after, "relax_gym_trial_phase_seconds_count", phase="queued") == 3
    assert value(after, "relax_gym_trial_phase_seconds_count", phase="running") == 2  # done + running
    assert value(after, "relax_gym_trial_phase_seconds_count", phase="cancelling") == 1
    assert value(after, "relax_gym_trials_running") == 0
    assert value(after, "relax_gym_slots_held") == 0


def test_metrics_name_no_trial_and_no_token(client: TestClient, make_body: Any) -> None:
    body = make_body()
    client.post("/v1/trials", json=body)
    wait_for(client, body["request_id"], terminal)
    text = client.get("/metrics").text
    for secret in (body["request_id"], "sk-secret-token", "session-secret-token"):
        assert secret not in text
