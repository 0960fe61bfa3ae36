"""The thin client's HTTP transport where aiohttp is installed: httpx's API, aiohttp's pool underneath.

httpx's own pool (httpcore) cost ~0.6 ms of CPU a request here, and more as requests overlap (1.2 ms with
16 in flight, 1.6 ms with 64: a rollout's long polls overlap by the hundred); the same requests through
this transport cost ~0.35 ms, flat. The client keeps httpx for everything else (requests, responses,
errors, and the transport seam its tests use); this only moves the bytes, and turns aiohttp's errors into
the httpx errors httpcore raises for the same failures, so the client's retry rules read them alike.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import httpx

POOL_SIZE = 100  # httpx's default (ClientOptions.max_connections sets it per client)
CHUNK = 64 * 1024

# Hop-by-hop and framing headers are aiohttp's to write; it also adds none of its own defaults.
_NOT_FORWARDED = frozenset({b"host", b"content-length", b"connection", b"transfer-encoding"})


def _error(exc: BaseException, request: httpx.Request, *, reading: bool) -> httpx.TransportError:
    """The httpx error httpcore raises for the failure aiohttp reported (the message is the type only:
    aiohttp's messages name hosts and headers)."""
    name = type(exc).__name__
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout(name, request=request)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError(name, request=request)  # refused: the request never left
    if isinstance(exc, (aiohttp.SocketTimeoutError, TimeoutError)):
        return httpx.ReadTimeout(name, request=request)
    if isinstance(exc, aiohttp.ServerDisconnectedError) and not reading:
        return httpx.RemoteProtocolError(name, request=request)
    if isinstance(exc, (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)):
        return httpx.ReadError(name, request=request)
    return httpx.RemoteProtocolError(name, request=request)


class _Body(httpx.AsyncByteStream):
    """The response body as aiohttp reads it, with read errors as httpx's."""

    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request) -> None:
        self._response = response
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_chunked(CHUNK):
                yield chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _error(exc, self._request, reading=True) from None

    async def aclose(self) -> None:
        self._response.release()


class AiohttpTransport(httpx.AsyncBaseTransport):
    """httpx.AsyncBaseTransport over one aiohttp session, made on first use (it belongs to that loop)."""

    def __init__(self, *, pool_size: int = POOL_SIZE) -> None:
        self._pool_size = pool_size
        self._session: aiohttp.ClientSession | None = None

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._pool_size),
                trust_env=False,  # no proxy from the trainer's environment between us and the gateway
                auto_decompress=False,  # the client's size cap counts what arrives (it asks for identity)
                cookie_jar=aiohttp.DummyCookieJar(),
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),  # httpx's are sent instead
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = request.extensions.get("timeout", {})
        connect, pool = timeouts.get("connect"), timeouts.get("pool")
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=None if connect is None or pool is None else connect + pool,  # a free connection, made
            sock_connect=connect,
            sock_read=timeouts.get("read"),
        )
        headers = [
            (name.decode("latin-1"), value.decode("latin-1"))
            for name, value in request.headers.raw
            if name.lower() not in _NOT_FORWARDED
        ]
        body = await request.aread()
        try:
            response = await self._session_now().request(
                request.method,
                str(request.url),
                data=body or None,
                headers=headers,
                timeout=timeout,
                allow_redirects=False,
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _error(exc, request, reading=False) from None
        return httpx.Response(
            response.status,
            headers=list(response.raw_headers),
            stream=_Body(response, request),
            extensions={"http_version": b"HTTP/1.1"},
        )

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()
