"""Bad text and unknown keys in a create body: clear 4xx answers naming the field, and typos made visible.

The cases: a lone surrogate ("\\udc80") in a string the gateway fingerprints answered 500; a body that is
not UTF-8 answered 422 "unacceptable number"; an unknown top-level key (a typo such as "deadline") was
silently ignored, so the trial ran with the default deadline.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from relax_gym_core.testing.web import GatewayProcess

from .conftest import SAFETY_S, gateway_with, metric


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    with gateway_with() as process:
        yield process


def post(gateway: GatewayProcess, content: bytes) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/v1/trials",
        content=content,
        headers={"Content-Type": "application/json"},
        trust_env=False,
        timeout=SAFETY_S,
    )


def lone_surrogate_in(body: dict[str, Any], *where: str | int) -> bytes:
    target: Any = body
    for key in where[:-1]:
        target = target[key]
    target[where[-1]] = "marker"
    # json.dumps escapes a surrogate as \udc80, as any client serialising a broken string would.
    return json.dumps(body).replace('"marker"', '"bad \\udc80 text"').encode()


@pytest.mark.parametrize(
    ("where", "named"),
    [
        (("environment", "task", "messages", 0, "content"), "environment.task.messages[0].content"),
        (("session", "group_id"), "session.group_id"),
        (("session", "session_id"), "session.session_id"),
        (("metadata", "note"), "metadata.note"),
        (("generation", "sampling_params"), "generation.sampling_params"),
    ],
)
def test_a_lone_surrogate_is_a_422_naming_the_field(
    gateway: GatewayProcess, make_body: Any, where: tuple[str | int, ...], named: str
) -> None:
    body = make_body()
    body.setdefault("generation", {})
    body.setdefault("metadata", {})
    answer = post(gateway, lone_surrogate_in(body, *where))
    assert answer.status_code == 422
    assert answer.json() == {"detail": f"{named} must be valid Unicode (it contains a lone surrogate)"}


def test_raw_surrogate_bytes_are_refused_too(gateway: GatewayProcess, make_body: Any) -> None:
    raw = json.dumps(make_body(), ensure_ascii=False).encode().replace(b'"hi"', b'"\xed\xb2\x80"')
    answer = post(gateway, raw)
    assert (answer.status_code, answer.json()["detail"].split(" ")[0]) == (
        422,
        "environment.task.messages[0].content",
    )


def test_a_surrogate_pair_is_text_not_an_error(gateway: GatewayProcess, make_body: Any) -> None:
    body = make_body()
    body["environment"]["task"]["messages"][0]["content"] = "emoji \U0001f600"
    assert post(gateway, json.dumps(body, ensure_ascii=True).encode()).status_code == 202


@pytest.mark.parametrize("raw", [b'{"request_id": "\xff\xfe"}', b"\x80\x81", b'{"a": "caf\xe9"}'])
def test_a_body_that_is_not_utf8_is_invalid_json(gateway: GatewayProcess, raw: bytes) -> None:
    answer = post(gateway, raw)
    assert (answer.status_code, answer.json()) == (400, {"detail": "request body must be valid JSON (UTF-8)"})


def test_an_unknown_key_is_counted_and_logged_by_name(gateway: GatewayProcess, make_body: Any) -> None:
    before = metric(gateway, "relax_gym_unknown_request_keys_total", location="request")
    endpoint_before = metric(gateway, "relax_gym_unknown_request_keys_total", location="model_endpoint")
    body = make_body(deadline=5)  # meant deadline_s
    body["model_endpoint"]["api_key_headr"] = "X-Key"
    answer = post(gateway, json.dumps(body).encode())
    assert answer.status_code == 202  # additive fields stay wire-compatible...
    assert metric(gateway, "relax_gym_unknown_request_keys_total", location="request") == before + 1
    assert metric(gateway, "relax_gym_unknown_request_keys_total", location="model_endpoint") == (
        endpoint_before + 1
    )
    logged = [line for line in gateway.output if "is not part of relax-nemo-gym/v1" in line]
    assert any("'deadline'" in line for line in logged)  # ...but a typo is visible
    assert any("'model_endpoint.api_key_headr'" in line for line in logged)


def test_refuse_mode_answers_422_naming_the_unknown_keys(make_body: Any) -> None:
    with gateway_with({"RELAX_GYM_UNKNOWN_KEYS": "refuse"}) as gateway:
        body = make_body(deadline=5)
        body["session"]["atempt"] = 2
        answer = post(gateway, json.dumps(body).encode())
        assert (answer.status_code, answer.json()) == (
            422,
            {"detail": "request has unknown keys: deadline, session.atempt (RELAX_GYM_UNKNOWN_KEYS=refuse)"},
        )
        assert post(gateway, json.dumps(make_body()).encode()).status_code == 202
