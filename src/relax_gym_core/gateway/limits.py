"""Body caps per route: 413 from Content-Length before a byte is read, or as soon as a chunked body passes
its cap. Caps and their variables are in gateway/config.py (Limits) and the README's "Operations" section.

The connection is not closed after a 413: a client still sending would get a reset instead of the
answer. The server discards the rest of the body, which the connection guard's deadlines bound.
"""

from __future__ import annotations

from collections.abc import Callable

from attrs import frozen
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from relax_gym_core.bridge.routes import RESOURCES
from relax_gym_core.errors import BodyTooLargeError
from relax_gym_core.gateway.config import Limits
from relax_gym_core.protocol import BRIDGE_PREFIX
from relax_gym_core.web import error_response

_NO_BODY_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_UNPREFIXED_CALLS = frozenset(f"/v1/{resource}" for resource in RESOURCES)


@frozen
class _Cap:
    limit: int
    variable: str

    def error(self) -> BodyTooLargeError:
        return BodyTooLargeError(f"request body is larger than {self.limit} bytes ({self.variable})")


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            # The server has already refused a malformed length (400), so this is digits.
            return int(value)
    return None


def limit_bodies(limits: Limits) -> Callable[[ASGIApp], ASGIApp]:
    """Starlette middleware capping request bodies by route (model calls, create, everything else)."""
    model_call = _Cap(limits.max_model_call_bytes, "RELAX_GYM_MAX_MODEL_CALL_BYTES")
    create = _Cap(limits.max_create_bytes, "RELAX_GYM_MAX_CREATE_BYTES")
    other = _Cap(limits.max_other_body_bytes, "RELAX_GYM_MAX_BODY_BYTES")

    def cap_for(scope: Scope) -> _Cap:
        # Cheaper than matching the route exactly, on every model call: a wrong path under the prefix
        # is answered 404 by the router whatever its cap.
        path = scope["path"]
        if path.startswith(BRIDGE_PREFIX) or path in _UNPREFIXED_CALLS:
            return model_call
        return create if path == "/v1/trials" else other

    def wrap(app: ASGIApp) -> ASGIApp:
        async def limited(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http" or scope["method"] in _NO_BODY_METHODS:
                await app(scope, receive, send)
                return
            cap = cap_for(scope)
            declared = _content_length(scope)
            if declared is not None:
                if declared > cap.limit:
                    await error_response(cap.error())(scope, receive, send)
                    return
                # The server delivers exactly the declared length: nothing left to count.
                await app(scope, receive, send)
                return
            await app(scope, _counting(receive, cap), send)

        return limited

    return wrap


def _counting(receive: Receive, cap: _Cap) -> Receive:
    """`receive` for a body of unknown length: raises BodyTooLargeError once more than the cap arrived."""
    seen = 0

    async def counted() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > cap.limit:
                raise cap.error()
        return message

    return counted
