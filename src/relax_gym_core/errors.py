"""One error tree for relax-gym.

    RelaxGymError
    ├── ProtocolError                 invalid wire data (422)
    │   ├── InvalidJSONError          body is not JSON at all (400)
    │   └── FieldError                a wire type's validator names the field it refuses
    ├── TrialError
    │   ├── TrialNotFoundError        unknown request_id (404)
    │   ├── TrialExpiredError         request_id known once, record evicted (404)
    │   ├── TrialConflictError        same request_id, different payload (409)
    │   ├── QueueFullError            admission refused; carries retry_after_s (429)
    │   ├── EnvironmentNotRegisteredError / PolicyMismatchError / DeadlineTooLongError (400)
    │   ├── ServiceClosingError       the gateway is shutting down (503)
    │   └── StoreUnavailableError     a change could not be made durable; nothing acknowledged (503)
    ├── UnauthorizedError             the trial API's token is missing or wrong (401)
    ├── CallbackError
    │   ├── RolloutUnavailableError     a model call's rollout id is unknown, or its trial not active (410)
    │   ├── CallbackURLRejectedError    model_endpoint.base_url refused by the allowlist (400)
    │   └── UpstreamError               the trainer's model API failed us (502)
    │       ├── UpstreamTransportError  one attempt may have reached it (never replayed)
    │       └── UpstreamTimeoutError    one attempt ran out of budget
    ├── LimitError                    a request is over one of the gateway's limits
    │   └── BodyTooLargeError         the body is over its route's cap (413)
    ├── ConfigError                   bad gateway/plugin configuration (startup, exit != 0)
    │   └── InstalledFileUnavailable  a file of the installed nemo-gym cannot be reached from here
    ├── PluginError                   a plugin failed to load or validate
    │   ├── PluginLoadError           its entry point failed to import (names the distribution)
    │   ├── DuplicateEnvironmentError two plugins claim one environment
    │   └── UnknownEnvironmentError   no installed plugin provides it (names the installed ones)
    ├── RowError                      a raw dataset row cannot be converted (names the field)
    ├── ConversionError               a dataset file cannot be converted (names file:line)
    ├── RunError                      a run failed: the trial ends failed (agent_error), never scored
    │   ├── EnvironmentFailure        an infrastructure failure with a kind, never a reward of 0
    │   │   └── ReplicaLostError      the replica running the trial died (kind replica_lost)
    │   └── AgentRunError             the agent's /run gave no usable answer
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


class FieldError(ProtocolError):
    """A wire type's validator refused a value; its message starts with the field it is about."""


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


class StoreUnavailableError(TrialError):
    """The trial store could not make a change durable, so nothing about it was acknowledged (the change
    stays pending and is written by a later batch; a create is idempotent, so the client retries it)."""


class UnauthorizedError(RelaxGymError):
    """The trial API requires an API token and the request did not carry it (never names the token)."""


class CallbackError(RelaxGymError):
    """A model callback could not be bridged."""


class RolloutUnavailableError(CallbackError):
    """A model call names a rollout id that is unknown, no longer active, or past its deadline or lease."""


class CallbackURLRejectedError(CallbackError):
    """model_endpoint.base_url is not acceptable (allowlist, scheme, userinfo, fragment)."""


class UpstreamError(CallbackError):
    """The upstream model API failed (transport, budget, or a non-JSON answer)."""

    def __init__(self, message: str = "upstream model call failed", *, attempts: int = 0) -> None:
        super().__init__(message)
        self.attempts = attempts  # upstream attempts made before giving up (for observers)


class UpstreamTransportError(UpstreamError):
    """One upstream attempt failed in transport: it may have reached the model API (never replayed)."""


class UpstreamTimeoutError(UpstreamError):
    """One upstream attempt ran out of its budget."""


class LimitError(RelaxGymError):
    """A request is over one of the gateway's configured limits (README: Operations: limits and timeouts)."""


class BodyTooLargeError(LimitError):
    """The request body is over its route's cap; the message names the cap and its variable."""


class ConfigError(RelaxGymError, ValueError):
    """Configuration is invalid; the message names the key and the source."""


class InstalledFileUnavailable(ConfigError):
    """A file of the installed nemo-gym package (example rows, a prompt) cannot be reached from here."""


class PluginError(RelaxGymError):
    """A plugin failed to load or to validate."""


class PluginLoadError(PluginError):
    """A plugin's entry point failed to import (names the entry point and its distribution)."""


class DuplicateEnvironmentError(PluginError):
    """Two registrations claim the same environment name or (environment, config) pair."""


class UnknownEnvironmentError(PluginError, LookupError):
    """No installed plugin provides this environment."""


class RowError(RelaxGymError, ValueError):
    """A raw row cannot be converted; the message says which field and why."""


class ConversionError(RelaxGymError, ValueError):
    """A dataset file could not be converted; the message names the file (and line)."""


class RunError(RelaxGymError):
    """A run failed: the trial ends failed with code agent_error and is never scored."""


class EnvironmentFailure(RunError):
    """A run ended in an infrastructure failure (not a model failure): never a reward of 0.

    `kind` names the failure ("verifier_error", "judge_failed", "masked:<kind>", ...) and is reported in the
    trial error, with `reason` (one bounded line, the environment's own words, no secret) when there is one.
    """

    def __init__(self, message: str, *, kind: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.reason = reason


class ReplicaLostError(EnvironmentFailure):
    """The replica (one copy of the environment's servers) running the trial died mid-run."""

    KIND = "replica_lost"

    def __init__(self, message: str) -> None:
        super().__init__(message, kind=self.KIND)


class AgentRunError(RunError):
    """The agent's /run did not produce a usable answer."""


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
