"""/openapi.json describes every route, every answer and the wire types' own rules (tests/hostile fuzzes a
real gateway from it)."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
from starlette.testclient import TestClient

from relax_gym_core.bridge import CallbackPolicy
from relax_gym_core.errors import ProtocolError
from relax_gym_core.gateway import GatewaySettings, create_app, parse_environments
from relax_gym_core.protocol import parse_create_request

ECHO = {"echo": {"environment": "echo", "runtime": "echo", "max_deadline_s": 900}}
TOKEN = "openapi-token-0123456789"


def document(**settings: Any) -> dict[str, Any]:
    gateway_settings = GatewaySettings(
        environments=parse_environments(json.dumps(ECHO), source="test"),
        callback_policy=CallbackPolicy.parse(hosts=[], networks=["127.0.0.1/32"], proxy=None),
        **settings,
    )
    with TestClient(create_app(gateway_settings)) as client:
        doc: dict[str, Any] = client.get("/openapi.json").json()
        return doc


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return document()


def schema(doc: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = doc["components"]["schemas"][name]
    return found


def test_every_route_is_described(doc: dict[str, Any]) -> None:
    assert set(doc["paths"]) == {
        "/v1/trials",
        "/v1/trials/{request_id}",
        "/v1/trials/{request_id}/renew",
        "/v1/trials/{request_id}/abort",
        "/v1/trials/{request_id}/trajectory",
        "/v1/trajectories",
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
        "/ng-rollout/{rollout_id}/api/hello",
        *(f"/ng-rollout/{{rollout_id}}/v1/{r}" for r in ("chat/completions", "responses", "messages")),
        *(f"/v1/{r}" for r in ("chat/completions", "responses", "messages")),
    }
    call = doc["paths"]["/v1/messages"]["post"]["responses"]
    assert {"200", "400", "404", "410", "413", "422", "502", "default"} <= set(call)
    assert set(doc["paths"]["/v1/trials"]["post"]["responses"]) == {
        "202", "400", "409", "413", "422", "429", "503",
    }  # fmt: skip
    assert "text/plain" in doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]


def test_the_401s_and_the_bearer_scheme_appear_with_a_token_only(doc: dict[str, Any]) -> None:
    assert "securitySchemes" not in doc["components"]
    guarded = document(api_token=TOKEN)
    assert guarded["components"]["securitySchemes"] == {"bearer": {"type": "http", "scheme": "bearer"}}
    for path, operations in guarded["paths"].items():
        for operation in operations.values():
            trial_api = path.startswith("/v1/trials") or path == "/v1/trajectories"
            assert ("401" in operation["responses"]) is trial_api, path
            assert ("security" in operation) is trial_api, path


def test_the_field_rules_are_published(doc: dict[str, Any]) -> None:
    create = schema(doc, "CreateTrialRequest")
    assert create["required"] == [
        "protocol_version", "request_id", "session", "environment", "model_endpoint", "interrupt_policy",
    ]  # fmt: skip
    props = create["properties"]
    assert props["protocol_version"]["enum"] == ["relax-nemo-gym/v1"]
    assert (
        props["request_id"].items()
        >= {"minLength": 1, "maxLength": 256, "pattern": "^(?:[A-Za-z0-9._~-]+)$"}.items()
    )
    assert props["deadline_s"] == {"type": "number", "exclusiveMinimum": 0, "maximum": 900.0}
    assert props["lease_s"] == {"type": "number", "exclusiveMinimum": 0}
    assert props["interrupt_policy"]["enum"] == ["protected", "interruptible", "resumable"]
    assert schema(doc, "SessionInfo")["properties"]["attempt"] == {"type": "integer", "minimum": 1}
    environment = schema(doc, "EnvironmentRef")["properties"]
    assert (environment["name"]["enum"], environment["config"]["enum"]) == (["echo"], ["echo"])
    endpoint = schema(doc, "ModelEndpoint")["properties"]
    assert "pattern" in endpoint["api_key"] and "pattern" in endpoint["base_url"]
    assert set(endpoint["headers"]) >= {"propertyNames", "additionalProperties"}
    path_id = doc["paths"]["/v1/trials/{request_id}"]["get"]["parameters"][0]["schema"]
    assert path_id["pattern"] == props["request_id"]["pattern"]


def test_unknown_keys_are_closed_off_only_when_refused(doc: dict[str, Any]) -> None:
    assert "additionalProperties" not in schema(doc, "CreateTrialRequest")
    strict = document(unknown_keys="refuse")
    assert schema(strict, "CreateTrialRequest")["additionalProperties"] is False


def test_the_create_example_is_a_trial_this_gateway_accepts(doc: dict[str, Any]) -> None:
    example = doc["paths"]["/v1/trials"]["post"]["requestBody"]["content"]["application/json"]["example"]
    settings = GatewaySettings(
        environments=parse_environments(json.dumps(ECHO), source="test"),
        callback_policy=CallbackPolicy.parse(hosts=[], networks=["127.0.0.1/32"], proxy=None),
    )
    with TestClient(create_app(settings)) as client:
        assert client.post("/v1/trials", json=example).status_code == 202


def matches(pattern: str, value: str) -> bool:
    """JSON Schema (ECMA-262) semantics: a final `$` is the end of the text (Python's also allows a "\\n")."""
    return re.search(pattern[:-1] + r"\Z" if pattern.endswith("$") else pattern, value) is not None


# Each published pattern must say what its validator says: sample values are run through both.
SAMPLES = [
    "sk-1", "a b", " lead", "trail ", "tab\tin", "ctl\x01", "nul\x00", "nl\n", "é", "", "   ", "Bearer ",
    "X-Header", "Bad Header", "x/y", "ok.id~1", "http://h", "HTTPS://h:1/p", "ftp://h",
]  # fmt: skip
FIELDS = [
    ("CreateTrialRequest", "request_id", ("request_id",)),
    ("SessionInfo", "group_id", ("session", "group_id")),
    ("ModelEndpoint", "api_key", ("model_endpoint", "api_key")),
    ("ModelEndpoint", "api_key_prefix", ("model_endpoint", "api_key_prefix")),
    ("ModelEndpoint", "api_key_header", ("model_endpoint", "api_key_header")),
    ("ModelEndpoint", "model", ("model_endpoint", "model")),
]


@pytest.fixture
def base_body(make_body: Any) -> dict[str, Any]:
    body: dict[str, Any] = make_body()
    return body


@pytest.mark.parametrize(("component", "field", "where"), FIELDS)
def test_published_patterns_agree_with_the_validators(
    doc: dict[str, Any], base_body: dict[str, Any], component: str, field: str, where: tuple[str, ...]
) -> None:
    pattern = schema(doc, component)["properties"][field]["pattern"]
    for value in SAMPLES:
        body = copy.deepcopy(base_body)
        target = body
        for key in where[:-1]:
            target = target[key]
        target[where[-1]] = value
        try:
            parse_create_request(json.dumps(body))
            accepted = True
        except ProtocolError:
            accepted = False
        assert accepted == matches(pattern, value), (field, value)


def test_header_value_rules_agree_with_the_validator(doc: dict[str, Any], base_body: dict[str, Any]) -> None:
    rule = schema(doc, "ModelEndpoint")["properties"]["headers"]["additionalProperties"]["pattern"]
    for value in SAMPLES:
        body = copy.deepcopy(base_body)
        body["model_endpoint"]["headers"] = {"X-Extra": value}
        try:
            parse_create_request(json.dumps(body))
            accepted = True
        except ProtocolError:
            accepted = False
        assert accepted == matches(rule, value), value
