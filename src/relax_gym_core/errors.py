"""One error tree for relax-gym.

    RelaxGymError
    ├── ProtocolError                 invalid wire data (422)
    │   └── InvalidJSONError          body is not JSON at all (400)
    ├── TrialError
    │   ├── TrialNotFoundError        unknown request_id (404)
    │   ├── TrialExpiredError         request_id known once, record evicted (404)
    │   ├── TrialConflictError        same request_id, different payload (409)
    │   ├── QueueFullError            admission refused; carries retry_after_s (429)
    │   ├── EnvironmentNotRegisteredError / PolicyMismatchError / DeadlineTooLongError (400)
    │   └── ServiceClosingError       the gateway is shutting down (503)
    ├── CallbackError
    │   ├── CapabilityUnavailableError  unknown, inactive or expired rollout capability (410)
    │   ├── CallbackURLRejectedError    model_endpoint.base_url refused by the allowlist (400)
    │   └── UpstreamError               the trainer's model API failed us (502)
    ├── ConfigError                   bad gateway/plugin configuration (startup, exit != 0)
    ├── PluginError                   a plugin failed to load or validate
    └── ClientError                   the thin client could not finish a trial
        ├── GatewayRequestError       the gateway answered with an error or not at all
        └── TrialFailedError          the trial ended without an exportable reward

HTTP status codes for these live in one table: ``relax_gym_core.web``.
Messages never contain secrets (tokens, API keys): callers pass only field names and safe values.
"""

from __future__ import annotations


class RelaxGymError(Exception):
    """Base class of every error relax-gym raises on purpose."""


class ProtocolError(RelaxGymError, ValueError):
    """Wire data does not follow relax-nemo-gym/v1 (names the field)."""


class InvalidJSONError(ProtocolError):
    """The body could not be parsed as JSON."""


class TrialError(RelaxGymError):
    """A trial operation was refused."""


class TrialNotFoundError(TrialError, LookupError):
    """No trial with this request_id."""


class TrialExpiredError(TrialError, LookupError):
    """The trial existed but its terminal record was evicted after the retention period."""


class TrialConflictError(TrialError):
    """A different payload was sent under an existing request_id."""


class QueueFullError(TrialError):
    """The environment's admission queue is full."""

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class EnvironmentNotRegisteredError(TrialError):
    """The (environment, config) pair is not registered with this gateway."""


class PolicyMismatchError(TrialError):
    """The request's interrupt_policy differs from the registered one."""


class DeadlineTooLongError(TrialError):
    """deadline_s exceeds the registered environment maximum."""


class ServiceClosingError(TrialError):
    """The gateway is shutting down and admits no new trials."""


class UnauthorizedError(TrialError):
    """The trial API requires an API token and the request did not carry it (never names the token)."""


class CallbackError(RelaxGymError):
    """A model callback could not be bridged."""


class CapabilityUnavailableError(CallbackError):
    """The rollout capability is unknown, no longer active, or past its deadline or lease."""


class CallbackURLRejectedError(CallbackError):
    """model_endpoint.base_url is not acceptable (allowlist, scheme, userinfo, fragment)."""


class UpstreamError(CallbackError):
    """The upstream model API failed (transport, budget, or a non-JSON answer)."""

    def __init__(self, message: str, *, attempts: int = 0) -> None:
        super().__init__(message)
        self.attempts = attempts  # upstream attempts made before giving up (for observers)


class ConfigError(RelaxGymError, ValueError):
    """Configuration is invalid; the message names the key and the source."""


class PluginError(RelaxGymError):
    """A plugin failed to load or to validate."""


class ClientError(RelaxGymError):
    """The thin client could not finish its trial."""


class GatewayRequestError(ClientError):
    """The gateway answered with an error, or did not answer.

    `detail` is the gateway's own reason (the `detail` of its JSON error body), already made safe to
    print: one line, bounded, the client's secrets masked. None when there was no such reason.
    """

    def __init__(self, message: str, *, status_code: int | None = None, detail: str | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.detail = detail


class TrialFailedError(ClientError):
    """The trial ended in a state that must not be exported to the trainer."""
