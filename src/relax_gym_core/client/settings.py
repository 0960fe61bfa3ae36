"""Client configuration: the RELAX_* variables Relax sets and the NEMO_GYM_* knobs (reference §5.2).

Same names, defaults and ranges as the reference thin client. Every problem is a ClientConfigError
naming the variable. URL values and the session id are never echoed (they may carry credentials).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Final

import attrs
from attrs import field, frozen

from relax_gym_core.client.exceptions import ClientConfigError
from relax_gym_core.errors import ProtocolError
from relax_gym_core.protocol import InterruptPolicy, jsonutil
from relax_gym_core.protocol.types import split_http_url

DEFAULT_DEADLINE_S: Final = 1800.0  # NEMO_GYM_DEADLINE_S when unset, as the reference client
DEFAULT_LEASE_S: Final = 60.0  # NEMO_GYM_LEASE_S when unset
_INTEGER_RE: Final = re.compile(r"\s*\+?\d+\s*")
_TOKEN_RE: Final = re.compile(r"[\x21-\x7e]+")


def _positive(name: str) -> Any:
    def check(_inst: object, _attr: attrs.Attribute[Any], value: float) -> None:
        if isinstance(value, bool) or not math.isfinite(value) or value <= 0:
            raise ClientConfigError(f"{name} must be a positive finite number (got {value!r})")

    return check


def _non_negative(name: str) -> Any:
    def check(_inst: object, _attr: attrs.Attribute[Any], value: float) -> None:
        if isinstance(value, bool) or not math.isfinite(value) or value < 0:
            raise ClientConfigError(f"{name} must be a non-negative finite number (got {value!r})")

    return check


@frozen(kw_only=True)
class ClientOptions:
    """Timing and retry policy of one client. Defaults are the reference's."""

    startup_timeout_s: float = field(default=30.0, validator=_positive("startup_timeout_s"))
    request_timeout_s: float = field(default=30.0, validator=_positive("request_timeout_s"))
    poll_interval_s: float = field(default=1.0, validator=_positive("poll_interval_s"))
    abort_timeout_s: float = field(default=2.0, validator=_positive("abort_timeout_s"))
    retry_backoff_s: float = field(default=0.25, validator=_non_negative("retry_backoff_s"))
    max_retries: int = field(default=2)
    # Connections to the gateway at once (httpx's default). A caller with more trials in flight than this
    # (each holds one long poll, at times a renew beside it) raises it, or their polls queue for the pool.
    max_connections: int = field(default=100)

    @max_retries.validator
    def _check_retries(self, _attr: attrs.Attribute[int], value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ClientConfigError(f"max_retries must be an integer >= 0 (got {value!r})")

    @max_connections.validator
    def _check_connections(self, _attr: attrs.Attribute[int], value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ClientConfigError(f"max_connections must be an integer >= 1 (got {value!r})")

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ClientOptions:
        return cls(
            startup_timeout_s=_positive_var(environ, "NEMO_GYM_STARTUP_TIMEOUT_S", 30.0),
            request_timeout_s=_positive_var(environ, "NEMO_GYM_REQUEST_TIMEOUT_S", 30.0),
            poll_interval_s=_positive_var(environ, "NEMO_GYM_POLL_INTERVAL_S", 1.0),
            abort_timeout_s=_positive_var(environ, "NEMO_GYM_ABORT_TIMEOUT_S", 2.0),
            retry_backoff_s=_non_negative_var(environ, "NEMO_GYM_RETRY_BACKOFF_S", 0.25),
            max_retries=_integer_var(environ, "NEMO_GYM_MAX_RETRIES", 2, minimum=0),
        )


@frozen(kw_only=True)
class ClientSettings:
    """Everything one managed session needs besides its input file. The session id stays out of repr."""

    gateway_url: str
    session_id: str = field(repr=False)
    session_io_dir: str
    base_url: str
    group_id: str = "unknown"
    rollout_mode: str = "train"
    environment: str | None = None
    config: str | None = None
    model: str = "model"
    attempt: int = 1
    responses_create_params: dict[str, Any] = field(factory=dict)
    sampling_params: dict[str, Any] = field(factory=dict)
    interrupt_policy: InterruptPolicy = InterruptPolicy.PROTECTED
    deadline_s: float = field(default=DEFAULT_DEADLINE_S, validator=_positive("deadline_s"))
    lease_s: float = field(default=DEFAULT_LEASE_S, validator=_positive("lease_s"))
    options: ClientOptions = field(factory=ClientOptions)
    api_token: str | None = field(default=None, repr=False)  # the gateway's, when its trial API requires one

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ClientSettings:
        """Read and validate every variable; raises ClientConfigError naming the first bad one."""
        return cls(
            gateway_url=_url_var(environ, "NEMO_GYM_URL", "must point to the shared NeMo Gym gateway"),
            session_id=_required(environ, "RELAX_SESSION_ID", "must be set by Relax"),
            session_io_dir=_required(environ, "RELAX_SESSION_IO_DIR", "must be set by Relax"),
            base_url=_url_var(environ, "RELAX_BASE_URL", "must be set by Relax", allow_userinfo=False),
            group_id=_optional(environ, "RELAX_GROUP_ID") or "unknown",
            rollout_mode=_optional(environ, "RELAX_ROLLOUT_MODE") or "train",
            environment=_optional(environ, "NEMO_GYM_ENVIRONMENT"),
            config=_optional(environ, "NEMO_GYM_CONFIG"),
            model=_optional(environ, "NEMO_GYM_MODEL") or _optional(environ, "OPENAI_MODEL") or "model",
            attempt=_integer_var(environ, "NEMO_GYM_ATTEMPT", 1, minimum=1),
            responses_create_params=_json_object_var(environ, "NEMO_GYM_RESPONSES_CREATE_PARAMS"),
            sampling_params=_json_object_var(environ, "NEMO_GYM_SAMPLING_PARAMS"),
            interrupt_policy=_policy_var(environ, "NEMO_GYM_INTERRUPT_POLICY"),
            deadline_s=_positive_var(environ, "NEMO_GYM_DEADLINE_S", DEFAULT_DEADLINE_S),
            lease_s=_positive_var(environ, "NEMO_GYM_LEASE_S", DEFAULT_LEASE_S),
            options=ClientOptions.from_env(environ),
            api_token=_token_var(environ, "RELAX_GYM_API_TOKEN"),
        )


# ---- variable readers -------------------------------------------------------------------------------
# Empty values count as unset: `export NEMO_GYM_CONFIG=` in a launcher means "no override".


def _optional(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name)
    return value if value is not None and value.strip() else None


def _token_var(environ: Mapping[str, str], name: str) -> str | None:
    value = _optional(environ, name)
    if value is not None and not _TOKEN_RE.fullmatch(value):
        raise ClientConfigError(f"{name} must be visible ASCII characters without spaces")
    return value


def _required(environ: Mapping[str, str], name: str, hint: str) -> str:
    value = _optional(environ, name)
    if value is None:
        raise ClientConfigError(f"{name} {hint}")
    return value


def _url_var(environ: Mapping[str, str], name: str, hint: str, *, allow_userinfo: bool = True) -> str:
    value = _required(environ, name, hint).strip()
    parts = split_http_url(value)
    if parts is None:
        raise ClientConfigError(f"{name} must be an absolute http:// or https:// URL")
    if parts.query or parts.fragment:
        raise ClientConfigError(f"{name} must not contain a query or fragment")
    if not allow_userinfo and (parts.username is not None or parts.password is not None):
        raise ClientConfigError(f"{name} must not contain user info")
    return value.rstrip("/")


def _float_var(environ: Mapping[str, str], name: str, default: float) -> float | None:
    raw = _optional(environ, name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _positive_var(environ: Mapping[str, str], name: str, default: float) -> float:
    value = _float_var(environ, name, default)
    if value is None or value <= 0:
        raise ClientConfigError(f"{name} must be a positive finite number (got {environ.get(name)!r})")
    return value


def _non_negative_var(environ: Mapping[str, str], name: str, default: float) -> float:
    value = _float_var(environ, name, default)
    if value is None or value < 0:
        raise ClientConfigError(f"{name} must be a non-negative finite number (got {environ.get(name)!r})")
    return value


def _integer_var(environ: Mapping[str, str], name: str, default: int, *, minimum: int) -> int:
    raw = _optional(environ, name)
    if raw is None:
        return default
    if not _INTEGER_RE.fullmatch(raw) or int(raw) < minimum:
        raise ClientConfigError(f"{name} must be an integer >= {minimum} (got {raw!r})")
    return int(raw)


def _json_object_var(environ: Mapping[str, str], name: str) -> dict[str, Any]:
    raw = _optional(environ, name)
    if raw is None:
        return {}
    try:
        value = jsonutil.loads(raw)
    except ProtocolError:
        # The value may hold anything (API keys in extra params): describe it, do not echo it.
        raise ClientConfigError(f"{name} must contain a JSON object of finite values") from None
    if not isinstance(value, dict):
        raise ClientConfigError(f"{name} must contain a JSON object (got a JSON {type(value).__name__})")
    return value


def _policy_var(environ: Mapping[str, str], name: str) -> InterruptPolicy:
    raw = _optional(environ, name)
    if raw is None:
        return InterruptPolicy.PROTECTED
    try:
        return InterruptPolicy(raw.strip())
    except ValueError:
        allowed = ", ".join(policy.value for policy in InterruptPolicy)
        raise ClientConfigError(f"{name} must be one of {allowed} (got {raw!r})") from None
