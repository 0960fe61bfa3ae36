"""GatewayClient: the trial API over httpx, with the reference retry policy made patient where it matters.

Reference §5.4: transport errors, 408, 429 and 5xx are retried with `retry_backoff_s * 2**n` back-off;
any other status fails at once. Differences:
- 429/503 honour `Retry-After` (seconds or an HTTP date).
- create keeps retrying 429 ("environment queue is full" is back-pressure, not failure) and refused
  connections (a gateway restarting; nothing was sent) until the startup timeout, which bounds the whole
  create instead of each attempt.
- responses are read up to MAX_RESPONSE_BYTES and refused beyond, while streaming: nothing a gateway
  says is worth unbounded memory.
- get/renew accept `retry_until`: transient failures are retried until that monotonic instant (the
  trial loop passes the end of the lease), so a gateway blip does not kill a healthy trial.
- abort is one short attempt: it runs while Relax is waiting to SIGKILL us.
Error texts carry the operation, the status, the attempt count and the gateway's reason with advice
(relax_gym_core.client.diagnosis), never a response body as such, the request or a token.
"""

from __future__ import annotations

import email.utils
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Final, Self
from urllib.parse import quote, urlencode

import anyio
import httpx
from attrs import frozen

from relax_gym_core.client.diagnosis import ErrorContext, error_message, gateway_detail
from relax_gym_core.client.exceptions import TrialGoneError
from relax_gym_core.client.settings import ClientOptions
from relax_gym_core.errors import GatewayRequestError, ProtocolError
from relax_gym_core.protocol import (
    EPOCH_HEADER,
    MAX_TRAJECTORY_IDS,
    MAX_WAIT_S,
    REPLAY_HEADER,
    WAITED_HEADER,
    CleanupState,
    CreateTrialRequest,
    ServiceHealth,
    TrialSnapshot,
    jsonutil,
    parse_snapshot,
    request_to_wire,
    structure,
)

logger = logging.getLogger("relax_gym.client")

MAX_BACKOFF_S: Final = 2.0  # keeps the last try of a budget close to its end
MAX_RETRY_AFTER_S: Final = 60.0  # a gateway cannot park us longer than this per answer
PATIENT_MIN_DELAY_S: Final = 0.1  # unbounded retry loops never spin, even with retry_backoff_s = 0
MIN_ATTEMPT_TIMEOUT_S: Final = 0.5
_USER_AGENT: Final = "relax-gym-client"
MAX_RESPONSE_BYTES: Final = 16 << 20  # a snapshot is kilobytes; this is for metrics-heavy environments

type Sleep = Callable[[float], Awaitable[None]]
type Clock = Callable[[], float]


def _is_transient(status: int) -> bool:
    return status in (408, 429) or status >= 500


def _timeout(seconds: float) -> httpx.Timeout:
    return httpx.Timeout(seconds, connect=min(10.0, seconds))


def retry_after_s(response: httpx.Response, *, now: Callable[[], float] = time.time) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or HTTP date), clamped; None if absent or bad."""
    raw = response.headers.get("retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    try:
        seconds = float(raw)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(raw).timestamp() - now()
        except (TypeError, ValueError, IndexError):
            return None
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


@frozen(kw_only=True)
class _Policy:
    """When to stop retrying one call."""

    max_attempts: int | None  # None: only `until` bounds the retries
    until: float | None = None  # monotonic instant after which no attempt starts
    patient: frozenset[int] = frozenset()  # statuses retried until `until` whatever max_attempts says
    patient_connect: bool = False  # refused connections too (the request never left this process)


class _ResponseTooLargeError(Exception):
    """Raised from inside httpx's read of a response body; _call turns it into a GatewayRequestError."""


class _CappedStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, limit: int) -> None:
        self._inner = inner
        self._limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self._inner:
            seen += len(chunk)
            if seen > self._limit:
                raise _ResponseTooLargeError
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class _CappedTransport(httpx.AsyncBaseTransport):
    """Stops reading a response at `limit` bytes (by Content-Length before any, else while streaming)."""

    def __init__(self, inner: httpx.AsyncBaseTransport, limit: int) -> None:
        self._inner = inner
        self._limit = limit

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self._limit:
            await response.aclose()
            raise _ResponseTooLargeError
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _CappedStream(response.stream, self._limit)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


def httpx_transport(max_connections: int) -> httpx.AsyncBaseTransport:
    """httpx's own pool: what a process making a few requests wants (the thin client's one trial), since
    aiohttp's lower CPU a request never pays back the ~0.2 s of importing it."""
    return httpx.AsyncHTTPTransport(trust_env=False, limits=httpx.Limits(max_connections=max_connections))


def _default_transport(max_connections: int) -> httpx.AsyncBaseTransport:
    """aiohttp's pool under httpx where aiohttp is installed (the gateway's extra; Relax's environment has
    it): 2-4x less CPU a request than httpx's own pool (client/transport.py). The core alone brings no web
    stack, so without aiohttp it is httpx's own, which behaves the same."""
    try:
        from relax_gym_core.client.transport import AiohttpTransport  # noqa: PLC0415 - optional
    except ImportError:
        return httpx_transport(max_connections)
    return AiohttpTransport(pool_size=max_connections)


class GatewayClient:
    """Async client of one gateway. Use as `async with GatewayClient(url) as gateway: ...`."""

    def __init__(
        self,
        gateway_url: str,
        *,
        options: ClientOptions | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Sleep = anyio.sleep,
        clock: Clock = time.monotonic,
        api_token: str | None = None,
    ) -> None:
        self.gateway_url = gateway_url.rstrip("/")
        self.options = options or ClientOptions()
        self._sleep = sleep
        self.clock = clock
        # identity: the cap below counts what arrives, so it must be what is kept (no decompression bomb).
        headers = {"user-agent": _USER_AGENT, "accept-encoding": "identity"}
        self._api_token = api_token or None  # kept only to mask it should a gateway ever echo it
        self._long_polls: bool | None = None  # does the gateway answer ?wait_s= (next_snapshot)
        self._many_trajectories = True  # GET /v1/trajectories, until a gateway without it says 404/405
        # The service_epoch the last create's answer named (EPOCH_HEADER); None from a gateway that names
        # none. Read it right after create() returns: no other task runs in between.
        self.service_epoch: str | None = None
        # Whether the last create found its trial already there (REPLAY_HEADER): read it the same way.
        self.create_replayed = False
        if api_token:
            headers["authorization"] = f"Bearer {api_token}"
        self._headers = httpx.Headers(headers)
        # Requests go straight to the transport (_send), never through a proxy from the trainer's
        # environment: none is mounted, and the default transports ignore the proxy variables.
        self._transport = _CappedTransport(
            transport or _default_transport(self.options.max_connections), MAX_RESPONSE_BYTES
        )

    @property
    def long_polls(self) -> bool | None:
        """Whether the gateway waits when asked (``?wait_s=``); None until an answer has shown it."""
        return self._long_polls

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):  # a cancelled session must still release its connections
            await self._transport.aclose()

    # ---- trial API ----------------------------------------------------------------------------------

    async def create(self, request: CreateTrialRequest, *, wait_s: float = 0.0) -> TrialSnapshot:
        """POST /v1/trials (idempotent: retries resend the same request_id and body).

        With `wait_s`, the gateway answers once the trial's status is final or that many seconds have
        passed (relax-gym's `?wait_s=`; the reference ignores it and answers at once): a short trial then
        needs no poll at all. Keep it below the lease's renew interval: nothing renews while it waits."""
        opts = self.options
        wait_s = min(max(wait_s, 0.0), MAX_WAIT_S)
        response = await self._call(
            "create",
            "POST",
            f"/v1/trials?wait_s={wait_s:g}" if wait_s else "/v1/trials",
            content=jsonutil.dumps(request_to_wire(request)),
            attempt_timeout_s=opts.startup_timeout_s + wait_s,
            policy=_Policy(
                max_attempts=opts.max_retries + 1,
                until=self.clock() + opts.startup_timeout_s,
                patient=frozenset({429}),
                patient_connect=True,
            ),
            request=request,
        )
        self.service_epoch = response.headers.get(EPOCH_HEADER)
        snapshot = parse_snapshot(self._json(response, "create"), request_id=request.request_id)
        waited = WAITED_HEADER in response.headers
        if waited:
            self._long_polls = True
        # A gateway that never waits on a create (the reference, an older relax-gym) answers a new trial
        # before it can end: a final status there means the trial was already there.
        self.create_replayed = REPLAY_HEADER in response.headers or (
            not waited and snapshot.status.is_terminal
        )
        return snapshot

    async def get(self, request_id: str, *, retry_until: float | None = None) -> TrialSnapshot:
        response = await self._call(
            "get", "GET", _trial_path(request_id), policy=self._policy(retry_until), trial_op=True
        )
        return parse_snapshot(self._json(response, "get"), request_id=request_id)

    async def next_snapshot(self, request_id: str, *, retry_until: float | None = None) -> TrialSnapshot:
        """The trial's snapshot once it changes: a long poll (``?wait_s=``) where the gateway offers one,
        else, no sooner than one poll interval from now, a sleep then a GET (the reference gateway ignores
        the parameter and answers at once; its clients poll as they always did).

        The first long poll asks for one interval: a gateway that answers at once is then polled like the
        reference. Once the gateway is known to wait, each waits up to MAX_WAIT_S (30 s): it answers at the
        change anyway, so a longer wait costs no latency, only requests (one per 30 s per running trial
        instead of one per interval). With `retry_until`, at most half the time left until then, so the
        answer has as long again to arrive."""
        interval = min(self.options.poll_interval_s, MAX_WAIT_S)
        if self._long_polls is False:
            await self._sleep(interval)
            return await self.get(request_id, retry_until=retry_until)
        wait = MAX_WAIT_S if self._long_polls else interval
        if retry_until is not None:
            wait = min(wait, max(0.0, retry_until - self.clock()) / 2)
        started = self.clock()
        response = await self._call(
            "get",
            "GET",
            f"{_trial_path(request_id)}?wait_s={wait:g}",
            policy=self._policy(retry_until),
            attempt_timeout_s=self.options.request_timeout_s + wait,
            trial_op=True,
        )
        snapshot = parse_snapshot(self._json(response, "get"), request_id=request_id)
        self._long_polls = WAITED_HEADER in response.headers  # learned once per gateway
        if self._long_polls or snapshot.status.is_terminal:
            return snapshot
        left = interval - (self.clock() - started)
        if left > 0:
            await self._sleep(left)
        return await self.get(request_id, retry_until=retry_until)

    async def settled(self, request_id: str, *, timeout_s: float) -> TrialSnapshot:
        """Poll until the trial is terminal and its cleanup is no longer pending; return that snapshot.

        A trial's status turns terminal before its environment's cleanup is confirmed (the reward must not
        wait on it); callers that need the proof, such as tests and resource audits, wait here. Raises
        TimeoutError naming the trial when `timeout_s` passes first.
        """
        until = self.clock() + timeout_s
        if self._long_polls:  # answered at once if settled, else at the next transition: no GET first
            snapshot = await self.next_snapshot(request_id, retry_until=until)
        else:
            snapshot = await self.get(request_id, retry_until=until)
        while True:
            if snapshot.status.is_terminal and snapshot.cleanup not in (None, CleanupState.PENDING):
                return snapshot
            if self.clock() >= until:
                raise TimeoutError(f"trial {request_id!r}: cleanup still pending after {timeout_s:g} s")
            snapshot = await self.next_snapshot(request_id, retry_until=until)

    async def trajectory(self, request_id: str) -> dict[str, Any] | None:
        """The trial's trajectory (GET /v1/trials/{id}/trajectory) once it has ended; None when the
        gateway kept none (off, never ran, expired)."""
        try:
            response = await self._call(
                "trajectory",
                "GET",
                _trial_path(request_id) + "/trajectory",
                policy=self._policy(None),
                trial_op=True,
            )
        except TrialGoneError:
            return None
        document = self._json(response, "trajectory")
        return document if isinstance(document, dict) else None

    async def trajectories(self, request_ids: Sequence[str]) -> dict[str, dict[str, Any] | None]:
        """The trajectories of trials that ended, by request id (None: the gateway kept none), many per
        request: GET /v1/trajectories, asked again for the ids an answer deferred. A gateway without that
        route (the reference, an older relax-gym) is asked trial by trial."""
        found: dict[str, dict[str, Any] | None] = {}
        wanted = list(dict.fromkeys(request_ids))
        while wanted and self._many_trajectories:
            asked = wanted[:MAX_TRAJECTORY_IDS]
            try:
                response = await self._call(
                    "trajectories",
                    "GET",
                    "/v1/trajectories?" + urlencode([("request_id", each) for each in asked]),
                    policy=self._policy(None),
                )
            except GatewayRequestError as exc:
                if exc.status_code not in (404, 405):
                    raise
                self._many_trajectories = False
                break
            answer = self._json(response, "trajectories")
            documents = answer.get("trajectories") if isinstance(answer, dict) else None
            deferred = answer.get("deferred") if isinstance(answer, dict) else None
            if not isinstance(documents, dict) or not isinstance(deferred, list):
                raise ProtocolError("Gateway returned a malformed answer to the trajectories request")
            later = set(deferred)
            for request_id in asked:
                if request_id not in later:
                    document = documents.get(request_id)
                    found[request_id] = document if isinstance(document, dict) else None
            left = [request_id for request_id in wanted if request_id not in found]
            if len(left) == len(wanted):  # nothing answered: no use asking the same again
                break
            wanted = left
        for request_id in wanted:
            found[request_id] = await self.trajectory(request_id)
        return found

    async def renew(self, request_id: str, *, retry_until: float | None = None) -> None:
        await self._call(
            "renew",
            "POST",
            _trial_path(request_id) + "/renew",
            policy=self._policy(retry_until),
            trial_op=True,
        )

    async def abort(self, request_id: str) -> TrialSnapshot:
        """One attempt, abort_timeout_s: retrying would only eat into Relax's termination grace."""
        response = await self._call(
            "abort",
            "POST",
            _trial_path(request_id) + "/abort",
            attempt_timeout_s=self.options.abort_timeout_s,
            policy=_Policy(max_attempts=1),
            trial_op=True,
        )
        return parse_snapshot(self._json(response, "abort"), request_id=request_id)

    async def health(self) -> ServiceHealth:
        """GET /healthz, one attempt (callers use it as a probe)."""
        response = await self._call("health", "GET", "/healthz", policy=_Policy(max_attempts=1))
        data = self._json(response, "health")
        return structure(data, ServiceHealth, name="health")

    # ---- transport ----------------------------------------------------------------------------------

    def _policy(self, retry_until: float | None) -> _Policy:
        if retry_until is None:
            return _Policy(max_attempts=self.options.max_retries + 1)
        return _Policy(max_attempts=None, until=retry_until)

    def _backoff(self, attempt: int) -> float:
        return min(self.options.retry_backoff_s * (1 << min(attempt - 1, 30)), MAX_BACKOFF_S)

    async def _call(
        self,
        op: str,
        method: str,
        path: str,
        *,
        policy: _Policy,
        content: bytes | None = None,
        attempt_timeout_s: float | None = None,
        trial_op: bool = False,
        request: CreateTrialRequest | None = None,
    ) -> httpx.Response:
        per_attempt = self.options.request_timeout_s if attempt_timeout_s is None else attempt_timeout_s
        attempt = 0
        while True:
            attempt += 1
            limit = per_attempt
            if policy.until is not None:
                limit = max(min(per_attempt, policy.until - self.clock()), MIN_ATTEMPT_TIMEOUT_S)
            status: int | None = None
            failed: httpx.Response | None = None  # the transient error answer of this attempt
            refused = False
            try:
                response = await self._send(method, path, content, limit)
            except _ResponseTooLargeError:
                raise GatewayRequestError(
                    f"Gateway {op} response is larger than {MAX_RESPONSE_BYTES} bytes; not read"
                ) from None
            except httpx.TransportError as exc:
                cause = type(exc).__name__
                delay = self._backoff(attempt)
                refused = isinstance(exc, httpx.ConnectError)
            except httpx.HTTPError as exc:
                raise GatewayRequestError(f"Gateway {op} request failed ({type(exc).__name__})") from None
            else:
                status = response.status_code
                if response.is_success:
                    return response
                if not _is_transient(status):
                    # Not "after N attempts": earlier transient failures did not cause this refusal.
                    raise self._status_error(op, response, attempts=1, trial_op=trial_op, request=request)
                failed = response
                cause = f"HTTP {status}"
                hinted = retry_after_s(response) if status in (429, 503) else None
                delay = self._backoff(attempt) if hinted is None else hinted
            patient = (
                policy.max_attempts is None
                or status in policy.patient
                or (refused and policy.patient_connect)
            )
            if patient:
                delay = max(delay, PATIENT_MIN_DELAY_S)
            if not self._may_retry(policy, attempt, patient, delay):
                if failed is None:
                    raise _transport_exhausted(op, attempt, cause)
                raise self._status_error(op, failed, attempts=attempt, trial_op=trial_op, request=request)
            logger.info("Gateway %s request failed (%s); retry %d in %.2f s", op, cause, attempt, delay)
            if delay > 0:
                await self._sleep(delay)

    async def _send(self, method: str, path: str, content: bytes | None, timeout_s: float) -> httpx.Response:
        """One request, read whole, straight through the transport: httpx's client adds to every request
        what this one never uses (URL merging, cookies, auth and redirect flows), ~200 us of CPU of ~550."""
        headers = self._headers
        if content is not None:
            headers = headers.copy()
            headers["content-type"] = "application/json"
        request = httpx.Request(
            method,
            self.gateway_url + path,
            headers=headers,
            content=content,
            extensions={"timeout": _timeout(timeout_s).as_dict()},
        )
        response = await self._transport.handle_async_request(request)
        try:
            await response.aread()
        finally:
            await response.aclose()
        return response

    def _status_error(
        self,
        op: str,
        response: httpx.Response,
        *,
        attempts: int,
        trial_op: bool,
        request: CreateTrialRequest | None,
    ) -> GatewayRequestError:
        secrets = tuple(
            s
            for s in (
                self._api_token,
                request.model_endpoint.api_key if request is not None else None,
                request.session.session_id if request is not None else None,
            )
            if s
        )
        status = response.status_code
        detail = gateway_detail(response.content, secrets=secrets)
        context = ErrorContext(
            op=op,
            status=status,
            detail=detail,
            options=self.options,
            request=request,
            token_sent=self._api_token is not None,
            attempts=attempts,
            secrets=secrets,
        )
        message = error_message(context)
        if status == 404 and trial_op:
            expired = (detail or "").startswith("trial expired")
            return TrialGoneError(message, expired=expired, detail=detail)
        return GatewayRequestError(message, status_code=status, detail=detail)

    def _may_retry(self, policy: _Policy, attempt: int, patient: bool, delay: float) -> bool:
        if policy.until is not None and self.clock() + delay >= policy.until:
            return False
        return patient or policy.max_attempts is None or attempt < policy.max_attempts

    @staticmethod
    def _json(response: httpx.Response, op: str) -> Any:
        try:
            return jsonutil.loads(response.content)
        except ProtocolError:
            raise ProtocolError(f"Gateway returned a non-JSON response to the {op} request") from None


def _trial_path(request_id: str) -> str:
    return "/v1/trials/" + quote(request_id, safe="")


def _transport_exhausted(op: str, attempts: int, cause: str) -> GatewayRequestError:
    after = f" after {attempts} attempts" if attempts > 1 else ""
    return GatewayRequestError(f"Gateway {op} request failed{after} ({cause})")
