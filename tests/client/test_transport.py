"""The client's aiohttp transport answers like httpx's own: the same response, and for each failure the httpx
error httpcore raises, so the client's retry rules (refused connections apart) read them alike."""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import httpx
import pytest

from relax_gym_core.client.http import _default_transport
from relax_gym_core.client.transport import AiohttpTransport

pytestmark = pytest.mark.anyio

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
    assert isinstance(_default_transport(), AiohttpTransport)


def test_without_aiohttp_the_client_uses_httpxs_own_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "relax_gym_core.client.transport", None)  # as if aiohttp were absent
    assert isinstance(_default_transport(), httpx.AsyncHTTPTransport)
