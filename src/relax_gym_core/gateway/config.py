"""Gateway configuration: where the environment specs come from, and settings from the environment.

Every problem is a ConfigError naming the source (variable or file) and the key; the specs themselves
are relax_gym_core.plugin.specs.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attrs import field, frozen

from relax_gym_core.bridge.allowlist import CallbackPolicy
from relax_gym_core.errors import ConfigError
from relax_gym_core.plugin.specs import EnvironmentSpec, parse_environments
from relax_gym_core.trajectories import DEFAULT_MAX_BYTES

# Names of relax_gym_core.bridge.UPSTREAM_CLIENTS, kept here so reading settings imports no HTTP client.
UPSTREAM_CLIENT_NAMES = ("pyreqwest", "aiohttp", "httpx")

ENVIRONMENTS_VAR = "NEMO_GYM_GATEWAY_ENVIRONMENTS_JSON"


def load_environments(
    path: str | None = None, environ: Mapping[str, str] = os.environ
) -> tuple[EnvironmentSpec, ...]:
    if path is not None:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"--environments {path}: cannot read ({exc.strerror})") from None
        return parse_environments(text, source=path)
    value = environ.get(ENVIRONMENTS_VAR)
    if not value:
        raise ConfigError(f"{ENVIRONMENTS_VAR} is not set and no --environments FILE was given")
    return parse_environments(value, source=ENVIRONMENTS_VAR)


def _env_float(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a positive finite number (got {raw!r})") from None
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a positive finite number (got {raw!r})")
    return value


def _env_int(environ: Mapping[str, str], name: str, default: int, *, minimum: int = 1) -> int:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    if not re.fullmatch(r"\s*\d+\s*", raw) or int(raw) < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum} (got {raw!r})")
    return int(raw)


MIB = 1 << 20
UNKNOWN_KEYS_VAR = "RELAX_GYM_UNKNOWN_KEYS"
UNKNOWN_KEY_MODES = ("warn", "refuse")


@frozen(kw_only=True)
class Limits:
    """What one client may cost the gateway; README "Operations: limits and timeouts" lists each variable.

    Body caps are per route: a model call carries a whole agent context (the bridge moves 5-8 MB bodies
    routinely), a create carries one task, and nothing else has a body worth reading.
    """

    max_model_call_bytes: int = 64 * MIB
    max_create_bytes: int = 4 * MIB
    max_other_body_bytes: int = 64 * 1024
    header_timeout_s: float = 10.0  # from connecting (or the previous answer) to a complete request head
    body_timeout_s: float = 60.0  # from the head to the last byte of the body
    keepalive_timeout_s: int = 5  # an idle keep-alive connection is closed after this (uvicorn's, whole s)
    max_connections: int = 2048
    shutdown_budget_s: float = 25.0

    @property
    def drain_s(self) -> int:
        """The part of the shutdown budget open requests get to finish (whole seconds, as uvicorn takes
        it); trial aborts and cleanups get the rest."""
        return min(5, max(1, int(self.shutdown_budget_s / 5)))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Limits:
        return cls(
            max_model_call_bytes=_env_int(environ, "RELAX_GYM_MAX_MODEL_CALL_BYTES", 64 * MIB),
            max_create_bytes=_env_int(environ, "RELAX_GYM_MAX_CREATE_BYTES", 4 * MIB),
            max_other_body_bytes=_env_int(environ, "RELAX_GYM_MAX_BODY_BYTES", 64 * 1024),
            header_timeout_s=_env_float(environ, "RELAX_GYM_HEADER_TIMEOUT_S", 10.0),
            body_timeout_s=_env_float(environ, "RELAX_GYM_BODY_TIMEOUT_S", 60.0),
            keepalive_timeout_s=_env_int(environ, "RELAX_GYM_KEEPALIVE_TIMEOUT_S", 5),
            max_connections=_env_int(environ, "RELAX_GYM_MAX_CONNECTIONS", 2048),
            shutdown_budget_s=_env_float(environ, "RELAX_GYM_SHUTDOWN_BUDGET_S", 25.0),
        )


@frozen(kw_only=True)
class GatewaySettings:
    """Everything the gateway needs besides its runtimes."""

    environments: tuple[EnvironmentSpec, ...]
    cleanup_grace_s: float = 30.0
    scan_interval_s: float = 0.25
    retention_s: float = 600.0
    max_retained: int = 100_000
    tombstone_capacity: int = 100_000
    callback_timeout_s: float = 600.0
    gym_commit: str = "unknown"
    # The NeMo Gym release the servers run, when this process started them (`relax-gym up`): version,
    # source, commit, observability (gym/release.py), shown by /readyz.
    nemo_gym: Mapping[str, Any] | None = None
    # The bridge runs only with an allowlist; without one the gateway makes no outgoing model calls.
    callback_policy: CallbackPolicy | None = None
    upstream_client: str = "pyreqwest"
    keepalive_s: float = 15.0
    # This gateway's own base URL, for runs that call their model through the bridge.
    public_url: str | None = None
    # When set, the trial API requires `Authorization: Bearer <api_token>` (gateway/auth.py).
    api_token: str | None = field(default=None, repr=False)
    limits: Limits = Limits()
    # Keys of a create body that relax-nemo-gym/v1 does not define: "warn" (counted in /metrics, logged,
    # ignored: newer clients may send additive fields) or "refuse" (422 naming them).
    unknown_keys: str = "warn"
    # Where the trial ledger lives (trials/statedir.py); ":memory:" keeps trials in memory only. The
    # commands default to the user's data directory; code that builds settings itself gets ":memory:".
    state_dir: str = ":memory:"
    # How long restart recovery keeps trying to prove a lost run's cleanup before recording unverified.
    recovery_give_up_s: float = 600.0
    # Each trial's trajectory (trajectories/), kept under the state directory with the trial's record and
    # served by GET /v1/trials/{request_id}/trajectory; off for operators who must not keep prompts.
    trajectories: bool = True
    trajectory_max_bytes: int = DEFAULT_MAX_BYTES  # per trial; bodies past it are cut with a marker

    @classmethod
    def from_env(
        cls,
        environments: tuple[EnvironmentSpec, ...],
        environ: Mapping[str, str] = os.environ,
        *,
        callback_policy: CallbackPolicy | None = None,
        public_url: str | None = None,
        state_dir: str | None = None,
        nemo_gym: Mapping[str, Any] | None = None,
    ) -> GatewaySettings:
        client = environ.get("RELAX_GYM_UPSTREAM_CLIENT", "pyreqwest")
        if client not in UPSTREAM_CLIENT_NAMES:
            names = ", ".join(UPSTREAM_CLIENT_NAMES)
            raise ConfigError(f"RELAX_GYM_UPSTREAM_CLIENT must be one of {names} (got {client!r})")
        return cls(
            environments=environments,
            callback_policy=callback_policy,
            upstream_client=client,
            public_url=public_url,
            cleanup_grace_s=_env_float(environ, "NEMO_GYM_CLEANUP_GRACE_S", 30.0),
            scan_interval_s=_env_float(environ, "NEMO_GYM_LEASE_SCAN_INTERVAL_S", 0.25),
            retention_s=_env_float(environ, "RELAX_GYM_TRIAL_RETENTION_S", 600.0),
            callback_timeout_s=_env_float(environ, "NEMO_GYM_CALLBACK_TIMEOUT_S", 600.0),
            # The commit the servers' NeMo Gym reports, else what the operator says it is.
            gym_commit=(nemo_gym or {}).get("commit") or environ.get("NEMO_GYM_COMMIT") or "unknown",
            nemo_gym=nemo_gym,
            api_token=_api_token(environ, "RELAX_GYM_API_TOKEN"),
            limits=Limits.from_env(environ),
            unknown_keys=_choice(environ, UNKNOWN_KEYS_VAR, UNKNOWN_KEY_MODES),
            state_dir=state_dir or environ.get("RELAX_GYM_STATE_DIR") or ":memory:",
            recovery_give_up_s=_env_float(environ, "RELAX_GYM_RECOVERY_GIVE_UP_S", 600.0),
            trajectories=_choice(environ, "RELAX_GYM_TRAJECTORIES", ("on", "off")) == "on",
            trajectory_max_bytes=_env_int(environ, "RELAX_GYM_TRAJECTORY_MAX_BYTES", DEFAULT_MAX_BYTES),
        )


def _choice(environ: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    value = environ.get(name) or choices[0]
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)} (got {value!r})")
    return value


_TOKEN_RE = re.compile(r"[\x21-\x7e]{16,4096}")  # visible ASCII: what an HTTP header carries unchanged


def _api_token(environ: Mapping[str, str], name: str) -> str | None:
    """The token, None when unset or empty, else ConfigError naming the variable (never the value)."""
    token = environ.get(name, "")
    if not token:
        return None
    if not _TOKEN_RE.fullmatch(token):
        raise ConfigError(f"{name} must be 16 to 4096 visible ASCII characters (no spaces)")
    return token


@frozen(kw_only=True)
class ReplicaSettings:
    """How `relax-gym up` watches and replaces replicas (README "Scale-out: replicas")."""

    probe_interval_s: float = 0.5  # each replica's processes and GET / of its servers, this often
    restart_delay_s: float = 1.0  # before the first replacement attempt (doubled after each failure)
    restart_attempts: int = 3  # replacement attempts per lost replica before the pool stays degraded
    unresponsive_s: float = 60.0  # a replica whose servers answer no GET / for this long is lost

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> ReplicaSettings:
        return cls(
            probe_interval_s=_env_float(environ, "RELAX_GYM_REPLICA_PROBE_INTERVAL_S", 0.5),
            restart_delay_s=_env_float(environ, "RELAX_GYM_REPLICA_RESTART_DELAY_S", 1.0),
            restart_attempts=_env_int(environ, "RELAX_GYM_REPLICA_RESTART_ATTEMPTS", 3),
            unresponsive_s=_env_float(environ, "RELAX_GYM_REPLICA_UNRESPONSIVE_S", 60.0),
        )
