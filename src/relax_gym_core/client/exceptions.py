"""Client-side refinements of the project's error tree (relax_gym_core.errors).

Every message is safe to print: no tokens, no request bodies; a gateway's reason only as sanitised by
relax_gym_core.client.diagnosis.
"""

from __future__ import annotations

from relax_gym_core.errors import ClientError, GatewayRequestError, TrialFailedError
from relax_gym_core.protocol import TrialSnapshot


class ClientConfigError(ClientError, ValueError):
    """A RELAX_* / NEMO_GYM_* variable or the session input file is invalid (the message names it)."""


class TrialCancelledError(ClientError):
    """The managed session was stopped (SIGTERM/SIGINT or the caller's stop event)."""

    def __init__(self, message: str, *, signum: int | None = None) -> None:
        super().__init__(message)
        self.signum = signum  # the signal that stopped the session, when one did


class TrialGoneError(GatewayRequestError):
    """The gateway does not know the trial any more (HTTP 404): never created, expired, or lost."""

    def __init__(
        self, message: str, *, expired: bool = False, restarted: bool = False, detail: str | None = None
    ) -> None:
        super().__init__(message, status_code=404, detail=detail)
        self.expired = expired
        self.restarted = restarted


class RemoteTrialError(TrialFailedError):
    """The trial reached a terminal state that must not be exported; carries that snapshot."""

    def __init__(self, message: str, *, snapshot: TrialSnapshot) -> None:
        super().__init__(message)
        self.snapshot = snapshot
