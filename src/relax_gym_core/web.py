"""HTTP answers shared by the gateway and the bridge: the one error -> status table, JSON responses."""

from __future__ import annotations

import logging
import math

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

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
    errors.UnauthorizedError: 401,
    errors.CapabilityUnavailableError: 410,
    errors.CallbackURLRejectedError: 400,
    errors.UpstreamError: 502,
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
    elif isinstance(exc, (errors.UpstreamError, errors.CapabilityUnavailableError)):
        # The model call may already have been delivered (or the trial is over): an SDK must not replay it.
        headers["x-should-retry"] = "false"
    return json_response({"detail": str(exc)}, status_for(exc), headers)


async def handle_relax_gym_error(_request: Request, exc: Exception) -> Response:
    return error_response(exc)


async def handle_http_exception(_request: Request, exc: Exception) -> Response:
    # Routing errors (unknown path, wrong method) keep the {"detail": ...} shape of every other answer.
    assert isinstance(exc, HTTPException)
    return json_response({"detail": exc.detail}, exc.status_code, dict(exc.headers or {}))


async def handle_unexpected(_request: Request, exc: Exception) -> Response:
    logger.error("unhandled error in the gateway", exc_info=exc)
    return json_response({"detail": "internal error"}, 500)
