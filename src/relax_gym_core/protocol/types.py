"""Wire types of relax-nemo-gym/v1: frozen, keyword-only attrs classes.

Validators state the contract; their messages name the field as the reference gateway does
("session.attempt must be an integer greater than or equal to 1"). Secrets are kept out of repr.
"""

from __future__ import annotations

import math
import re
from enum import StrEnum
from typing import Any, Final
from urllib.parse import SplitResult, urlsplit

import attrs
from attrs import field, frozen

from relax_gym_core.errors import FieldError
from relax_gym_core.protocol.jsonutil import MAX_DEPTH, is_finite_json

PROTOCOL_VERSION: Final = "relax-nemo-gym/v1"
# relax-gym's own extension of GET /v1/trials/{id}: `?wait_s=S` answers once the trial has made its next
# transition or S seconds (at most MAX_WAIT_S) have passed, and says so with WAITED_HEADER; a gateway
# without it (the reference) ignores the parameter and answers at once, so its clients poll as before.
MAX_WAIT_S: Final = 30.0
WAITED_HEADER: Final = "relax-gym-waited"
# Also relax-gym's own: the answer to a create names the service_epoch (GET /healthz) of the gateway that
# holds the trial, so a client that later meets a 404 can tell a restart apart without probing /healthz
# before every create. A gateway without it (the reference) is probed, as before.
EPOCH_HEADER: Final = "relax-gym-service-epoch"
# And: a create (POST /v1/trials) takes `?wait_s=S` too, answering once the trial's status is final or S
# seconds have passed (WAITED_HEADER says it waited), and REPLAY_HEADER marks the answer to a create that
# found the trial already there (a retry, or a replay of an earlier run's request id).
REPLAY_HEADER: Final = "relax-gym-replay"
# And GET /v1/trajectories?request_id=...: the trajectories of this many trials at most in one request.
MAX_TRAJECTORY_IDS: Final = 256
REQUEST_ID_MAX_LEN: Final = 256
_REQUEST_ID_RE: Final = re.compile(r"[A-Za-z0-9._~-]+")
# RFC 7230 token characters; header names outside this set would let a client smuggle headers upstream.
_TCHAR_RE: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# Header values every upstream client sends unchanged: visible ASCII, with spaces and tabs inside only
# (clients strip or refuse them at the ends). Anything else made each bridged call fail with an error
# that quoted the value, i.e. the session's key.
_VISIBLE: Final = r"[\x21-\x7e]"
_INNER: Final = r"[\t\x20-\x7e]"
_HEADER_VALUE_RE: Final = re.compile(rf"(?:{_VISIBLE}(?:{_INNER}*{_VISIBLE})?)?")
_API_KEY_RE: Final = re.compile(rf"{_VISIBLE}(?:{_INNER}*{_VISIBLE})?")
_KEY_PREFIX_RE: Final = re.compile(rf"(?:{_VISIBLE}{_INNER}*)?")
_NON_BLANK_RE: Final = re.compile(r"\S")
_HTTP_URL_RE: Final = re.compile(r"[Hh][Tt][Tt][Pp][Ss]?://[^/?#]")
FORBIDDEN_HEADERS: Final = frozenset(
    {"connection", "content-length", "host", "proxy-authenticate", "proxy-authorization", "transfer-encoding"}
)

# attrs field metadata key: the JSON Schema keywords that state a field's rule, published by the gateway's
# OpenAPI document. Validators below check the same patterns, so the document and the checks cannot drift
# (base_url's pattern states only its scheme and host: the URL parser and the allowlist say the rest).
SCHEMA: Final = "json_schema"


def _anchored(regex: re.Pattern[str]) -> str:
    return f"^(?:{regex.pattern})$"


def _rule(**keywords: Any) -> dict[str, Any]:
    return {SCHEMA: keywords}


_NON_BLANK_RULE: Final = _rule(pattern=_NON_BLANK_RE.pattern)


class TrialStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"

    @property
    def is_terminal(self) -> bool:
        return self not in (TrialStatus.QUEUED, TrialStatus.RUNNING)


class InterruptPolicy(StrEnum):
    PROTECTED = "protected"
    INTERRUPTIBLE = "interruptible"
    RESUMABLE = "resumable"


class CleanupState(StrEnum):
    """Additive v1 extension: whether the trial's remote resources are released."""

    PENDING = "pending"  # the trial holds (or may hold) resources
    CONFIRMED = "confirmed"  # proven released, or nothing was ever allocated
    UNVERIFIED = "unverified"  # released as far as we can tell, but nothing proved it
    FAILED = "failed"  # the cleanup ladder raised or timed out


def split_http_url(value: str) -> SplitResult | None:
    """The parts of an absolute http(s) URL with a host and a valid port, or None (malformed URLs too).

    The one place that says what an acceptable URL looks like; callers add their own rules (ports, user
    info, allowlists) on top.
    """
    try:
        parts = urlsplit(value)
        _ = parts.port  # raises ValueError for a malformed or out-of-range port
    except ValueError:
        return None
    return parts if parts.scheme in ("http", "https") and parts.hostname else None


# ---- validators -------------------------------------------------------------------------------------


def _non_empty_str(name: str) -> Any:
    def check(_inst: object, _attr: attrs.Attribute[Any], value: object) -> None:
        if not isinstance(value, str) or not _NON_BLANK_RE.search(value):
            raise FieldError(f"{name} must be a non-empty string")

    return check


def _header_text(name: str, regex: re.Pattern[str], rule: str) -> Any:
    """A string sent in an HTTP header upstream; the message never quotes the value (it is a secret)."""

    def check(_inst: object, _attr: attrs.Attribute[Any], value: object) -> None:
        if not isinstance(value, str) or not regex.fullmatch(value):
            raise FieldError(f"{name} must be {rule} (it is sent as an HTTP header value)")

    return check


_HEADER_VALUE_RULE: Final = "printable ASCII without spaces at either end"


def json_object(name: str) -> Any:
    def check(_inst: object, _attr: attrs.Attribute[Any], value: object) -> None:
        if not isinstance(value, dict):
            raise FieldError(f"{name} must be a JSON object")
        if not is_finite_json(value):
            raise FieldError(
                f"{name} must contain only finite JSON values, nested at most {MAX_DEPTH} levels"
            )

    return check


def _positive_finite(name: str) -> Any:
    def check(_inst: object, _attr: attrs.Attribute[Any], value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise FieldError(f"{name} must be a positive finite number")
        if not math.isfinite(value) or value <= 0:
            raise FieldError(f"{name} must be a positive finite number")

    return check


def _header_name(name: str) -> Any:
    def check(_inst: object, _attr: attrs.Attribute[Any], value: object) -> None:
        if not isinstance(value, str) or not _TCHAR_RE.fullmatch(value):
            raise FieldError(f"{name} must be a valid HTTP header name")
        if value.lower() in FORBIDDEN_HEADERS:
            raise FieldError(f"{name} must not be a hop-by-hop or framing header")

    return check


REQUEST_ID_RULE: Final = _rule(minLength=1, maxLength=REQUEST_ID_MAX_LEN, pattern=_anchored(_REQUEST_ID_RE))


def _check_request_id(_inst: object, _attr: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or not value:
        raise FieldError("request_id must be a non-empty string")
    if len(value) > REQUEST_ID_MAX_LEN:
        raise FieldError(f"request_id must be at most {REQUEST_ID_MAX_LEN} characters")
    if not _REQUEST_ID_RE.fullmatch(value):
        raise FieldError("request_id may contain only letters, digits and '.', '_', '~', '-'")


def _check_attempt(_inst: object, _attr: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise FieldError("session.attempt must be an integer greater than or equal to 1")


def _check_protocol(_inst: object, _attr: attrs.Attribute[Any], value: object) -> None:
    if value != PROTOCOL_VERSION:
        raise FieldError(f"Unsupported protocol_version: {value!r}; expected {PROTOCOL_VERSION!r}")


_SHARED: dict[str, str] = {}
_SHARED_MAX = 4096


def _shared(value: Any) -> Any:
    """One string object for values many trials repeat (version, environment, base URL, model...).

    A bounded table, not sys.intern: interned strings live forever, and group ids keep coming. Never
    used for secrets or per-trial ids.
    """
    if isinstance(value, str):
        found = _SHARED.get(value)
        if found is not None:
            return found
        if len(_SHARED) < _SHARED_MAX:
            _SHARED[value] = value
    return value


def _to_float(value: Any) -> Any:
    # JSON integers are valid numbers; bools are not (validators reject them below).
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            return math.inf
    return value


# ---- create request ---------------------------------------------------------------------------------


@frozen(kw_only=True)
class SessionInfo:
    """The Relax session the trial belongs to. session_id is a credential in practice: never printed."""

    session_id: str = field(
        repr=False, validator=_non_empty_str("session.session_id"), metadata=_NON_BLANK_RULE
    )
    group_id: str = field(
        converter=_shared, validator=_non_empty_str("session.group_id"), metadata=_NON_BLANK_RULE
    )
    rollout_mode: str = field(
        converter=_shared, validator=_non_empty_str("session.rollout_mode"), metadata=_NON_BLANK_RULE
    )
    attempt: int = field(default=1, validator=_check_attempt, metadata=_rule(minimum=1))


@frozen(kw_only=True)
class EnvironmentRef:
    """Which registered (environment, config) runs the task, and the task itself."""

    name: str = field(
        converter=_shared, validator=_non_empty_str("environment.name"), metadata=_NON_BLANK_RULE
    )
    config: str = field(
        converter=_shared, validator=_non_empty_str("environment.config"), metadata=_NON_BLANK_RULE
    )
    task: dict[str, Any] = field(validator=json_object("environment.task"))


@frozen(kw_only=True)
class ModelEndpoint:
    """The trainer's per-session model API the bridge forwards model calls to."""

    base_url: str = field(
        converter=_shared,
        validator=_non_empty_str("model_endpoint.base_url"),
        metadata=_rule(pattern=f"^{_HTTP_URL_RE.pattern}"),
    )
    api_key: str = field(
        repr=False,
        validator=_header_text("model_endpoint.api_key", _API_KEY_RE, _HEADER_VALUE_RULE),
        metadata=_rule(pattern=_anchored(_API_KEY_RE)),
    )
    model: str = field(
        converter=_shared, validator=_non_empty_str("model_endpoint.model"), metadata=_NON_BLANK_RULE
    )
    api_key_header: str = field(
        default="Authorization",
        validator=_header_name("model_endpoint.api_key_header"),
        metadata=_rule(pattern=_anchored(_TCHAR_RE)),
    )
    api_key_prefix: str = field(
        default="Bearer ",
        repr=False,
        validator=_header_text(
            "model_endpoint.api_key_prefix", _KEY_PREFIX_RE, "printable ASCII without spaces at its start"
        ),
        metadata=_rule(pattern=_anchored(_KEY_PREFIX_RE)),
    )
    headers: dict[str, str] = field(
        factory=dict,
        repr=False,
        metadata=_rule(
            propertyNames={"pattern": _anchored(_TCHAR_RE)},
            additionalProperties={"type": "string", "pattern": _anchored(_HEADER_VALUE_RE)},
        ),
    )

    @base_url.validator
    def _check_base_url(self, _attr: attrs.Attribute[str], value: str) -> None:
        parts = split_http_url(value)
        if parts is None or parts.port == 0:
            raise FieldError("model_endpoint.base_url must be an absolute http(s) URL")

    @headers.validator
    def _check_headers(self, _attr: attrs.Attribute[dict[str, str]], value: object) -> None:
        if not isinstance(value, dict):
            raise FieldError("model_endpoint.headers must be a JSON object of strings")
        name_check = _header_name("model_endpoint.headers")
        for key, item in value.items():
            name_check(self, _attr, key)
            # The name is a checked token, safe to quote; the value may be a credential and is not quoted.
            _header_text(f"model_endpoint.headers[{key!r}]", _HEADER_VALUE_RE, _HEADER_VALUE_RULE)(
                self, _attr, item
            )
            if key.lower() == self.api_key_header.lower():
                raise FieldError("model_endpoint.headers must not override api_key_header")


@frozen(kw_only=True)
class Generation:
    """Per-trial generation overrides: merged into the /run params and into every bridged model call."""

    responses_create_params: dict[str, Any] = field(
        factory=dict, validator=json_object("generation.responses_create_params")
    )
    sampling_params: dict[str, Any] = field(factory=dict, validator=json_object("generation.sampling_params"))


@frozen(kw_only=True)
class CreateTrialRequest:
    """Body of POST /v1/trials."""

    protocol_version: str = field(
        converter=_shared, validator=_check_protocol, metadata=_rule(enum=[PROTOCOL_VERSION])
    )
    request_id: str = field(validator=_check_request_id, metadata=REQUEST_ID_RULE)
    session: SessionInfo
    environment: EnvironmentRef
    model_endpoint: ModelEndpoint
    interrupt_policy: InterruptPolicy
    generation: Generation = field(factory=Generation)
    deadline_s: float = field(
        default=1800.0,
        converter=_to_float,
        validator=_positive_finite("deadline_s"),
        metadata=_rule(exclusiveMinimum=0),
    )
    lease_s: float = field(
        default=60.0,
        converter=_to_float,
        validator=_positive_finite("lease_s"),
        metadata=_rule(exclusiveMinimum=0),
    )
    metadata: dict[str, Any] = field(factory=dict, validator=json_object("metadata"))


# ---- responses --------------------------------------------------------------------------------------


def check_reward(_inst: object, _attr: attrs.Attribute[Any], value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool):
        raise FieldError("reward must be null, a finite number or a JSON object")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise FieldError("reward must be a finite number")
        return
    if not isinstance(value, dict) or not is_finite_json(value):
        raise FieldError("reward must be null, a finite number or a JSON object")


def optional_json_object(name: str) -> Any:
    inner = json_object(name)

    def check(inst: object, attr: attrs.Attribute[Any], value: object) -> None:
        if value is not None:
            inner(inst, attr, value)

    return check


def check_artifact_ref(_inst: object, _attr: attrs.Attribute[Any], value: object) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise FieldError("artifact_ref must be null or a non-empty string")


@frozen(kw_only=True)
class TrialSnapshot:
    """The public view of one trial (body of create, get and abort)."""

    protocol_version: str = field(
        converter=_shared, validator=_check_protocol, metadata=_rule(enum=[PROTOCOL_VERSION])
    )
    request_id: str = field(validator=_check_request_id, metadata=REQUEST_ID_RULE)
    status: TrialStatus
    reward: float | dict[str, Any] | None = field(default=None, validator=check_reward)
    metrics: dict[str, Any] = field(factory=dict, validator=json_object("metrics"))
    artifact_ref: str | None = field(default=None, validator=check_artifact_ref)
    error: dict[str, Any] | None = field(default=None, validator=optional_json_object("error"))
    # v1 extension; absent when talking to a reference gateway.
    cleanup: CleanupState | None = None


@frozen(kw_only=True)
class ErrorBody:
    """Every error answer: {"detail": "..."}."""

    detail: str


@frozen(kw_only=True)
class ServiceHealth:
    """Body of /healthz and /readyz."""

    protocol_version: str
    service_epoch: str
    gym_commit: str
    config_fingerprint: str
    trials: int
    active_trials: int
    terminal_trials: int
    janitor_healthy: bool
    ready: bool | None = None
    # Extensions: why not ready, and what has been evicted from memory.
    reasons: list[str] = field(factory=list)
    evicted_trials: int = 0
