"""Body caps per route, the capability checked before a model call's body is read, and a large create
parsed off the event loop.

The case: no route had a body limit, and the unauthenticated model-call routes read and parsed a whole
body before looking at its rollout id; a 15 MB create of three million tiny lists held the event loop for
~17 s, so /healthz went unanswered meanwhile.
"""

from __future__ import annotations

import json
import select
from collections.abc import Iterator

import httpx
import pytest

from relax_gym_core.testing.web import GatewayProcess

from .conftest import SAFETY_S, connect, gateway_with, head, read_response

CREATE_CAP = 6 << 20
MODEL_CALL_CAP = 8 << 20
OTHER_CAP = 1024
CAPS = {
    "RELAX_GYM_MAX_CREATE_BYTES": str(CREATE_CAP),
    "RELAX_GYM_MAX_MODEL_CALL_BYTES": str(MODEL_CALL_CAP),
    "RELAX_GYM_MAX_BODY_BYTES": str(OTHER_CAP),
}
UNKNOWN_ROLLOUT = "f" * 32 + "-0"


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    with gateway_with(CAPS) as process:
        yield process


@pytest.mark.parametrize(
    ("path", "cap", "variable"),
    [
        ("/v1/trials", CREATE_CAP, "RELAX_GYM_MAX_CREATE_BYTES"),
        (
            f"/ng-rollout/{UNKNOWN_ROLLOUT}/v1/chat/completions",
            MODEL_CALL_CAP,
            "RELAX_GYM_MAX_MODEL_CALL_BYTES",
        ),
        ("/v1/responses", MODEL_CALL_CAP, "RELAX_GYM_MAX_MODEL_CALL_BYTES"),
        ("/v1/trials/some-trial/renew", OTHER_CAP, "RELAX_GYM_MAX_BODY_BYTES"),
    ],
)
def test_a_declared_length_over_the_cap_is_refused_before_the_body(
    gateway: GatewayProcess, path: str, cap: int, variable: str
) -> None:
    with connect(gateway) as sock:
        # Only the head is sent: an answer proves nothing waited for (or read) the body.
        sock.sendall(head("POST", path, **{"Content-Type": "application/json", "Content-Length": cap + 1}))
        answer = read_response(sock)
    assert answer.status == 413
    assert json.loads(answer.body) == {"detail": f"request body is larger than {cap} bytes ({variable})"}


def test_a_chunked_body_over_the_cap_is_refused_while_it_streams(gateway: GatewayProcess) -> None:
    chunk = b"x" * 65536
    with connect(gateway) as sock:
        sock.sendall(
            head("POST", "/v1/trials", **{"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
        )
        sent = 0
        answered = False
        while sent <= 4 * CREATE_CAP and not answered:
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sent += len(chunk)
            answered = bool(select.select([sock], [], [], 0)[0])
        answer = read_response(sock)
    assert answer.status == 413
    assert b"RELAX_GYM_MAX_CREATE_BYTES" in answer.body
    assert sent < 2 * CREATE_CAP  # refused as the cap was passed, not after everything arrived


def test_a_model_call_capability_is_checked_before_its_body_is_read(gateway: GatewayProcess) -> None:
    path = f"/ng-rollout/{UNKNOWN_ROLLOUT}/v1/messages"
    with connect(gateway) as sock:
        sock.sendall(head("POST", path, **{"Content-Type": "application/json", "Content-Length": 1000}))
        answer = read_response(sock)  # no body was sent: reading it first would wait for it
    assert answer.status == 410
    assert answer.headers["x-should-retry"] == "false"


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b'{"model": "m", "messages": [' + b"[]," * 100_000 + b"[]] " + b"{not json", 404),
        (b'{"metadata": {"relax_gym_rollout": "' + UNKNOWN_ROLLOUT.encode() + b'"}, "x": {not json', 410),
    ],
    ids=["no-capability", "dead-capability"],
)
def test_an_unprefixed_call_without_a_live_capability_is_refused_unparsed(
    gateway: GatewayProcess, body: bytes, status: int
) -> None:
    # Invalid JSON would be a 400 had the body been parsed before the capability was looked for.
    answer = httpx.post(f"{gateway.url}/v1/chat/completions", content=body, trust_env=False, timeout=SAFETY_S)
    assert answer.status_code == status


def test_a_large_create_does_not_stall_the_event_loop(gateway: GatewayProcess, make_body: object) -> None:
    body = make_body()  # type: ignore[operator]
    body["environment"]["task"]["grid"] = [[] for _ in range(1_800_000)]  # ~5.4 MB of tiny lists
    raw = json.dumps(body, separators=(",", ":")).encode()
    assert len(raw) < CREATE_CAP
    with connect(gateway) as sock:
        sock.sendall(
            head("POST", "/v1/trials", **{"Content-Type": "application/json", "Content-Length": len(raw)})
            + raw
        )
        # Validating ~2 million values takes the gateway seconds: /healthz must be answered meanwhile.
        health = httpx.get(f"{gateway.url}/healthz", trust_env=False, timeout=SAFETY_S)
        create_answered_first = bool(select.select([sock], [], [], 0)[0])
        answer = read_response(sock, timeout_s=4 * SAFETY_S)
    assert health.status_code == 200
    assert not create_answered_first
    assert answer.status == 202
