"""GatewayClient.next_snapshot: long polls (``?wait_s=``) where the gateway offers them, learned from its
first answer (which asks for one interval; later ones for 30 s, answered at the change anyway); where not
(the reference gateway ignores the parameter), a sleep then a GET per interval, as the client always
polled."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from relax_gym_core.client import ClientOptions, GatewayClient
from relax_gym_core.protocol import WAITED_HEADER

from .conftest import snapshot_body

pytestmark = pytest.mark.anyio


class Gateway:
    """Answers each GET "running" until the third, then "completed"; `waits`: it marks long polls."""

    def __init__(self, *, waits: bool) -> None:
        self.waits = waits
        self.requests: list[httpx.Request] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        done = len(self.requests) >= 3
        body = snapshot_body("r-1", "completed", reward=1.0) if done else snapshot_body("r-1")
        headers = {WAITED_HEADER: "1"} if self.waits and "wait_s" in request.url.params else {}
        return httpx.Response(200, json=body, headers=headers)


@pytest.mark.parametrize("waits", [True, False], ids=["long-poll", "reference"])
async def test_the_client_long_polls_where_offered_and_sleeps_where_not(waits: bool) -> None:
    fake = Gateway(waits=waits)
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    client = GatewayClient(
        "http://gateway.test",
        options=ClientOptions(poll_interval_s=2.0),
        transport=httpx.MockTransport(fake.handler),
        sleep=sleep,
    )
    statuses: list[str] = []
    async with client:
        while not statuses or statuses[-1] != "completed":
            statuses.append((await client.next_snapshot("r-1")).status.value)
    queries = [request.url.query.decode() for request in fake.requests]
    if waits:  # each poll is one long poll, and nobody sleeps
        assert statuses == ["running", "running", "completed"]
        assert queries == ["wait_s=2", "wait_s=30", "wait_s=30"] and slept == []
    else:  # learned from the first answer; then a sleep and a plain GET per interval
        assert statuses == ["running", "completed"]
        assert queries == ["wait_s=2", "", ""]
        assert len(slept) == 2 and slept[1] == 2.0


async def test_a_terminal_answer_is_returned_even_from_a_gateway_that_does_not_wait() -> None:
    requests: list[Any] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(200, json=snapshot_body("r-2", "completed", reward=1.0))

    async def sleep(_seconds: float) -> None:
        raise AssertionError("nothing left to wait for")

    transport = httpx.MockTransport(handler)
    async with GatewayClient("http://gateway.test", transport=transport, sleep=sleep) as client:
        assert (await client.next_snapshot("r-2")).status.value == "completed"
    assert len(requests) == 1


async def test_settled_never_asks_to_wait_past_its_timeout() -> None:
    """Its long polls wait at most half of what is left of `timeout_s` (the answer has as long again to
    arrive), so the TimeoutError comes on time."""
    queries: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        queries.append(request.url.query.decode())
        cleanup = "confirmed" if len(queries) >= 4 else "pending"
        body = snapshot_body("r-3", "completed", reward=1.0, cleanup=cleanup)
        return httpx.Response(200, json=body, headers={WAITED_HEADER: "1"})

    now = [0.0]
    transport = httpx.MockTransport(handler)
    async with GatewayClient("http://gateway.test", transport=transport, clock=lambda: now[0]) as client:
        await client.next_snapshot("r-3")  # learns that this gateway waits
        now[0] = 100.0
        snapshot = await client.settled("r-3", timeout_s=5)
        assert snapshot.cleanup is not None and snapshot.cleanup.value == "confirmed"
    assert queries == ["wait_s=1"] + ["wait_s=2.5"] * 3
