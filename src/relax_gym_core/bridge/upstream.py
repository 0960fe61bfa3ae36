"""Calls to the trainer's per-session model API: one shared pool, one budget, safe retries only.

Retries happen only for 500/502/503/504 whose body is not the "rendering" error (Relax may already have
recorded that turn; replaying it would fork the session's history), with back-off 1, 2, 4, 8, 8... s
inside one budget = min(trial remaining, callback timeout). Transport errors are never retried: the
request may have been delivered. Every attempt sends the same bytes.
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import timedelta
from typing import Protocol

import aiohttp
import attrs
import pyreqwest.exceptions as pyreqwest_errors
import yarl
from attrs import frozen
from pyreqwest.client import ClientBuilder
from pyreqwest.proxy import ProxyBuilder
from pyreqwest.request import ConsumedRequest

from relax_gym_core.errors import UpstreamError, UpstreamTimeoutError, UpstreamTransportError

logger = logging.getLogger("relax_gym.bridge")

RETRY_STATUSES = frozenset({500, 502, 503, 504})
RENDERING_ERROR = "Internal error while rendering agentic response."
BACKOFF_S = (1.0, 2.0, 4.0, 8.0)
CONNECT_TIMEOUT_S = 30.0
_AIOHTTP_RAW_LIMIT = 1 << 20


# Upstream headers the agent must see: Relax says "do not retry" on turns it may already have recorded,
# and an SDK that does not see it would replay the turn (and fork the session's history).
PASSED_HEADERS = ("x-should-retry", "retry-after")


@frozen
class UpstreamReply:
    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()
    attempts: int = 1  # set by the Forwarder when 5xx answers were retried


def _passed(headers: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple((name, headers[name]) for name in PASSED_HEADERS if name in headers)


class UpstreamClient(Protocol):
    async def post(
        self, url: str, *, headers: Mapping[str, str], body: bytes, timeout_s: float
    ) -> UpstreamReply: ...

    async def close(self) -> None: ...


@functools.lru_cache(maxsize=16384)
def _url(url: str) -> yarl.URL:
    # Parsed once per trial's endpoint, not on every call (the URL was already validated and rebuilt).
    return yarl.URL(url)


class AiohttpUpstream:
    """aiohttp pool: flat CPU per call under load, ~1.4x pyreqwest's (bench/bridge.py); pure Python wheels."""

    def __init__(self, *, proxy: str | None = None, limit: int = 4096) -> None:
        self._proxy = proxy
        # trust_env=False: environment proxies are ignored unless configured explicitly (proxy=...).
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=limit, limit_per_host=0, ttl_dns_cache=60),
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,
            auto_decompress=True,
            skip_auto_headers=("User-Agent",),
        )

    async def post(
        self, url: str, *, headers: Mapping[str, str], body: bytes, timeout_s: float
    ) -> UpstreamReply:
        timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=min(timeout_s, CONNECT_TIMEOUT_S))
        try:
            async with self._session.post(
                url,
                # aiohttp warns (ResourceWarning) on raw bytes over 1 MiB; a stream of the same bytes is fine.
                data=body if len(body) < _AIOHTTP_RAW_LIMIT else io.BytesIO(body),
                headers=dict(headers),
                timeout=timeout,
                proxy=self._proxy,
                allow_redirects=False,
            ) as response:
                payload = await response.read()
                return UpstreamReply(
                    response.status,
                    response.headers.get("Content-Type", ""),
                    payload,
                    _passed(response.headers),
                )
        except TimeoutError as exc:
            raise UpstreamTimeoutError from exc
        except aiohttp.ClientError as exc:
            raise UpstreamTransportError(type(exc).__name__) from exc

    async def close(self) -> None:
        await self._session.close()


class PyreqwestUpstream:
    """reqwest (Rust) pool: HTTP parsing and socket work run on reqwest's own threads, so each call costs
    the event loop only building the request and waking on its answer (bench/bridge.py)."""

    def __init__(self, *, proxy: str | None = None, limit: int = 4096) -> None:
        builder = (
            ClientBuilder()
            .max_connections(limit)
            .follow_redirects(False)
            .connect_timeout(timedelta(seconds=CONNECT_TIMEOUT_S))
            .gzip(True)
            .brotli(True)
            .zstd(True)
            .deflate(True)
        )
        # reqwest reads proxy variables from the environment by default: only an explicit proxy is used.
        builder = builder.proxy(ProxyBuilder.all(proxy)) if proxy else builder.no_proxy()
        self._client = builder.build()

    async def post(
        self, url: str, *, headers: Mapping[str, str], body: bytes, timeout_s: float
    ) -> UpstreamReply:
        request = (
            self._client.post(url)
            .headers(headers)
            .body_bytes(body)
            .timeout(timedelta(seconds=max(timeout_s, 0.0)))
            .build()
        )
        # pyreqwest answers a cancellation with a CancelledError of its own, which hides whose cancellation
        # it was (anyio's cancel scopes recognise theirs by its message). Awaiting the call through
        # shield() lets the caller's own CancelledError reach the caller; the call is then cancelled here.
        call = asyncio.ensure_future(self._send(request))
        try:
            return await asyncio.shield(call)
        except asyncio.CancelledError:
            call.cancel()
            raise

    @staticmethod
    async def _send(request: ConsumedRequest) -> UpstreamReply:
        try:
            response = await request.send()
            payload = bytes(await response.bytes())
        except pyreqwest_errors.RequestTimeoutError as exc:
            raise UpstreamTimeoutError from exc
        except pyreqwest_errors.PyreqwestError as exc:
            raise UpstreamTransportError(type(exc).__name__) from exc
        return UpstreamReply(
            response.status,
            response.headers.get("content-type") or "",
            payload,
            _passed(response.headers),
        )

    async def close(self) -> None:
        await self._client.close()


class HttpxUpstream:
    """httpx pool, kept for side-by-side measurement and for hosts where aiohttp is unwanted."""

    def __init__(self, *, proxy: str | None = None, limit: int = 4096) -> None:
        import httpx  # noqa: PLC0415 - only this pool needs it: the gateway's start-up imports no httpx

        self._client = httpx.AsyncClient(
            trust_env=False,
            proxy=proxy,
            limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit),
            follow_redirects=False,
        )

    async def post(
        self, url: str, *, headers: Mapping[str, str], body: bytes, timeout_s: float
    ) -> UpstreamReply:
        import httpx  # noqa: PLC0415 - imported by __init__ already

        timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, CONNECT_TIMEOUT_S))
        try:
            response = await self._client.post(url, content=body, headers=headers, timeout=timeout)
        except httpx.TimeoutException as exc:
            raise UpstreamTimeoutError from exc
        except httpx.HTTPError as exc:
            raise UpstreamTransportError(type(exc).__name__) from exc
        return UpstreamReply(
            response.status_code,
            response.headers.get("content-type", ""),
            response.content,
            _passed(response.headers),
        )

    async def close(self) -> None:
        await self._client.aclose()


UPSTREAM_CLIENTS: dict[str, Callable[..., UpstreamClient]] = {
    "pyreqwest": PyreqwestUpstream,
    "aiohttp": AiohttpUpstream,
    "httpx": HttpxUpstream,
}


def is_rendering_error(body: bytes) -> bool:
    try:
        payload = json.loads(body)
    except ValueError:
        return False
    error = payload.get("error") if isinstance(payload, dict) else None
    return isinstance(error, dict) and error.get("message") == RENDERING_ERROR


class Forwarder:
    """Sends one model call upstream under the budget and retry rules above."""

    def __init__(
        self,
        client: UpstreamClient,
        *,
        callback_timeout_s: float = 600.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self._timeout_s = callback_timeout_s
        self._sleep = sleep
        self._clock = clock

    async def forward(
        self, url: str, *, headers: Mapping[str, str], body: bytes, remaining_s: float, label: str
    ) -> UpstreamReply:
        deadline = self._clock() + max(0.0, min(remaining_s, self._timeout_s))
        attempt = 0
        while True:
            left = deadline - self._clock()
            if left <= 0:
                raise UpstreamError("Upstream model callback deadline exceeded", attempts=attempt)
            try:
                reply = await self.client.post(url, headers=headers, body=body, timeout_s=left)
            except UpstreamTimeoutError:
                logger.warning("model callback deadline exceeded %s attempt=%d", label, attempt + 1)
                raise UpstreamError(
                    "Upstream model callback deadline exceeded", attempts=attempt + 1
                ) from None
            except UpstreamTransportError as exc:
                logger.warning("model callback transport failed %s error=%s (not retried)", label, exc)
                raise UpstreamError(
                    "Upstream model callback transport failed", attempts=attempt + 1
                ) from None
            except (ValueError, TypeError) as exc:
                # An HTTP client refusing a request it was given (a header value, say) before sending it.
                # Its message quotes the value, which may be the session's key: only the type is told.
                logger.error(  # noqa: TRY400 - the traceback would carry the message
                    "model callback could not be sent %s error=%s", label, type(exc).__name__
                )
                raise UpstreamError("Upstream model callback could not be sent", attempts=attempt) from None
            if reply.status not in RETRY_STATUSES or is_rendering_error(reply.body):
                if attempt:
                    logger.info("model callback finished after retries %s attempts=%d", label, attempt + 1)
                    return attrs.evolve(reply, attempts=attempt + 1)
                return reply
            wait = min(BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)], deadline - self._clock())
            logger.warning(
                "retrying model callback %s attempt=%d status=%d wait_s=%.1f",
                label,
                attempt + 1,
                reply.status,
                wait,
            )
            if wait <= 0:
                raise UpstreamError("Upstream model callback deadline exceeded", attempts=attempt + 1)
            await self._sleep(wait)
            attempt += 1
