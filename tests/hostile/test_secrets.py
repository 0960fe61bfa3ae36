"""A secret never reaches a log, an error or an output.

The case: a control character in `model_endpoint.api_key` (or its prefix, or an extra header's value) was
accepted with 202; every bridged model call of the trial then failed with 500, and the gateway logged the
HTTP client's "ValueError: Invalid header value: Bearer <the key>". Such values are refused at create,
naming the field and never the value; and no error the gateway did not expect is logged with its message.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from relax_gym_core.bridge import Forwarder, UpstreamReply
from relax_gym_core.errors import UpstreamError
from relax_gym_core.testing.web import GatewayProcess, serve_in_thread
from relax_gym_core.web import contain_errors

from .conftest import SAFETY_S, gateway_with

SECRET = "sk-live-0123456789abcdef"

# Each is something no HTTP client sends as a header value unchanged.
BAD_VALUES = {
    "control": f"{SECRET}\x01",
    "nul": f"{SECRET}\x00tail",
    "newline": f"{SECRET}\nX-Injected: 1",
    "delete": f"{SECRET}\x7f",
    "non-ascii": f"{SECRET}é",
    "trailing space": f"{SECRET} ",
}


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    with gateway_with() as process:
        yield process


def endpoint_with(make_body: Any, field: str, value: str) -> dict[str, Any]:
    body = make_body(echo={"model": {"api": "chat", "calls": 1}})
    endpoint = body["model_endpoint"]
    if field == "headers":
        endpoint["headers"] = {"X-Session": value}
    else:
        endpoint[field] = value
    return body


@pytest.mark.parametrize("kind", sorted(BAD_VALUES))
@pytest.mark.parametrize(
    ("field", "named"),
    [
        ("api_key", "model_endpoint.api_key"),
        ("api_key_prefix", "model_endpoint.api_key_prefix"),
        ("headers", "model_endpoint.headers['X-Session']"),
    ],
)
def test_a_value_no_header_can_carry_is_refused_at_create_without_echo(
    gateway: GatewayProcess, make_body: Any, field: str, named: str, kind: str
) -> None:
    value = BAD_VALUES[kind]
    if field == "api_key_prefix" and kind == "trailing space":
        value = f" {SECRET}"  # a prefix may end in a space ("Bearer "); it may not start with one
    body = endpoint_with(make_body, field, value)
    answer = httpx.post(f"{gateway.url}/v1/trials", json=body, trust_env=False, timeout=SAFETY_S)
    assert answer.status_code == 422
    detail = answer.json()["detail"]
    assert detail.startswith(named + " must be printable ASCII")
    assert SECRET not in answer.text
    assert not any(SECRET in line for line in gateway.output)


def test_a_valid_key_with_inner_spaces_and_a_custom_prefix_is_accepted(
    gateway: GatewayProcess, make_body: Any
) -> None:
    body = make_body()
    body["model_endpoint"].update(api_key="key with\tinner space", api_key_prefix="Token ")
    body["model_endpoint"]["headers"] = {"X-Empty": "", "X-Plain": "a b"}
    answer = httpx.post(f"{gateway.url}/v1/trials", json=body, trust_env=False, timeout=SAFETY_S)
    assert answer.status_code == 202, answer.text


class _RefusingClient:
    """An upstream HTTP client that refuses the request the way pyreqwest/httpx do: quoting the value."""

    async def post(
        self, url: str, *, headers: dict[str, str], body: bytes, timeout_s: float
    ) -> UpstreamReply:
        raise ValueError(f"Invalid header value: {headers['Authorization']}")

    async def close(self) -> None:
        return None


@pytest.mark.anyio
async def test_an_http_client_refusal_is_reported_without_its_message(
    caplog: pytest.LogCaptureFixture,
) -> None:
    forwarder = Forwarder(_RefusingClient())
    with caplog.at_level(logging.DEBUG), pytest.raises(UpstreamError) as info:
        await forwarder.forward(
            "http://127.0.0.1:9/v1/chat/completions",
            headers={"Authorization": f"Bearer {SECRET}"},
            body=b"{}",
            remaining_s=5,
            label="request_id=r1 resource=chat/completions",
        )
    assert str(info.value) == "Upstream model callback could not be sent"
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert "ValueError" in caplog.text
    assert SECRET not in caplog.text


def _explode(_request: Request) -> Response:
    raise ValueError(f"Invalid header value: Bearer {SECRET}")


def test_an_unexpected_error_is_logged_without_its_message(caplog: pytest.LogCaptureFixture) -> None:
    # A real server: uvicorn itself logs whatever an app lets escape, with its message.
    app = Starlette(routes=[Route("/boom", _explode)])
    app.add_middleware(contain_errors)
    with caplog.at_level(logging.DEBUG), serve_in_thread(app) as server:
        answer = httpx.get(f"{server.url}/boom", trust_env=False, timeout=SAFETY_S)
    assert (answer.status_code, answer.json()) == (500, {"detail": "internal error"})
    assert "unhandled error in the gateway: ValueError (message withheld)" in caplog.text
    assert "_explode" in caplog.text  # where it happened is kept
    assert SECRET not in caplog.text
    assert "Exception in ASGI application" not in caplog.text


def test_the_session_token_and_key_never_reach_the_gateway_output(
    gateway: GatewayProcess, make_body: Any
) -> None:
    body = make_body(echo={"fail": True})
    body["session"]["session_id"] = f"session-{SECRET}"
    body["model_endpoint"]["api_key"] = SECRET
    created = httpx.post(f"{gateway.url}/v1/trials", json=body, trust_env=False, timeout=SAFETY_S)
    assert created.status_code == 202
    refused = copy.deepcopy(body)
    refused["deadline_s"] = "soon"
    answer = httpx.post(f"{gateway.url}/v1/trials", json=refused, trust_env=False, timeout=SAFETY_S)
    assert answer.status_code == 422
    assert SECRET not in answer.text + created.text
    assert not any(SECRET in line for line in gateway.output)
