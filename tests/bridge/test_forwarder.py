"""Retry, budget and transport rules of the upstream forwarder, against a real local HTTP server."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import pytest
from aiohttp import web

from relax_gym_core.bridge import UPSTREAM_CLIENTS, Forwarder, UpstreamReply
from relax_gym_core.bridge.upstream import RENDERING_ERROR
from relax_gym_core.errors import UpstreamError

pytestmark = pytest.mark.anyio


class Upstream:
    """A real aiohttp server answering from a list of (status, body) and recording what it got."""

    def __init__(self) -> None:
        self.replies: list[tuple[int, Any]] = []
        self.default: tuple[int, Any] = (200, {"ok": True})
        self.seen: list[tuple[bytes, dict[str, str]]] = []
        self.hang = asyncio.Event()
        self.url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((await request.read(), dict(request.headers)))
        status, body = self.replies.pop(0) if self.replies else self.default
        if body == "hang":
            await self.hang.wait()
        if isinstance(body, str):
            return web.Response(status=status, text=body, content_type="text/html")
        return web.json_response(body, status=status)


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    server = Upstream()
    app = web.Application(client_max_size=64 * 1024 * 1024)  # long agent contexts
    app.router.add_post("/{tail:.*}", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    server.url = f"http://127.0.0.1:{port}/agentic_api/v1/chat/completions"
    yield server
    server.hang.set()
    await runner.cleanup()


class FakeTime:
    """Back-off sleeps advance a fake clock instead of waiting."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class RecordingClient:
    """Wraps a real upstream client to record the per-attempt timeout it was given."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.timeouts: list[float] = []

    async def post(
        self, url: str, *, headers: Mapping[str, str], body: bytes, timeout_s: float
    ) -> UpstreamReply:
        self.timeouts.append(timeout_s)
        reply: UpstreamReply = await self.inner.post(url, headers=headers, body=body, timeout_s=timeout_s)
        return reply

    async def close(self) -> None:
        await self.inner.close()


@pytest.fixture(params=sorted(UPSTREAM_CLIENTS))
async def make_forwarder(
    request: pytest.FixtureRequest,
) -> AsyncIterator[Callable[..., tuple[Forwarder, Any, Any]]]:
    clients: list[RecordingClient] = []

    def make(**kwargs: Any) -> tuple[Forwarder, FakeTime, RecordingClient]:
        fake = FakeTime()
        client = RecordingClient(UPSTREAM_CLIENTS[request.param]())
        clients.append(client)
        return Forwarder(client, sleep=fake.sleep, clock=fake.clock, **kwargs), fake, client

    yield make
    for client in clients:
        await client.close()


BODY = json.dumps({"model": "m", "messages": []}).encode()
HEADERS = {"Authorization": "Bearer t", "Content-Type": "application/json"}


async def test_retries_5xx_with_backoff_and_identical_bytes(upstream: Upstream, make_forwarder: Any) -> None:
    forwarder, fake, client = make_forwarder(callback_timeout_s=600)
    upstream.replies = [(500, {}), (502, "<html>proxy</html>"), (503, {}), (504, {})]
    reply = await forwarder.forward(upstream.url, headers=HEADERS, body=BODY, remaining_s=30, label="t")
    assert (reply.status, reply.attempts) == (200, 5)
    assert fake.sleeps == [1, 2, 4, 8]
    assert len(upstream.seen) == 5
    assert {body for body, _ in upstream.seen} == {BODY}
    assert {h["Authorization"] for _, h in upstream.seen} == {"Bearer t"}
    assert client.timeouts == [30, 29, 27, 23, 15]  # one budget shrinking across attempts


async def test_sixty_second_outage_is_survived(upstream: Upstream, make_forwarder: Any) -> None:
    forwarder, fake, _ = make_forwarder(callback_timeout_s=600)
    upstream.replies = [(503, {})] * 10
    reply = await forwarder.forward(upstream.url, headers=HEADERS, body=BODY, remaining_s=600, label="t")
    assert reply.status == 200
    attempts_at = [0.0]
    for wait in fake.sleeps:
        attempts_at.append(attempts_at[-1] + wait)
    assert attempts_at == [0, 1, 3, 7, 15, 23, 31, 39, 47, 55, 63]


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 422, 429, 499, 501])
async def test_other_statuses_pass_through_once(upstream: Upstream, make_forwarder: Any, status: int) -> None:
    forwarder, fake, _ = make_forwarder()
    upstream.replies = [(status, {"error": {"message": "no"}})]
    reply = await forwarder.forward(upstream.url, headers=HEADERS, body=BODY, remaining_s=30, label="t")
    assert (reply.status, json.loads(reply.body)) == (status, {"error": {"message": "no"}})
    assert (len(upstream.seen), fake.sleeps) == (1, [])


async def test_rendering_error_is_never_replayed(upstream: Upstream, make_forwarder: Any) -> None:
    forwarder, fake, _ = make_forwarder()
    upstream.replies = [(500, {"error": {"message": RENDERING_ERROR}})]
    reply = await forwarder.forward(upstream.url, headers=HEADERS, body=BODY, remaining_s=30, label="t")
    assert reply.status == 500
    assert (len(upstream.seen), fake.sleeps) == (1, [])


async def test_retries_share_one_budget(upstream: Upstream, make_forwarder: Any) -> None:
    forwarder, fake, client = make_forwarder(callback_timeout_s=5)
    upstream.default = (503, {})
    with pytest.raises(UpstreamError, match="deadline exceeded") as caught:
        await forwarder.forward(upstream.url, headers=HEADERS, body=BODY, remaining_s=30, label="t")
    assert caught.value.attempts == 3
    assert client.timeouts == [5, 4, 2]
    assert fake.sleeps == [1, 2, 2]


async def test_transport_errors_are_not_replayed(make_forwarder: Any) -> None:
    forwarder, fake, client = make_forwarder()
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(UpstreamError, match="transport failed"):
        await forwarder.forward(
            f"http://127.0.0.1:{port}/v1/x", headers=HEADERS, body=BODY, remaining_s=30, label="t"
        )
    assert (len(client.timeouts), fake.sleeps) == (1, [])


@pytest.mark.parametrize("name", sorted(UPSTREAM_CLIENTS))
async def test_blocked_answer_is_cut_by_the_budget(upstream: Upstream, name: str) -> None:
    client = UPSTREAM_CLIENTS[name]()
    try:
        forwarder = Forwarder(client, callback_timeout_s=0.2)
        upstream.replies = [(200, "hang")]
        with pytest.raises(UpstreamError, match="deadline exceeded"):
            await forwarder.forward(upstream.url, headers=HEADERS, body=BODY, remaining_s=30, label="t")
    finally:
        await client.close()


def test_settings_know_every_upstream_client_and_refuse_others() -> None:
    from relax_gym_core.errors import ConfigError  # noqa: PLC0415
    from relax_gym_core.gateway.config import UPSTREAM_CLIENT_NAMES, GatewaySettings  # noqa: PLC0415

    assert sorted(UPSTREAM_CLIENT_NAMES) == sorted(UPSTREAM_CLIENTS)
    assert GatewaySettings(environments=()).upstream_client == "pyreqwest"
    chosen = GatewaySettings.from_env((), {"RELAX_GYM_UPSTREAM_CLIENT": "httpx"})
    assert chosen.upstream_client == "httpx"
    with pytest.raises(
        ConfigError, match="RELAX_GYM_UPSTREAM_CLIENT must be one of pyreqwest, aiohttp, httpx"
    ):
        GatewaySettings.from_env((), {"RELAX_GYM_UPSTREAM_CLIENT": "curl"})


@pytest.mark.parametrize("name", sorted(UPSTREAM_CLIENTS))
async def test_an_explicit_proxy_carries_the_call(name: str) -> None:
    """With a proxy configured, the request goes to it in absolute form (and never straight to the origin)."""
    seen: list[bytes] = []
    reply = json.dumps({"ok": True}).encode()

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        seen.append(head.split(b"\r\n", 1)[0])
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        await reader.readexactly(length)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (len(reply), reply)
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(proxy, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    with socket.socket() as sock:  # an origin nobody listens on: only the proxy can answer
        sock.bind(("127.0.0.1", 0))
        origin = f"http://127.0.0.1:{sock.getsockname()[1]}/agentic_api/v1/chat/completions"
    client = UPSTREAM_CLIENTS[name](proxy=f"http://127.0.0.1:{port}")
    try:
        answer = await client.post(origin, headers=HEADERS, body=BODY, timeout_s=30)
    finally:
        await client.close()
        server.close()
        await server.wait_closed()
    assert (answer.status, json.loads(answer.body)) == (200, {"ok": True})
    assert seen == [f"POST {origin} HTTP/1.1".encode()]


async def test_large_bodies_cross_whole(upstream: Upstream, make_forwarder: Any) -> None:
    """Long agent contexts go up and long answers (token ids, logprobs) come back without a size cap."""
    forwarder, _, _ = make_forwarder()
    big_answer = {"choices": [{"text": "y" * 8_000_000}]}
    upstream.replies = [(200, big_answer)]
    body = json.dumps({"messages": [{"role": "user", "content": "x" * 8_000_000}]}).encode()
    reply = await forwarder.forward(upstream.url, headers=HEADERS, body=body, remaining_s=60, label="t")
    assert json.loads(reply.body) == big_answer
    assert upstream.seen[0][0] == body
