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

import asyncio
import contextlib
import hashlib
import inspect
import json
import secrets
import socket
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping
from typing import Any, Literal

import anyio.to_thread
import uvicorn
from attrs import evolve, field, frozen
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

__all__ = [
    "ErrorReply",
    "Gate",
    "ModelReply",
    "RawReply",
    "RecordedRequest",
    "Rendered",
    "Resource",
    "Script",
    "ScriptedPolicy",
    "ScriptedReply",
    "ThreadedServer",
    "ToolCall",
    "anthropic_message",
    "anthropic_sse",
    "chat_completion",
    "chat_completion_sse",
    "default_script",
    "reply_error",
    "reply_json",
    "reply_raw",
    "reply_text",
    "reply_tool_calls",
    "responses_object",
    "responses_sse",
    "run_policy",
    "serve_in_thread",
]

type Resource = Literal["chat/completions", "responses", "messages"]
type FinishReason = Literal["stop", "length", "tool_calls"]

PREFIX = "/agentic_api"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_CHAT_PREAMBLE = b": connected\n\n"
_MESSAGES_PREAMBLE = b'event: ping\ndata: {"type":"ping"}\n\n'
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _hex(n: int) -> str:
    return secrets.token_hex(n)


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


# ---- wire formats ------------------------------------------------------------------------------------


def _chat_message(reply: ModelReply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text}
    if reply.reasoning is not None:
        message["reasoning_content"] = reply.reasoning
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": call.call_id(i),
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments_text()},
            }
            for i, call in enumerate(reply.tool_calls)
        ]
    return message


def _chat_usage(reply: ModelReply) -> dict[str, int]:
    return {
        "prompt_tokens": reply.input_tokens,
        "completion_tokens": reply.output_tokens,
        "total_tokens": reply.input_tokens + reply.output_tokens,
    }


def chat_completion(reply: ModelReply, *, model: str) -> dict[str, Any]:
    """A `chat.completion` object as Relax returns it."""
    return {
        "id": f"chatcmpl_{_hex(16)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": _chat_message(reply), "logprobs": None, "finish_reason": reply.finish}
        ],
        "usage": _chat_usage(reply),
    }


def chat_completion_sse(reply: ModelReply, *, model: str) -> bytes:
    """Buffered SSE: one `chat.completion.chunk` (whole delta, finish reason, usage), then [DONE]."""
    delta = _chat_message(reply)
    if "tool_calls" in delta:
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(delta["tool_calls"])]
    chunk = {
        "id": f"chatcmpl_{_hex(16)}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reply.finish}],
        "usage": _chat_usage(reply),
    }
    return f"data: {_dumps(chunk)}\n\ndata: [DONE]\n\n".encode()


def _responses_items(reply: ModelReply) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if reply.reasoning is not None:
        # Relax puts the text in `content`; the summary is left for the bridge to rebuild.
        items.append(
            {
                "type": "reasoning",
                "id": f"rs_{_hex(12)}",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": reply.reasoning}],
                "status": "completed",
            }
        )
    if reply.text is not None:
        items.append(
            {
                "type": "message",
                "id": f"msg_{_hex(12)}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": reply.text, "annotations": []}],
            }
        )
    for i, call in enumerate(reply.tool_calls):
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{_hex(12)}",
                "call_id": call.call_id(i),
                "name": call.name,
                "arguments": call.arguments_text(),
                "status": "completed",
            }
        )
    return items


def responses_object(reply: ModelReply, *, model: str) -> dict[str, Any]:
    """An `object: response` as Relax returns it: no tools/tool_choice/parallel_tool_calls, bare usage."""
    incomplete = reply.finish == "length"
    return {
        "id": f"resp_{_hex(16)}",
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "error": None,
        "output": _responses_items(reply),
        "usage": {
            "input_tokens": reply.input_tokens,
            "output_tokens": reply.output_tokens,
            "total_tokens": reply.input_tokens + reply.output_tokens,
        },
    }


def _sse_event(name: str, data: Mapping[str, Any]) -> str:
    return f"event: {name}\ndata: {_dumps(data)}\n\n"


def responses_sse(reply: ModelReply, *, model: str) -> bytes:
    """Buffered SSE: response.created, per item added (+ text / argument events) and done, completed."""
    final = responses_object(reply, model=model)
    events: list[tuple[str, dict[str, Any]]] = [
        ("response.created", {"response": {**final, "status": "in_progress", "output": [], "usage": None}})
    ]
    for index, item in enumerate(final["output"]):
        kind = item["type"]
        if kind == "message":
            added = {**item, "status": "in_progress", "content": []}
            events.append(("response.output_item.added", {"output_index": index, "item": added}))
            for part_index, part in enumerate(item["content"]):
                where = {"item_id": item["id"], "output_index": index, "content_index": part_index}
                empty = {**part, "text": ""}
                events.append(("response.content_part.added", {**where, "part": empty}))
                events.append(
                    ("response.output_text.delta", {**where, "delta": part["text"], "logprobs": []})
                )
                events.append(("response.output_text.done", {**where, "text": part["text"], "logprobs": []}))
                events.append(("response.content_part.done", {**where, "part": part}))
        elif kind == "function_call":
            added = {**item, "status": "in_progress", "arguments": ""}
            events.append(("response.output_item.added", {"output_index": index, "item": added}))
            where = {"item_id": item["id"], "output_index": index}
            events.append(("response.function_call_arguments.delta", {**where, "delta": item["arguments"]}))
            events.append(
                (
                    "response.function_call_arguments.done",
                    {**where, "name": item["name"], "arguments": item["arguments"]},
                )
            )
        else:
            events.append(("response.output_item.added", {"output_index": index, "item": item}))
        events.append(("response.output_item.done", {"output_index": index, "item": item}))
    end = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
    events.append((end, {"response": final}))
    return "".join(
        _sse_event(name, {"type": name, "sequence_number": n, **data})
        for n, (name, data) in enumerate(events)
    ).encode()


def _anthropic_blocks(reply: ModelReply) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if reply.reasoning is not None:
        blocks.append({"type": "thinking", "thinking": reply.reasoning, "signature": _hex(16)})
    if reply.text is not None:
        blocks.append({"type": "text", "text": reply.text})
    blocks.extend(
        {"type": "tool_use", "id": call.call_id(i), "name": call.name, "input": call.arguments_object()}
        for i, call in enumerate(reply.tool_calls)
    )
    return blocks


def anthropic_message(reply: ModelReply, *, model: str) -> dict[str, Any]:
    """A Messages API `type: message` as Relax returns it."""
    return {
        "id": f"msg_{_hex(16)}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": _anthropic_blocks(reply),
        "stop_reason": _STOP_REASONS[reply.finish],
        "stop_sequence": None,
        "usage": {"input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens},
    }


def anthropic_sse(reply: ModelReply, *, model: str) -> bytes:
    """Buffered SSE: message_start, per block start / one delta / stop, message_delta, message_stop."""
    final = anthropic_message(reply, model=model)
    start = {
        **final,
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": reply.input_tokens, "output_tokens": 0},
    }
    events: list[tuple[str, dict[str, Any]]] = [("message_start", {"message": start})]
    for index, block in enumerate(final["content"]):
        deltas: list[dict[str, Any]]
        if block["type"] == "text":
            empty: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": block["text"]}]
        elif block["type"] == "thinking":
            empty = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [
                {"type": "thinking_delta", "thinking": block["thinking"]},
                {"type": "signature_delta", "signature": block["signature"]},
            ]
        else:
            empty = {**block, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": _dumps(block["input"])}]
        events.append(("content_block_start", {"index": index, "content_block": empty}))
        events.extend(("content_block_delta", {"index": index, "delta": delta}) for delta in deltas)
        events.append(("content_block_stop", {"index": index}))
    events.append(
        (
            "message_delta",
            {
                "delta": {"stop_reason": final["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": reply.output_tokens},
            },
        )
    )
    events.append(("message_stop", {}))
    return "".join(_sse_event(name, {"type": name, **data}) for name, data in events).encode()


# ---- serving an ASGI app from a thread ----------------------------------------------------------------


class ThreadedServer:
    """Real uvicorn on a loopback socket (port 0 by default) in a daemon thread; stop() ends it."""

    def __init__(self, app: Starlette, *, host: str = "127.0.0.1", port: int = 0) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        bound_host, bound_port = self._sock.getsockname()[:2]
        self.url = (
            f"http://[{bound_host}]:{bound_port}"
            if ":" in bound_host
            else f"http://{bound_host}:{bound_port}"
        )
        config = uvicorn.Config(
            app,
            log_level="warning",
            log_config=None,  # leave the process's logging configuration alone
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=5,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name=f"uvicorn {self.url}", daemon=True)
        self._failure: BaseException | None = None
        self._started = False

    def _run(self) -> None:
        try:
            self._server.run(sockets=[self._sock])
        except BaseException as exc:  # noqa: BLE001 - reported to the starting thread (SystemExit included)
            self._failure = exc

    def start(self, timeout_s: float = 30.0) -> None:
        self._thread.start()
        self._started = True
        stop_at = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > stop_at:
                self.stop()
                raise RuntimeError(f"server at {self.url} did not start") from self._failure
            time.sleep(0.005)

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._started:
            self._server.should_exit = True
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(timeout_s)
        self._sock.close()

    def __enter__(self) -> ThreadedServer:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def serve_in_thread(app: Starlette, *, host: str = "127.0.0.1", port: int = 0) -> Iterator[ThreadedServer]:
    """Serve `app` until the block exits; yields the server (`.url`)."""
    with ThreadedServer(app, host=host, port=port) as server:
        yield server


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
