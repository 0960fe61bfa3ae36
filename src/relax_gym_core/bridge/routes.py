"""The model-call bridge: /ng-rollout/{rollout_id}/v1/{chat/completions,responses,messages} and the
un-prefixed /v1/... forms (rollout id in metadata.relax_gym_rollout), forwarded to the trial's session.

Non-streaming calls answer with the upstream status and JSON. Streaming calls are buffered SSE (Relax
answers a whole stream at once): Messages start with a ping and ping every 15 s, errors in-band; Chat and
Responses pass the upstream status through when it answers within 15 s, and otherwise commit to 200
and send SSE comments as keep-alives until the answer (errors then in-band). What is wrong before a
stream starts (a rollout id that is not live, a body that cannot be forwarded) gets its own status.

These routes take no API token: a live rollout id is the credential (trials/rollouts.py). It is checked
before the body is read when the path carries it, and before the body is parsed when metadata does
(gateway/limits.py caps it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from attrs import frozen
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from relax_gym_core.bridge.allowlist import CallbackPolicy, upstream_url
from relax_gym_core.bridge.payloads import (
    ROLLOUT_TAG,
    repair_responses,
    rollout_id_from_body,
    upstream_body,
)
from relax_gym_core.bridge.upstream import Forwarder, UpstreamReply
from relax_gym_core.errors import (
    ProtocolError,
    RelaxGymError,
    RolloutUnavailableError,
    TrialNotFoundError,
    UpstreamError,
)
from relax_gym_core.observe import CallbackOutcome, Observers
from relax_gym_core.protocol import BRIDGE_PREFIX, TOKEN_CAPTURE_SEGMENT, attempt_of, jsonutil
from relax_gym_core.protocol.bridge import MODEL_APIS, model_call_route
from relax_gym_core.trajectories import Recorder
from relax_gym_core.trials import CallbackTarget, Trial, TrialService
from relax_gym_core.web import error_response, json_response, status_for

logger = logging.getLogger("relax_gym.bridge")

RESOURCES = MODEL_APIS
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
PING = b'event: ping\ndata: {"type":"ping"}\n\n'
KEEPALIVE = b": keep-alive\n\n"
_NO_ROLLOUT = f"model call names no trial (use {BRIDGE_PREFIX}<rollout id>/v1/... or metadata.{ROLLOUT_TAG})"


@frozen
class _Answer:
    """What one bridged call produced: an upstream reply, or an error to report."""

    reply: UpstreamReply | None = None
    error: RelaxGymError | None = None

    @property
    def status(self) -> int:
        """The HTTP status the call ended with: the upstream's, or the bridge's own error status."""
        if self.reply is not None:
            return self.reply.status
        return status_for(self.error) if self.error is not None else 500

    @property
    def attempts(self) -> int:
        """Upstream attempts made (retries of 5xx included); 0 if none was made."""
        if self.reply is not None:
            return self.reply.attempts
        return self.error.attempts if isinstance(self.error, UpstreamError) else 0


def _sse_error(resource: str, message: str, payload: Any = None) -> bytes:
    if resource == "messages":
        event = payload if isinstance(payload, dict) and payload.get("type") == "error" else None
        body = event or {"type": "error", "error": {"type": "api_error", "message": message}}
        return b"event: error\ndata: " + jsonutil.dumps(body) + b"\n\n"
    error = payload.get("error") if isinstance(payload, dict) else None
    body = {"error": error if isinstance(error, dict) else {"message": message, "type": "api_error"}}
    return b"data: " + jsonutil.dumps(body) + b"\n\n"


# A rollout tag as a JSON key: found in raw bytes so a call without a live one is refused unparsed.
_TAG_RE = re.compile(rb'"' + ROLLOUT_TAG.encode() + rb'"\s*:\s*"([^"\\]{1,256})"')
_MODEL_PATHS = {f"v1/{resource}": resource for resource in RESOURCES}


def match_model_call(path: str) -> tuple[str | None, str] | None:
    """(rollout_id or None, resource) for a model-call path, else None: the routes in Bridge.routes()."""
    if path.startswith(BRIDGE_PREFIX):
        route = model_call_route(path)
        resource = _MODEL_PATHS.get(route[1]) if route is not None else None
        return (route[0], resource) if route is not None and resource else None
    resource = _MODEL_PATHS.get(path[1:])
    return (None, resource) if resource else None


_NOT_JSON = "Upstream model callback returned a non-JSON response"
_NOT_AN_OBJECT = "Upstream model callback response must be a JSON object"


def _not_a_json_object(body: bytes) -> UpstreamError | None:
    """Why `body` is not one JSON object, by the json module's rules (what _decode accepts), or None.

    orjson first: it is several times faster and accepts nothing json refuses (what it refuses, json
    decides: NaN, integers past 64 bits, a BOM). Only the shape matters, so its reading of wide
    integers as floats does not.
    """
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        try:
            payload = json.loads(body)
        except ValueError:
            return UpstreamError(_NOT_JSON)
    return None if isinstance(payload, dict) else UpstreamError(_NOT_AN_OBJECT)


async def _read_body(receive: Receive) -> bytes:
    """The request body, as Starlette's Request.body() reads it (ClientDisconnect if the client left)."""
    message = await receive()
    if message["type"] != "http.request":
        raise ClientDisconnect
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        return body  # the common case: one message
    chunks = [body]
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientDisconnect
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


class _JSONAnswer:
    """A model call's JSON answer as Starlette's Response would send it, without building one."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, body: bytes, passed: tuple[tuple[str, str], ...]) -> None:
        self.status = status
        self.body = body
        self.headers = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in passed]
        if status >= 200 and status not in (204, 304):  # these carry no length (Starlette's rule too)
            self.headers.append((b"content-length", str(len(body)).encode()))
        self.headers.append((b"content-type", b"application/json"))

    async def __call__(self, _scope: Scope, _receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        await send({"type": "http.response.body", "body": self.body})


class Bridge:
    def __init__(
        self,
        service: TrialService,
        policy: CallbackPolicy,
        forwarder: Forwarder,
        *,
        keepalive_s: float = 15.0,
        observers: Observers | None = None,
    ) -> None:
        self._service = service
        self._observers = observers or Observers()
        self._policy = policy
        self.forwarder = forwarder
        self._keepalive_s = keepalive_s

    def routes(self) -> list[Route]:
        """The bridge's paths, for Starlette's router. The gateway answers POSTs to them before routing
        (gateway/app.py, with __call__), so the router's part is the rest: 405 for other methods."""
        routes = []
        for prefixed in (
            f"{BRIDGE_PREFIX}{{rollout_id}}",
            f"{BRIDGE_PREFIX}{{rollout_id}}/{TOKEN_CAPTURE_SEGMENT}",
        ):
            routes.append(Route(f"{prefixed}/api/hello", self.hello, methods=["GET", "HEAD"]))
            routes += [Route(f"{prefixed}/v1/{resource}", self, methods=["POST"]) for resource in RESOURCES]
        routes += [Route(f"/v1/{resource}", self, methods=["POST"]) for resource in RESOURCES]
        return routes

    async def hello(self, _request: Request) -> Response:
        # Claude Code probes its base URL before the first call.
        return Response(status_code=200)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI app of model calls (a POST to a path match_model_call() knows).

        Every model turn of every trial crosses here, so this is the gateway's hottest path: it reads the
        body and sends the answer with ASGI messages, not Starlette's Request and Response objects, and
        the gateway calls it before Starlette's middleware and routing (each cost about as much CPU as a
        check the bridge makes, bench/bridge.py).
        """
        target = match_model_call(scope["path"])
        if target is None:  # not a model call after all: the router's 404
            await error_response(TrialNotFoundError(_NO_ROLLOUT))(scope, receive, send)
            return
        try:
            answer = await self.answer(receive, *target)
        except ClientDisconnect:
            return  # nobody is left to answer
        await answer(scope, receive, send)

    async def answer(self, receive: Receive, rollout_id: str | None, resource: str) -> ASGIApp:
        """One model call, from its request to its answer; every refusal comes from the error table."""
        try:
            trial = self._live(rollout_id, resource) if rollout_id is not None else None
            raw_body = await _read_body(receive)
            if trial is None:
                self._tagged(raw_body, resource)
            return await self.handle(raw_body, trial, resource)
        except RelaxGymError as exc:
            return error_response(exc)

    def _live(self, rollout_id: str, resource: str) -> Trial:
        """The active trial of a live rollout id (or of the id a re-dispatched attempt's ``<id>-a<n>``
        names): looked up once per call (the trial is passed on), else RolloutUnavailableError, observed
        like a refused call."""
        try:
            return self._service.live(rollout_id)
        except RolloutUnavailableError as exc:
            base = attempt_of(rollout_id)
            if base is not None:
                with contextlib.suppress(RolloutUnavailableError):
                    return self._service.live(base)
            raise self._unavailable(resource, exc) from None

    def _unavailable(
        self, resource: str, exc: RolloutUnavailableError | None = None
    ) -> RolloutUnavailableError:
        exc = exc or RolloutUnavailableError("callback capability is unavailable")
        if self._observers:
            self._observe(None, resource, _Answer(error=exc), 0.0)
        return exc

    def _tagged(self, raw_body: bytes, resource: str) -> None:
        """Refuse an un-prefixed call unless its body names a live rollout id, without parsing it.

        The pattern cannot match inside a JSON string (quotes there are escaped), so a match is a real
        key; which one is metadata's is decided after parsing (rollout_id_from_body), and checked again.
        """
        found = False
        for match in _TAG_RE.finditer(raw_body):
            found = True
            if self._service.is_live(match.group(1).decode("ascii", "replace")):
                return
        if not found:
            raise TrialNotFoundError(_NO_ROLLOUT)
        raise self._unavailable(resource)

    async def handle(self, raw_body: bytes, trial: Trial | None, resource: str) -> ASGIApp:
        """A model call whose body has been read: of `trial` (its path named it), else of the trial its
        metadata tag names."""
        # Lone surrogates are refused when the forwarded body is encoded (jsonutil.dumps): no second pass
        # unless the call streams (below).
        body = jsonutil.loads(raw_body, check_unicode=False)
        if not isinstance(body, dict):
            raise ProtocolError("Callback body must be a JSON object")
        if trial is None:
            tagged = rollout_id_from_body(body)
            if tagged is None:
                raise TrialNotFoundError(_NO_ROLLOUT)
            trial = self._live(tagged, resource)
        if not body.get("stream"):
            answer = await self._call(trial, resource, body)
            return self._plain(resource, body, answer)
        # A stream commits to 200: what would fail inside it is refused before it starts (the body was
        # read since the trial was found: it may have ended meanwhile).
        if not self._service.is_active(trial):
            raise self._unavailable(resource)
        jsonutil.refuse_lone_surrogates(body, raw_body)
        if resource == "messages":
            return self._sse(self._messages_stream(trial, body))
        return await self._openai_stream(trial, resource, body)

    # ---- one call -----------------------------------------------------------------------------------

    async def _call(self, trial: Trial, resource: str, body: dict[str, Any]) -> _Answer:
        started = time.monotonic()
        target: CallbackTarget | None = None
        sent: bytes | None = None
        try:
            target, scope = self._service.callback(trial)
            reply: UpstreamReply | None = None
            with scope:  # cancelled when the trial is aborted or expires (then reply stays None)
                endpoint = target.endpoint
                url = upstream_url(self._policy.canonical_base(endpoint.base_url), resource)
                payload = upstream_body(
                    body, model=endpoint.model, sampling_params=target.generation.sampling_params
                )
                headers = {
                    **endpoint.headers,
                    endpoint.api_key_header: f"{endpoint.api_key_prefix}{endpoint.api_key}",
                    "Content-Type": "application/json",
                }
                label = f"request_id={target.request_id} resource={resource}"
                # The agent's body as loads() read it, with the trial's checked sampling params and alias.
                sent = jsonutil.dumps(payload, parsed=True)
                reply = await self.forwarder.forward(
                    url,
                    headers=headers,
                    body=sent,
                    remaining_s=target.remaining_s,
                    label=label,
                )
            answer = (
                _Answer(reply=reply)
                if reply is not None
                else _Answer(error=RolloutUnavailableError("callback capability is unavailable"))
            )
        except (RolloutUnavailableError, UpstreamError) as exc:
            answer = _Answer(error=exc)
        seconds = time.monotonic() - started
        if target is not None and target.trajectory is not None and sent is not None:
            self._record(target.trajectory, resource, sent, answer, seconds)
        if self._observers:
            self._observe(target, resource, answer, seconds)
        return answer

    @staticmethod
    def _record(trajectory: Recorder, resource: str, sent: bytes, answer: _Answer, seconds: float) -> None:
        reply, error = answer.reply, answer.error
        trajectory.model_call(
            resource,
            sent,
            status=answer.status,
            answer=reply.body if reply is not None else None,
            streamed=reply is not None and reply.content_type.startswith("text/event-stream"),
            seconds=seconds,
            attempts=answer.attempts,
            error=str(error) if error is not None else None,
        )

    def _observe(self, target: CallbackTarget | None, resource: str, answer: _Answer, seconds: float) -> None:
        environment, config = target.env if target is not None else ("", "")
        self._observers.callback(
            CallbackOutcome(
                request_id=target.request_id if target is not None else "",
                environment=environment,
                config=config,
                resource=resource,
                status=answer.status,
                attempts=answer.attempts,
                seconds=seconds,
            )
        )

    def _decode(self, resource: str, request_body: dict[str, Any], reply: UpstreamReply) -> Any:
        """The upstream JSON object (repaired for Responses), or UpstreamError."""
        try:
            payload = jsonutil.loads_as_json(reply.body)  # NaN and the like: refused when re-encoded
        except ValueError:
            raise UpstreamError(_NOT_JSON) from None
        if not isinstance(payload, dict):
            raise UpstreamError(_NOT_AN_OBJECT)
        if resource == "responses" and reply.status < 400:
            payload = repair_responses(payload, request_body)
        return payload

    def _plain(self, resource: str, request_body: dict[str, Any], answer: _Answer) -> ASGIApp:
        if answer.reply is None:
            assert answer.error is not None
            return error_response(answer.error)
        reply = answer.reply
        if request_body.get("stream") and reply.content_type.startswith("text/event-stream"):
            return Response(
                reply.body,
                reply.status,
                {**SSE_HEADERS, **dict(reply.headers)},
                media_type="text/event-stream",
            )
        if resource == "responses" and reply.status < 400:
            try:
                payload = self._decode(resource, request_body, reply)
                return json_response(payload, reply.status, dict(reply.headers))
            except UpstreamError as exc:
                return error_response(exc)
            except ValueError:  # NaN or a lone surrogate from upstream: nothing valid to pass on
                return error_response(UpstreamError("Upstream model callback returned invalid JSON"))
        problem = _not_a_json_object(reply.body)  # passed on as it came: only its shape is checked
        if problem is not None:
            return error_response(problem)
        return _JSONAnswer(reply.status, reply.body, reply.headers)

    # ---- streaming ----------------------------------------------------------------------------------

    @staticmethod
    def _sse(chunks: AsyncIterator[bytes]) -> StreamingResponse:
        return StreamingResponse(chunks, 200, SSE_HEADERS, media_type="text/event-stream")

    def _stream_result(self, resource: str, body: dict[str, Any], answer: _Answer) -> bytes:
        """The SSE bytes that end a committed stream: the upstream events, or one in-band error."""
        if answer.reply is None:
            return _sse_error(resource, str(answer.error))
        reply = answer.reply
        if reply.content_type.startswith("text/event-stream") and reply.status < 400:
            return reply.body
        try:
            payload = self._decode(resource, body, reply)
        except UpstreamError as exc:
            return _sse_error(resource, str(exc))
        if reply.status >= 400:
            return _sse_error(resource, "Upstream model callback failed", payload)
        return _sse_error(resource, "Upstream model callback returned a non-SSE response")

    async def _messages_stream(self, trial: Trial, body: dict[str, Any]) -> AsyncIterator[bytes]:
        yield PING
        task = asyncio.ensure_future(self._call(trial, "messages", body))
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=self._keepalive_s)
                if done:
                    break
                yield PING
            yield self._stream_result("messages", body, task.result())
        finally:
            task.cancel()  # the agent went away: stop the upstream call too

    async def _openai_stream(self, trial: Trial, resource: str, body: dict[str, Any]) -> ASGIApp:
        task = asyncio.ensure_future(self._call(trial, resource, body))
        done, _ = await asyncio.wait({task}, timeout=self._keepalive_s)
        if done:
            return self._plain(resource, body, task.result())

        async def chunks() -> AsyncIterator[bytes]:
            try:
                while True:
                    yield KEEPALIVE
                    finished, _ = await asyncio.wait({task}, timeout=self._keepalive_s)
                    if finished:
                        break
                yield self._stream_result(resource, body, task.result())
            finally:
                task.cancel()

        return self._sse(chunks())
