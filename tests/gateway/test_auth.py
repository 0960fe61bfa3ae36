"""Optional bearer auth on the trial API: RELAX_GYM_API_TOKEN on the gateway and on the client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from relax_gym_core.bridge import CallbackPolicy
from relax_gym_core.errors import ConfigError
from relax_gym_core.gateway import GatewaySettings, create_app, parse_environments

TOKEN = "gw-token-0123456789abcdef"
SPECS = {"echo": {"environment": "echo", "runtime": "echo", "max_concurrency": 2, "queue_capacity": 2}}


@pytest.fixture
def client() -> Iterator[TestClient]:
    settings = GatewaySettings.from_env(
        parse_environments(json.dumps(SPECS), source="test"),
        {"RELAX_GYM_API_TOKEN": TOKEN},
        callback_policy=CallbackPolicy.parse(hosts=[], networks=["127.0.0.1/32"], proxy=None),
    )
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def test_the_trial_api_needs_the_token(client: TestClient, make_body: Any) -> None:
    body = make_body(echo={"sleep_s": 60})
    path = f"/v1/trials/{body['request_id']}"
    for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": TOKEN}):
        refused = client.post("/v1/trials", json=body, headers=headers)
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"] == "Bearer"
        assert refused.json() == {"detail": "missing or wrong API token (Authorization: Bearer ...)"}
        assert TOKEN not in refused.text
    assert client.get(path).status_code == 401
    assert client.post(path + "/abort").status_code == 401
    assert client.get(f"/v1/trajectories?request_id={body['request_id']}").status_code == 401
    good = {"Authorization": f"Bearer {TOKEN}"}
    assert client.post("/v1/trials", json=body, headers=good).status_code == 202
    assert (
        client.get(path, headers={"Authorization": f"bearer {TOKEN}"}).status_code == 200
    )  # scheme: any case
    assert client.post(path + "/abort", headers=good).status_code == 202
    assert client.get(f"/v1/trajectories?request_id={body['request_id']}", headers=good).status_code == 200


def test_probes_scrapers_and_model_calls_do_not_need_it(client: TestClient) -> None:
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
        assert client.get(path).status_code == 200, path
    # A model call is authorised by its trial capability, never by the API token (agents do not hold it).
    assert client.post("/ng-rollout/unknown/v1/chat/completions", json={"messages": []}).status_code == 410


@pytest.mark.parametrize(
    "bad", ["short", "has spaces in the token value", "tab\tseparated-token-value", "é" * 20]
)
def test_a_bad_token_stops_the_gateway_without_echoing_it(bad: str) -> None:
    with pytest.raises(ConfigError, match="RELAX_GYM_API_TOKEN must be 16 to 4096 visible ASCII") as caught:
        GatewaySettings.from_env((), {"RELAX_GYM_API_TOKEN": bad})
    assert bad not in str(caught.value)


def test_the_token_stays_out_of_reprs() -> None:
    settings = GatewaySettings.from_env((), {"RELAX_GYM_API_TOKEN": TOKEN})
    assert settings.api_token == TOKEN
    assert TOKEN not in repr(settings)
    assert GatewaySettings.from_env((), {"RELAX_GYM_API_TOKEN": ""}).api_token is None
