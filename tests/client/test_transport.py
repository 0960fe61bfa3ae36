"""The client's aiohttp transport answers like httpx's own: the same response, and for each failure the httpx
error httpcore raises, so the client's retry rules (refused connections apart) read them alike."""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
import httpx
import pytest

from relax_gym_core.client import ClientOptions
from relax_gym_core.client.exceptions import ClientConfigError
from relax_gym_core.client.http import _default_transport
from relax_gym_core.client.transport import AiohttpTransport
from relax_gym_core.rollout.run import client_options

pytestmark = pytest.mark.anyio

SAFETY_S = 60.0  # only so a broken pool fails instead of hanging
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def raw_server(handler: Handler) -> AsyncIterator[str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        ),
        0,
    )
    return head + await reader.readexactly(length)


@asynccontextmanager
async def client(timeout_s: float = 30.0) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=AiohttpTransport(), timeout=timeout_s, trust_env=False) as http:
        yield http


async def test_a_request_and_its_answer_cross_whole() -> None:
    seen: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await _read_request(reader))
        body = b'{"ok": true, "pad": "' + b"x" * 200_000 + b'"}'
        writer.write(
            b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nX-Extra: 1\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        writer.close()

    async with raw_server(answer) as url, client() as http:
        response = await http.post(
            f"{url}/v1/trials?x=1", content=b'{"a": 1}', headers={"authorization": "Bearer t"}
        )
    assert response.status_code == 201
    assert response.headers["x-extra"] == "1"
    assert response.json()["pad"] == "x" * 200_000
    request = seen[0].lower()
    assert request.startswith(b"post /v1/trials?x=1 http/1.1")
    assert b"authorization: bearer t" in request
    assert b"content-length: 8" in request
    assert request.endswith(b'{"a": 1}')


async def test_a_refused_connection_is_a_connect_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    async with client() as http:
        with pytest.raises(httpx.ConnectError):
            await http.get(f"http://127.0.0.1:{port}/healthz")


async def test_a_silent_server_is_a_read_timeout() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await reader.read()  # never answers; ends when the client hangs up
        writer.close()

    async with raw_server(silent) as url, client(timeout_s=0.2) as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.get(f"{url}/v1/trials/t1")


async def test_a_server_that_hangs_up_is_a_remote_protocol_error() -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.close()

    async with raw_server(hang_up) as url, client() as http:
        with pytest.raises(httpx.RemoteProtocolError):
            await http.get(f"{url}/v1/trials/t1")


async def test_a_body_cut_short_is_a_read_error() -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"partial"')
        await writer.drain()
        writer.close()

    async with raw_server(cut) as url, client() as http:
        with pytest.raises(httpx.ReadError):
            await http.get(f"{url}/v1/trials/t1")


async def test_errors_say_what_failed_not_where() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with client() as http:
        with pytest.raises(httpx.ConnectError) as info:
            await http.get(f"http://127.0.0.1:{port}/healthz", headers={"authorization": "Bearer secret-t"})
    assert str(info.value) == "ClientConnectorError"


def test_the_client_uses_aiohttps_pool_where_aiohttp_is_installed() -> None:
    assert isinstance(_default_transport(100), AiohttpTransport)


def test_without_aiohttp_the_client_uses_httpxs_own_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "relax_gym_core.client.transport", None)  # as if aiohttp were absent
    assert isinstance(_default_transport(100), httpx.AsyncHTTPTransport)


@pytest.mark.parametrize("aiohttp_installed", [True, False])
async def test_as_many_requests_in_flight_as_the_options_allow(
    aiohttp_installed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More at once than the pool's old 100 (a rollout's long polls, one per trial in flight): every one
    reaches the server before any is answered, so none waits for a connection."""
    wanted = 150
    arrived = 0
    all_here = asyncio.Event()

    async def answer_once_all_arrived(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal arrived
        await _read_request(reader)
        arrived += 1
        if arrived == wanted:
            all_here.set()
        await all_here.wait()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    if not aiohttp_installed:
        monkeypatch.setitem(sys.modules, "relax_gym_core.client.transport", None)
    transport = _default_transport(ClientOptions(max_connections=wanted).max_connections)
    async with (
        raw_server(answer_once_all_arrived) as url,
        httpx.AsyncClient(transport=transport, timeout=SAFETY_S, trust_env=False) as http,
    ):
        with anyio.fail_after(SAFETY_S):  # with a smaller pool the last 50 would wait here forever
            answers = await asyncio.gather(*(http.get(f"{url}/poll/{index}") for index in range(wanted)))
    assert [answer.text for answer in answers] == ["ok"] * wanted


def test_a_rollout_allows_two_connections_per_trial_in_flight() -> None:
    assert client_options(8).max_connections == 100  # httpx's default, at the least
    assert client_options(256).max_connections == 512  # a long poll and a renew per trial


def test_max_connections_must_be_a_positive_integer() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ClientConfigError, match="max_connections must be an integer >= 1"):
            ClientOptions(max_connections=bad)  # type: ignore[arg-type]
