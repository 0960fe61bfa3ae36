"""Optional bearer-token auth on the trial API (`RELAX_GYM_API_TOKEN`).

Only the trial API (`/v1/trials...`, `/v1/trajectories`) is guarded: health, readiness, OpenAPI and
metrics stay open to probes and scrapers, and model calls are authorised by their trial's live rollout id
(agents never hold the API token). The token is compared in constant time and never echoed or logged.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from relax_gym_core.errors import UnauthorizedError
from relax_gym_core.web import error_response

GUARDED_PREFIX = "/v1/trials"
GUARDED_PATHS = frozenset({GUARDED_PREFIX, "/v1/trajectories"})
_REFUSED = "missing or wrong API token (Authorization: Bearer ...)"


def _presented(scope: Scope) -> bytes:
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, credentials = value.partition(b" ")
            return credentials.strip() if scheme.lower() == b"bearer" else b""
    return b""


def bearer_auth(token: str) -> Callable[[ASGIApp], ASGIApp]:
    """Starlette middleware requiring `Authorization: Bearer <token>` on the trial API."""
    expected = token.encode("ascii")

    def wrap(app: ASGIApp) -> ASGIApp:
        async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
            if (
                scope["type"] == "http"
                and _guarded(scope["path"])
                and not hmac.compare_digest(_presented(scope), expected)
            ):
                answer = error_response(UnauthorizedError(_REFUSED))
                await answer(scope, receive, send)
                return
            await app(scope, receive, send)

        return guarded

    return wrap


def _guarded(path: str) -> bool:
    return path in GUARDED_PATHS or path.startswith(GUARDED_PREFIX + "/")
