"""What the scripted policy received (RecordedRequest) and what it answers (ModelReply, ErrorReply,
RawReply, and the reply_* helpers), plus Gate, which holds a reply back until a test opens it."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

from attrs import evolve, field, frozen

from relax_gym_core.policies.formats import (
    anthropic_message,
    anthropic_sse,
    chat_completion,
    chat_completion_sse,
    responses_object,
    responses_sse,
)

type Resource = Literal["chat/completions", "responses", "messages"]
type FinishReason = Literal["stop", "length", "tool_calls"]

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_CHAT_PREAMBLE = b": connected\n\n"
_MESSAGES_PREAMBLE = b'event: ping\ndata: {"type":"ping"}\n\n'


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# ---- what arrived ------------------------------------------------------------------------------------


@frozen(kw_only=True)
class RecordedRequest:
    """One request as the policy server saw it."""

    method: str
    path: str
    query: str
    headers: Mapping[str, str]  # names lower-cased; repeated headers joined with ", "
    body: Any  # the parsed JSON body, or None if it was not JSON
    raw_body: bytes = field(repr=False)
    resource: Resource | None  # None for paths that are not a model route

    @property
    def stream(self) -> bool:
        return isinstance(self.body, dict) and bool(self.body.get("stream"))

    @property
    def bearer(self) -> str | None:
        """The token of an `Authorization: Bearer <token>` header, else None."""
        scheme, _, token = self.headers.get("authorization", "").partition(" ")
        return token.strip() if scheme.lower() == "bearer" and token.strip() else None

    @property
    def model(self) -> Any:
        return self.body.get("model") if isinstance(self.body, dict) else None


# ---- gates -------------------------------------------------------------------------------------------


class Gate:
    """Holds back the replies that reference it until `open()`; `open()` is safe from any thread/loop.

    (A plain asyncio.Event cannot be used across the test's loop and the server thread's loop.)
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._opened = False
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    @property
    def is_open(self) -> bool:
        return self._opened

    def open(self) -> None:
        with self._lock:
            self._opened = True
            waiters, self._waiters = self._waiters, []
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # that loop is already closed: nobody waits
                loop.call_soon_threadsafe(event.set)

    async def wait(self) -> None:
        event = asyncio.Event()
        with self._lock:
            if self._opened:
                return
            self._waiters.append((asyncio.get_running_loop(), event))
        await event.wait()


# ---- what to answer ----------------------------------------------------------------------------------


@frozen
class ToolCall:
    """One function call of the assistant; `arguments` is a JSON object or its JSON text."""

    name: str
    arguments: Mapping[str, Any] | str = field(factory=dict)
    id: str | None = None

    def arguments_text(self) -> str:
        return self.arguments if isinstance(self.arguments, str) else _dumps(dict(self.arguments))

    def arguments_object(self) -> Any:
        return json.loads(self.arguments) if isinstance(self.arguments, str) else dict(self.arguments)

    def call_id(self, index: int) -> str:
        if self.id is not None:
            return self.id
        # Deterministic, like Relax's ids (a hash of the call), so tests can predict them.
        digest = hashlib.sha256(f"{index}:{self.name}:{self.arguments_text()}".encode()).hexdigest()
        return f"call_{digest[:24]}"


@frozen(kw_only=True)
class Rendered:
    """The HTTP answer for one request: `preamble` (streams only) goes out before the gate opens."""

    status: int
    content_type: str
    body: bytes
    headers: Mapping[str, str] = field(factory=dict)
    preamble: bytes | None = None


@frozen(kw_only=True)
class ModelReply:
    """An assistant turn, rendered in the request's API format (and as buffered SSE if it streams)."""

    text: str | None = "ok"
    tool_calls: tuple[ToolCall, ...] = ()
    reasoning: str | None = None
    finish_reason: FinishReason | None = None  # default: tool_calls if there are calls, else stop
    input_tokens: int = 11
    output_tokens: int = 7
    status: int = 200
    headers: Mapping[str, str] = field(factory=dict)
    gate: Gate | None = None

    @property
    def finish(self) -> FinishReason:
        if self.finish_reason is not None:
            return self.finish_reason
        return "tool_calls" if self.tool_calls else "stop"

    def held(self, gate: Gate) -> ModelReply:
        return evolve(self, gate=gate)

    def render(self, request: RecordedRequest, *, default_model: str) -> Rendered:
        model = request.model if isinstance(request.model, str) else default_model
        resource = request.resource or "chat/completions"
        if not request.stream:
            builders = {
                "chat/completions": chat_completion,
                "responses": responses_object,
                "messages": anthropic_message,
            }
            payload = builders[resource](self, model=model)
            return Rendered(
                status=self.status,
                content_type="application/json",
                body=_dumps(payload).encode(),
                headers=self.headers,
            )
        streams = {
            "chat/completions": (_CHAT_PREAMBLE, chat_completion_sse),
            "responses": (_CHAT_PREAMBLE, responses_sse),
            "messages": (_MESSAGES_PREAMBLE, anthropic_sse),
        }
        preamble, build = streams[resource]
        return Rendered(
            status=self.status,
            content_type="text/event-stream",
            body=build(self, model=model),
            headers={**SSE_HEADERS, **self.headers},
            preamble=preamble,
        )


@frozen(kw_only=True)
class ErrorReply:
    """A JSON error in Relax's shape: OpenAI `{"error": {...}}`, or `{"type": "error", ...}` on /messages."""

    status: int
    message: str
    type: str = "invalid_request_error"
    code: str | None = None
    param: str | None = None
    headers: Mapping[str, str] = field(factory=dict)
    gate: Gate | None = None

    def held(self, gate: Gate) -> ErrorReply:
        return evolve(self, gate=gate)

    def render(self, request: RecordedRequest, *, default_model: str) -> Rendered:
        payload: dict[str, Any]
        if request.resource == "messages":
            payload = {"type": "error", "error": {"type": self.type, "message": self.message}}
        else:
            payload = {
                "error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
            }
        return Rendered(
            status=self.status,
            content_type="application/json",
            body=_dumps(payload).encode(),
            headers=self.headers,
        )


@frozen(kw_only=True)
class RawReply:
    """Exactly these bytes (any status, any content type): proxy HTML pages, bad JSON, custom SSE."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: Mapping[str, str] = field(factory=dict)
    gate: Gate | None = None

    def held(self, gate: Gate) -> RawReply:
        return evolve(self, gate=gate)

    def render(self, request: RecordedRequest, *, default_model: str) -> Rendered:
        return Rendered(
            status=self.status, content_type=self.content_type, body=self.body, headers=self.headers
        )


type ScriptedReply = ModelReply | ErrorReply | RawReply
type Script = Callable[[RecordedRequest], ScriptedReply | Awaitable[ScriptedReply]]


def reply_text(text: str = "ok", **fields: Any) -> ModelReply:
    """The assistant answers `text` (extra fields: reasoning, finish_reason, token counts, gate...)."""
    return ModelReply(text=text, **fields)


def reply_tool_calls(*calls: ToolCall, text: str | None = None, **fields: Any) -> ModelReply:
    """The assistant calls these tools (optionally with some text besides)."""
    return ModelReply(text=text, tool_calls=calls, **fields)


def reply_error(
    status: int, message: str, *, type: str = "invalid_request_error", code: str | None = None, **fields: Any
) -> ErrorReply:
    return ErrorReply(status=status, message=message, type=type, code=code, **fields)


def reply_json(status: int, body: Any, **fields: Any) -> RawReply:
    """This JSON value verbatim, with this status."""
    return RawReply(status=status, body=_dumps(body).encode(), content_type="application/json", **fields)


def reply_raw(status: int, body: str | bytes, *, content_type: str = "text/plain", **fields: Any) -> RawReply:
    """These bytes verbatim (e.g. a proxy's HTML error page)."""
    data = body.encode() if isinstance(body, str) else body
    return RawReply(status=status, body=data, content_type=content_type, **fields)


def default_script(_request: RecordedRequest) -> ScriptedReply:
    return ModelReply()
