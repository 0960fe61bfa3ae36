"""A scripted stand-in for Relax's per-session model API (`/agentic_api`), for tests of the bridge.

No language model runs in tests, so this is the one allowed stand-in: a small Starlette app served by
real uvicorn on a loopback port in a background thread. It records every request (path, lower-cased
headers, parsed JSON body, query string) and answers from a script in the real wire formats of the three
APIs Relax serves (Chat Completions, Responses, Anthropic Messages), including Relax's "buffered SSE"
streaming (the whole answer at once, after an initial comment / ping frame).

    with run_policy(require_token="sess-1") as policy:
        policy.enqueue(reply_tool_calls(ToolCall("search", {"q": "x"})))
        ...  # point a trial's model_endpoint.base_url at policy.base_url
        seen = policy.requests[0]
        assert seen.headers["authorization"] == "Bearer sess-1"

A script is a callable `(RecordedRequest) -> ScriptedReply` (or an awaitable of one); replies queued with
`enqueue` are used first, one per request. A reply holding a `Gate` is not answered (for streams: not
past the initial frame) until the test opens the gate, so in-flight behaviour is tested without sleeps.

Like Relax, the Responses answers deliberately omit `parallel_tool_calls`, `tool_choice`, `tools` and
`usage.input_tokens_details` / `output_tokens_details`: the bridge is expected to add them.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import threading
from collections import deque
from collections.abc import Awaitable, Collection, Iterator
from typing import Any

import anyio.to_thread
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from relax_gym_core.policies.replies import (
    ErrorReply,
    Gate,
    RecordedRequest,
    Rendered,
    Resource,
    Script,
    ScriptedReply,
    _dumps,
    default_script,
)
from relax_gym_core.policies.threaded import ThreadedServer

__all__ = ["PREFIX", "ScriptedPolicy", "run_policy"]


PREFIX = "/agentic_api"

# ---- the policy server -------------------------------------------------------------------------------


def _resource_of(path: str) -> Resource | None:
    rest = path[len(PREFIX) :] if path.startswith(PREFIX) else None
    if rest is None:
        return None
    rest = rest.removeprefix("/v1")
    if rest in ("", "/", "/chat/completions"):
        return "chat/completions"
    if rest == "/responses":
        return "responses"
    if rest == "/messages":
        return "messages"
    return None


class ScriptedPolicy:
    """The scripted `/agentic_api` server. `start()`/`stop()` or use as a context manager."""

    def __init__(
        self,
        script: Script | None = None,
        *,
        require_token: str | Collection[str] | None = None,
        model_name: str = "relax-policy",
        host: str = "127.0.0.1",
    ) -> None:
        self.script: Script = script or default_script
        self.require_token: frozenset[str] | None = (
            None
            if require_token is None
            else frozenset([require_token] if isinstance(require_token, str) else require_token)
        )
        self.model_name = model_name
        self.errors: list[BaseException] = []  # exceptions raised by the script (answered 500)
        self._host = host
        self._requests: list[RecordedRequest] = []
        self._queue: deque[ScriptedReply] = deque()
        self._changed = threading.Condition()
        self._gates: list[Gate] = []
        self._server: ThreadedServer | None = None
        model_routes = [
            f"{PREFIX}{version}{path}"
            for version in ("/v1", "")
            for path in ("/chat/completions", "/responses", "/messages")
        ]
        self.app = Starlette(
            routes=[
                *(Route(path, self._model_call, methods=["POST"]) for path in model_routes),
                Route(f"{PREFIX}/", self._model_call, methods=["POST"]),
                Route(f"{PREFIX}/models", self._models, methods=["GET"]),
                Route(f"{PREFIX}/v1/models", self._models, methods=["GET"]),
                Route(
                    "/{path:path}",
                    self._unknown,
                    methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"],
                ),
            ]
        )

    # ---- lifecycle ----

    def start(self) -> ScriptedPolicy:
        if self._server is None:
            server = ThreadedServer(self.app, host=self._host)
            server.start()
            self._server = server
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        with self._changed:
            gates = list(self._gates)
        for gate in gates:  # nothing may stay parked on a gate the test forgot to open
            gate.open()
        server.stop()

    def __enter__(self) -> ScriptedPolicy:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """The server root, e.g. http://127.0.0.1:PORT."""
        if self._server is None:
            raise RuntimeError("the scripted policy is not running")
        return self._server.url

    @property
    def base_url(self) -> str:
        """What Relax exports as RELAX_BASE_URL: http://127.0.0.1:PORT/agentic_api."""
        return f"{self.url}{PREFIX}"

    # ---- script and records ----

    def enqueue(self, *replies: ScriptedReply) -> None:
        """Answer the next requests with these replies, in order, before falling back to the script."""
        with self._changed:
            self._queue.extend(replies)

    @property
    def requests(self) -> list[RecordedRequest]:
        """A copy of every request so far, in arrival order."""
        with self._changed:
            return list(self._requests)

    def model_requests(self, resource: Resource | None = None) -> list[RecordedRequest]:
        """The requests that hit a model route (optionally only this resource)."""
        return [
            r
            for r in self.requests
            if r.resource is not None and (resource is None or r.resource == resource)
        ]

    def clear(self) -> None:
        """Forget the recorded requests, the queued replies and the script errors."""
        with self._changed:
            self._requests.clear()
            self._queue.clear()
            self.errors.clear()

    def wait_for_requests(self, count: int, *, timeout_s: float = 30.0) -> list[RecordedRequest]:
        """Block until at least `count` requests have arrived (TimeoutError otherwise); returns them."""
        with self._changed:
            if not self._changed.wait_for(lambda: len(self._requests) >= count, timeout_s):
                raise TimeoutError(f"{len(self._requests)} of {count} requests arrived within {timeout_s} s")
            return list(self._requests)

    async def wait_for_requests_async(self, count: int, *, timeout_s: float = 30.0) -> list[RecordedRequest]:
        """`wait_for_requests` without blocking the caller's event loop."""
        return await anyio.to_thread.run_sync(lambda: self.wait_for_requests(count, timeout_s=timeout_s))

    # ---- handlers ----

    async def _record(self, request: Request) -> RecordedRequest:
        raw = await request.body()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = None
        headers: dict[str, str] = {}
        for name, value in request.headers.items():
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        recorded = RecordedRequest(
            method=request.method,
            path=request.url.path,
            query=request.url.query,
            headers=headers,
            body=body,
            raw_body=raw,
            resource=_resource_of(request.url.path) if request.method == "POST" else None,
        )
        with self._changed:
            self._requests.append(recorded)
            self._changed.notify_all()
        return recorded

    def _auth_error(self, recorded: RecordedRequest) -> ErrorReply | None:
        if self.require_token is None:
            return None
        token = recorded.bearer
        if token is None:
            message = "missing or non-Bearer Authorization header"
        elif token not in self.require_token:
            message = "unknown session"
        else:
            return None
        return ErrorReply(
            status=401, message=message, type="authentication_error", code="authentication_error"
        )

    async def _next_reply(self, recorded: RecordedRequest) -> ScriptedReply:
        with self._changed:
            queued = self._queue.popleft() if self._queue else None
        if queued is not None:
            return queued
        result = self.script(recorded)
        if inspect.isawaitable(result):
            return await result
        return result

    async def _model_call(self, request: Request) -> Response:
        recorded = await self._record(request)
        auth_error = self._auth_error(recorded)
        if auth_error is not None:
            return self._plain(auth_error.render(recorded, default_model=self.model_name))
        if not isinstance(recorded.body, dict):
            error = ErrorReply(status=400, message="request body must be a JSON object")
            return self._plain(error.render(recorded, default_model=self.model_name))
        try:
            reply = await self._next_reply(recorded)
            rendered = reply.render(recorded, default_model=self.model_name)
        except Exception as exc:  # noqa: BLE001 - a broken script answers 500 and is kept for the test
            self.errors.append(exc)
            error = ErrorReply(status=500, message=f"scripted policy failed: {exc!r}", type="internal_error")
            return self._plain(error.render(recorded, default_model=self.model_name))
        gate = reply.gate
        if gate is not None:
            with self._changed:
                self._gates.append(gate)
        if rendered.preamble is None:
            if gate is not None:
                await gate.wait()
            return self._plain(rendered)
        return self._stream(rendered, gate)

    @staticmethod
    def _plain(rendered: Rendered) -> Response:
        return Response(
            rendered.body,
            rendered.status,
            dict(rendered.headers),
            media_type=rendered.content_type,
        )

    @staticmethod
    def _stream(rendered: Rendered, gate: Gate | None) -> Response:
        async def chunks() -> Any:
            # Relax commits a stream at once (connected comment / ping), then sends the whole answer.
            yield rendered.preamble
            if gate is not None:
                await gate.wait()
            yield rendered.body

        return StreamingResponse(
            chunks(), rendered.status, dict(rendered.headers), media_type=rendered.content_type
        )

    async def _models(self, request: Request) -> Response:
        await self._record(request)
        body = {"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "relax"}]}
        return Response(_dumps(body), 200, media_type="application/json")

    async def _unknown(self, request: Request) -> Response:
        recorded = await self._record(request)
        error = ErrorReply(
            status=404, message=f"no route {recorded.method} {recorded.path}", type="not_found"
        )
        return self._plain(error.render(recorded, default_model=self.model_name))


@contextlib.contextmanager
def run_policy(
    script: Script | None = None,
    *,
    require_token: str | Collection[str] | None = None,
    model_name: str = "relax-policy",
    host: str = "127.0.0.1",
) -> Iterator[ScriptedPolicy]:
    """Run a scripted policy server until the block exits."""
    with ScriptedPolicy(script, require_token=require_token, model_name=model_name, host=host) as policy:
        yield policy


class PolicyByToken:
    """One scripted policy for many trials: each trial's session token selects its behaviour.

    policy = PolicyByToken(default=lambda request: reply_text("Done."))
    with policy:
        policy.behaviours[token] = my_script  # before the trial with that token starts
        ...
        calls = policy.requests_of(token)
    """

    def __init__(self, default: Script, *, resource: Resource = "responses") -> None:
        self.default = default
        self.resource: Resource = resource
        self.behaviours: dict[str, Script] = {}
        self.server = ScriptedPolicy(self.answer)

    def answer(self, request: RecordedRequest) -> ScriptedReply | Awaitable[ScriptedReply]:
        return self.behaviours.get(request.bearer or "", self.default)(request)

    def requests_of(self, token: str) -> list[RecordedRequest]:
        """The model calls of the trial with this token, in order."""
        return [r for r in self.server.model_requests(self.resource) if r.bearer == token]

    def __enter__(self) -> PolicyByToken:
        self.server.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.stop()
