"""HTTP answers shared by the gateway and the bridge: the one error -> status table, JSON responses."""

from __future__ import annotations

import contextlib
import logging
import math
import traceback

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from relax_gym_core import errors
from relax_gym_core.protocol import jsonutil

logger = logging.getLogger("relax_gym.gateway")

STATUS_CODES: dict[type[errors.RelaxGymError], int] = {
    errors.InvalidJSONError: 400,
    errors.ProtocolError: 422,
    errors.TrialNotFoundError: 404,
    errors.TrialExpiredError: 404,
    errors.TrialConflictError: 409,
    errors.QueueFullError: 429,
    errors.EnvironmentNotRegisteredError: 400,
    errors.PolicyMismatchError: 400,
    errors.DeadlineTooLongError: 400,
    errors.ServiceClosingError: 503,
    errors.StoreUnavailableError: 503,
    errors.UnauthorizedError: 401,
    errors.RolloutUnavailableError: 410,
    errors.CallbackURLRejectedError: 400,
    errors.UpstreamError: 502,
    errors.BodyTooLargeError: 413,
}


def status_for(exc: BaseException) -> int:
    """Most specific entry along the MRO; anything unmapped is our bug (500)."""
    for cls in type(exc).__mro__:
        if cls in STATUS_CODES:
            return STATUS_CODES[cls]
    return 500


def json_response(payload: object, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(jsonutil.dumps(payload), status_code, headers, media_type="application/json")


def error_response(exc: BaseException) -> Response:
    headers: dict[str, str] = {}
    if isinstance(exc, errors.QueueFullError):
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
    elif isinstance(exc, errors.UnauthorizedError):
        headers["WWW-Authenticate"] = "Bearer"
    elif isinstance(exc, errors.ServiceClosingError):
        headers["Retry-After"] = "5"  # a replacement gateway is usually up by then
    elif isinstance(exc, errors.StoreUnavailableError):
        headers["Retry-After"] = "1"  # the ledger retries its write within seconds
    elif isinstance(exc, (errors.UpstreamError, errors.RolloutUnavailableError)):
        # The model call may already have been delivered (or the trial is over): an SDK must not replay it.
        headers["x-should-retry"] = "false"
    return json_response({"detail": str(exc)}, status_for(exc), headers)


async def handle_relax_gym_error(_request: Request, exc: Exception) -> Response:
    return error_response(exc)


async def handle_http_exception(_request: Request, exc: Exception) -> Response:
    # Routing errors (unknown path, wrong method) keep the {"detail": ...} shape of every other answer.
    assert isinstance(exc, HTTPException)
    return json_response({"detail": exc.detail}, exc.status_code, dict(exc.headers or {}))


def log_unexpected(exc: BaseException) -> None:
    """Log a bug: the exception's type and where it was raised, never its message.

    Messages of library errors quote their input (an HTTP client's "Invalid header value: Bearer <key>"),
    and the input may be a credential; the frames say where to look without saying what was there.
    """
    frames = "".join(traceback.format_tb(exc.__traceback__))
    logger.error("unhandled error in the gateway: %s (message withheld)\n%s", type(exc).__name__, frames)


def contain_errors(app: ASGIApp) -> ASGIApp:
    """Outermost middleware: an exception that escapes everything else is logged by log_unexpected() and
    answered 500 (when nothing was sent yet), instead of reaching Starlette's error middleware and the
    server, which log it with its message."""

    async def contained(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await app(scope, receive, send)
        except ClientDisconnect:
            return  # nobody is left to answer
        except Exception as exc:  # noqa: BLE001 - this is the last place an error can be answered
            log_unexpected(exc)
            if scope["type"] == "http":
                # Refused by the server when a response had already begun; then there is nothing to add.
                with contextlib.suppress(Exception):
                    await json_response({"detail": "internal error"}, 500)(scope, receive, send)

    return contained
