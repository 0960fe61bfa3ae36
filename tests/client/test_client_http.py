"""GatewayClient retry policy over httpx.MockTransport; sleeps are recorded, never waited."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any

import httpx
import pytest

from relax_gym_core.client import TrialGoneError
from relax_gym_core.client.http import retry_after_s
from relax_gym_core.errors import GatewayRequestError, ProtocolError

pytestmark = pytest.mark.anyio

SECRET = "sk-secret-token"


def queue_full(retry_after: str | None = "1") -> httpx.Response:
    headers = {"retry-after": retry_after} if retry_after is not None else {}
    return httpx.Response(429, json={"detail": "environment queue is full"}, headers=headers)


def bodies(gateway: Any, op: str) -> list[bytes]:
    return [request.content for name, request in gateway.calls if name == op]


async def test_transport_error_then_success_resends_the_same_request(
    fake_gateway: Any, make_client: Any, make_request: Any, recorder: Any
) -> None:
    gateway = fake_gateway()
    gateway.script["create"] = [httpx.ConnectError("connection refused")]
    request = make_request()
    async with make_client(gateway.transport()) as client:
        snapshot = await client.create(request)
    assert snapshot.request_id == request.request_id
    sent = bodies(gateway, "create")
    assert len(sent) == 2
    assert sent[0] == sent[1]  # idempotent replay: same request_id, same body
    assert json.loads(sent[0])["request_id"] == request.request_id
    assert recorder.sleeps == [0.25]


async def test_transient_statuses_back_off_exponentially_then_give_up(
    fake_gateway: Any, make_client: Any, recorder: Any
) -> None:
    gateway = fake_gateway()
    gateway.script["get"] = [
        httpx.Response(500),
        httpx.Response(408),
        httpx.Response(502, json={"detail": "upstream gone"}),
    ]
    async with make_client(gateway.transport()) as client:
        with pytest.raises(GatewayRequestError) as caught:
            await client.get("relax-1")
    assert str(caught.value) == (
        "Gateway get request failed with HTTP 502 after 3 attempts (retries exhausted): upstream gone"
    )
    assert (caught.value.status_code, caught.value.detail) == (502, "upstream gone")
    assert gateway.ops() == ["get"] * 3  # max_retries=2 -> 3 attempts
    assert recorder.sleeps == [0.25, 0.5]


async def test_zero_backoff_does_not_sleep(fake_gateway: Any, make_client: Any, recorder: Any) -> None:
    gateway = fake_gateway()
    gateway.script["get"] = [httpx.ReadTimeout("slow")]
    async with make_client(gateway.transport(), retry_backoff_s=0) as client:
        await client.get("relax-1")
    assert recorder.sleeps == []
    assert gateway.ops() == ["get", "get"]


async def test_transport_retries_exhausted(fake_gateway: Any, make_client: Any) -> None:
    gateway = fake_gateway()
    gateway.script["renew"] = [httpx.ConnectError("refused")] * 3
    async with make_client(gateway.transport()) as client:
        with pytest.raises(
            GatewayRequestError, match=r"^Gateway renew request failed after 3 attempts \(ConnectError\)$"
        ):
            await client.renew("relax-1")


async def test_conflict_is_fatal_and_names_what_the_request_id_derives_from(
    fake_gateway: Any, make_client: Any, make_request: Any, recorder: Any
) -> None:
    gateway = fake_gateway()
    gateway.script["create"] = [
        httpx.Response(409, json={"detail": "request_id already exists with a different payload"})
    ]
    request = make_request()
    async with make_client(gateway.transport()) as client:
        with pytest.raises(GatewayRequestError) as caught:
            await client.create(request)
    assert str(caught.value) == (
        "Gateway create request failed with HTTP 409: request_id already exists with a different payload; "
        f"request_id {request.request_id} (derived from RELAX_SESSION_ID, RELAX_SESSION_IO_DIR and "
        "NEMO_GYM_ATTEMPT) is taken on the gateway: relaunch with a new RELAX_SESSION_IO_DIR or a higher "
        "NEMO_GYM_ATTEMPT"
    )
    assert caught.value.status_code == 409
    assert gateway.ops() == ["create"]
    assert recorder.sleeps == []


async def test_a_detail_echoing_the_clients_secrets_is_masked(
    fake_gateway: Any, make_client: Any, make_request: Any, session_id: str
) -> None:
    """A gateway (or something posing as one) that repeats our token or session id does not get it printed."""
    gateway = fake_gateway()
    echoed = f"bad {SECRET} for {session_id}"
    gateway.script["create"] = [httpx.Response(400, json={"detail": echoed})]
    async with make_client(gateway.transport(), api_token=SECRET) as client:
        with pytest.raises(GatewayRequestError) as caught:
            await client.create(make_request())
    assert str(caught.value) == "Gateway create request failed with HTTP 400: bad [redacted] for [redacted]"
    assert caught.value.detail == "bad [redacted] for [redacted]"


async def test_create_waits_out_a_full_queue_beyond_max_retries(
    fake_gateway: Any, make_client: Any, make_request: Any, recorder: Any
) -> None:
    gateway = fake_gateway()
    gateway.script["create"] = [queue_full("2")] * 6
    request = make_request()
    async with make_client(gateway.transport(), max_retries=1) as client:
        snapshot = await client.create(request)
    assert snapshot.request_id == request.request_id
    assert recorder.sleeps == [2.0] * 6  # Retry-After honoured, not 0.25 * 2**n
    assert len(set(bodies(gateway, "create"))) == 1


async def test_create_gives_up_a_full_queue_at_the_startup_timeout(
    fake_gateway: Any, make_client: Any, make_request: Any, recorder: Any
) -> None:
    gateway = fake_gateway()
    gateway.script["create"] = [queue_full("3")] * 100
    async with make_client(gateway.transport(), startup_timeout_s=10) as client:
        with pytest.raises(GatewayRequestError) as caught:
            await client.create(make_request())
    # Attempts at t=0, 3, 6, 9; the next one would start after the 10 s budget.
    assert recorder.sleeps == [3.0, 3.0, 3.0]
    assert str(caught.value) == (
        "Gateway create request failed with HTTP 429 after 4 attempts (retries exhausted): environment queue "
        "is full; raise NEMO_GYM_STARTUP_TIMEOUT_S (startup_timeout_s=10) to wait longer, or the "
        "environment's max_concurrency / queue_capacity on the gateway"
    )


async def test_queue_full_without_retry_after_backs_off_and_never_spins(
    fake_gateway: Any, make_client: Any, make_request: Any, recorder: Any
) -> None:
    gateway = fake_gateway()
    gateway.script["create"] = [queue_full(None)] * 4
    async with make_client(gateway.transport(), retry_backoff_s=0) as client:
        await client.create(make_request())
    assert recorder.sleeps == [0.1] * 4  # floor: a zero back-off must not hammer a full gateway


async def test_create_transport_errors_stay_bounded_by_max_retries(
    fake_gateway: Any, make_client: Any, make_request: Any
) -> None:
    # A read error may come after the gateway saw the request; only refused connections wait longer
    # (test_client_hostile.py).
    gateway = fake_gateway()
    gateway.script["create"] = [httpx.ReadError("reset")] * 5
    async with make_client(gateway.transport()) as client:
        with pytest.raises(GatewayRequestError, match="after 3 attempts"):
            await client.create(make_request())


async def test_create_refused_connections_wait_for_the_gateway(
    fake_gateway: Any, make_client: Any, make_request: Any
) -> None:
    gateway = fake_gateway()
    gateway.script["create"] = [httpx.ConnectError("refused")] * 5
    async with make_client(gateway.transport()) as client:
        await client.create(make_request())
    assert gateway.ops().count("create") == 6


async def test_service_unavailable_retry_after_is_honoured(
    fake_gateway: Any, make_client: Any, recorder: Any
) -> None:
    gateway = fake_gateway()
    gateway.script["get"] = [httpx.Response(503, headers={"retry-after": "1.5"})]
    async with make_client(gateway.transport()) as client:
        await client.get("relax-1")
    assert recorder.sleeps == [1.5]


def test_retry_after_parsing() -> None:
    def parse(value: str) -> float | None:
        return retry_after_s(httpx.Response(429, headers={"retry-after": value}), now=lambda: 1_000_000.0)

    assert parse("7") == 7.0
    assert parse("-3") == 0.0
    assert parse("99999") == 60.0  # a gateway cannot park a client indefinitely
    assert parse("soon") is None
    date = format_datetime(datetime.fromtimestamp(1_000_012, tz=UTC), usegmt=True)
    assert parse(date) == 12.0
    assert retry_after_s(httpx.Response(429)) is None


async def test_abort_is_one_attempt_without_body(fake_gateway: Any, make_client: Any, recorder: Any) -> None:
    gateway = fake_gateway()
    gateway.script["abort"] = [httpx.Response(503, headers={"retry-after": "1"})]
    async with make_client(gateway.transport()) as client:
        with pytest.raises(GatewayRequestError, match=r"^Gateway abort request failed with HTTP 503$"):
            await client.abort("relax-1")
        gateway.script["abort"] = [httpx.ConnectError("refused")]
        with pytest.raises(GatewayRequestError, match=r"^Gateway abort request failed \(ConnectError\)$"):
            await client.abort("relax-1")
        snapshot = await client.abort("relax-1")
    assert snapshot.request_id == "relax-1"
    assert gateway.ops() == ["abort"] * 3
    assert recorder.sleeps == []
    assert all(request.content == b"" for _, request in gateway.calls)


async def test_renew_sends_no_body(fake_gateway: Any, make_client: Any) -> None:
    gateway = fake_gateway()
    async with make_client(gateway.transport()) as client:
        await client.renew("relax-1")
    ((_, request),) = gateway.calls
    assert (request.method, request.url.path, request.content) == ("POST", "/v1/trials/relax-1/renew", b"")


async def test_retry_until_outlasts_max_retries(fake_gateway: Any, make_client: Any, recorder: Any) -> None:
    gateway = fake_gateway()
    gateway.script["renew"] = [httpx.ConnectError("refused")] * 8
    async with make_client(gateway.transport(), retry_backoff_s=0) as client:
        await client.renew("relax-1", retry_until=recorder.now + 60)
    assert gateway.ops() == ["renew"] * 9
    assert recorder.sleeps == [0.1] * 8


async def test_retry_until_gives_up_at_the_deadline(
    fake_gateway: Any, make_client: Any, recorder: Any
) -> None:
    gateway = fake_gateway()
    gateway.script["get"] = [httpx.Response(503)] * 100
    start = recorder.now
    async with make_client(gateway.transport()) as client:
        with pytest.raises(GatewayRequestError, match="HTTP 503 after"):
            await client.get("relax-1", retry_until=start + 10)
    assert recorder.now < start + 10
    assert sum(recorder.sleeps) == recorder.now - start
    assert max(recorder.sleeps) <= 2.0  # capped back-off keeps the last try near the deadline
    assert recorder.now > start + 8


async def test_not_found_and_expired(fake_gateway: Any, make_client: Any) -> None:
    gateway = fake_gateway()
    gateway.script["get"] = [
        httpx.Response(404, json={"detail": "trial not found"}),
        httpx.Response(404, json={"detail": "trial expired: its terminal record was evicted"}),
    ]
    async with make_client(gateway.transport()) as client:
        with pytest.raises(TrialGoneError) as missing:
            await client.get("relax-1")
        with pytest.raises(TrialGoneError) as expired:
            await client.get("relax-1")
    assert (missing.value.expired, expired.value.expired) == (False, True)
    assert str(missing.value) == (
        "Gateway get request failed with HTTP 404: trial not found; the trial was lost or has expired (the "
        "gateway keeps finished trials for its RELAX_GYM_TRIAL_RETENTION_S), or NEMO_GYM_URL points at "
        "another gateway"
    )
    assert str(expired.value) == (
        "Gateway get request failed with HTTP 404: trial expired: its terminal record was evicted; the "
        "gateway keeps finished trials for its RELAX_GYM_TRIAL_RETENTION_S"
    )
    assert gateway.ops() == ["get", "get"]  # 404 is not retried


async def test_bad_responses_are_protocol_errors(
    fake_gateway: Any, make_client: Any, snapshot_json: Any
) -> None:
    gateway = fake_gateway()
    gateway.script["get"] = [
        httpx.Response(200, text="<html>proxy</html>"),
        httpx.Response(200, json=snapshot_json("relax-other")),
        httpx.Response(200, json=snapshot_json("relax-1", "sleeping")),
    ]
    async with make_client(gateway.transport()) as client:
        with pytest.raises(ProtocolError, match=r"^Gateway returned a non-JSON response to the get request$"):
            await client.get("relax-1")
        with pytest.raises(ProtocolError, match="request_id does not match"):
            await client.get("relax-1")
        with pytest.raises(ProtocolError, match="status"):
            await client.get("relax-1")


async def test_health(fake_gateway: Any, make_client: Any) -> None:
    gateway = fake_gateway(epoch="abc")
    async with make_client(gateway.transport()) as client:
        health = await client.health()
        gateway.script["health"] = [httpx.Response(404, json={"detail": "Not Found"})]
        with pytest.raises(
            GatewayRequestError, match=r"^Gateway health request failed with HTTP 404: Not Found$"
        ):
            await client.health()
    assert health.service_epoch == "abc"
