"""Gateway configuration: environment specs (reference JSON format) and settings from the environment.

Every problem is a ConfigError naming the source (variable or file), the config and the key.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attrs import field, frozen

from relax_gym_core.bridge.allowlist import CallbackPolicy
from relax_gym_core.errors import ConfigError
from relax_gym_core.protocol import InterruptPolicy
from relax_gym_core.protocol.types import split_http_url
from relax_gym_core.trials import Admission

# Names of relax_gym_core.bridge.UPSTREAM_CLIENTS, kept here so reading settings imports no HTTP client.
UPSTREAM_CLIENT_NAMES = ("pyreqwest", "aiohttp", "httpx")

ENVIRONMENTS_VAR = "NEMO_GYM_GATEWAY_ENVIRONMENTS_JSON"
_SPEC_KEYS = frozenset(
    {
        "environment",
        "agent_name",
        "agent_url",
        "runtime",
        "interrupt_policy",
        "max_concurrency",
        "queue_capacity",
        "max_deadline_s",
        "abort_url",
        "force_cleanup_url",
        "cleanup_probe_url",
        "readiness_urls",
        "stateless",
    }
)


@frozen(kw_only=True)
class EnvironmentSpec:
    """One registered (environment, config): where its runs go and how many are admitted."""

    config: str
    environment: str
    runtime: str = "nemo_gym"
    agent_name: str | None = None
    agent_url: str | None = None
    interrupt_policy: InterruptPolicy = InterruptPolicy.PROTECTED
    max_concurrency: int = 1
    queue_capacity: int = 8
    max_deadline_s: float = 3600.0
    abort_url: str | None = None
    force_cleanup_url: str | None = None
    cleanup_probe_url: str | None = None
    readiness_urls: tuple[str, ...] = ()
    # Extension: the environment keeps no per-run state, so a closed /run call is a confirmed cleanup.
    stateless: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return (self.environment, self.config)

    @property
    def admission(self) -> Admission:
        return Admission(
            max_concurrency=self.max_concurrency,
            queue_capacity=self.queue_capacity,
            max_deadline_s=self.max_deadline_s,
            interrupt_policy=self.interrupt_policy,
        )

    def to_json(self) -> dict[str, Any]:
        data = {
            "environment": self.environment,
            "runtime": self.runtime,
            "agent_name": self.agent_name,
            "agent_url": self.agent_url,
            "interrupt_policy": self.interrupt_policy.value,
            "max_concurrency": self.max_concurrency,
            "queue_capacity": self.queue_capacity,
            "max_deadline_s": self.max_deadline_s,
            "abort_url": self.abort_url,
            "force_cleanup_url": self.force_cleanup_url,
            "cleanup_probe_url": self.cleanup_probe_url,
            "readiness_urls": list(self.readiness_urls),
            "stateless": self.stateless or None,
        }
        return {"config": self.config, **{k: v for k, v in data.items() if v is not None}}


class _SpecReader:
    """Reads one spec object, raising ConfigError('<source>: <config>.<key> ...')."""

    def __init__(self, source: str, config: str, raw: Mapping[str, Any]) -> None:
        self.source, self.config, self.raw = source, config, raw

    def fail(self, key: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.source}: environment config {self.config!r}: {key} {problem}")

    def string(self, key: str, *, required: bool = False) -> str | None:
        value = self.raw.get(key)
        if value is None:
            if required:
                raise self.fail(key, "is required")
            return None
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, "must be a non-empty string")
        return value

    def url(self, key: str, *, required: bool = False) -> str | None:
        value = self.string(key, required=required)
        if value is None:
            return None
        _check_url(value, lambda problem: self.fail(key, problem))
        return value.rstrip("/")

    def integer(self, key: str, default: int, minimum: int) -> int:
        value = self.raw.get(key, default)
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)  # the reference accepts numeric strings here
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(key, f"must be an integer >= {minimum} (got {value!r})")
        return value

    def flag(self, key: str) -> bool:
        value = self.raw.get(key, False)
        if not isinstance(value, bool):
            raise self.fail(key, f"must be true or false (got {value!r})")
        return value

    def positive(self, key: str, default: float) -> float:
        value = self.raw.get(key, default)
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value <= 0
        ):
            raise self.fail(key, f"must be a positive finite number (got {value!r})")
        return float(value)


def _check_url(value: str, fail: Any) -> None:
    if split_http_url(value) is None:
        raise fail(f"must be an absolute http(s) URL (got {value!r})")


def parse_spec(source: str, config: str, raw: object) -> EnvironmentSpec:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: environment config {config!r} must be a JSON object")
    unknown = sorted(set(raw) - _SPEC_KEYS)
    if unknown:
        allowed = ", ".join(sorted(_SPEC_KEYS))
        raise ConfigError(
            f"{source}: environment config {config!r}: unknown key {unknown[0]!r} (allowed: {allowed})"
        )
    read = _SpecReader(source, config, raw)
    agent_url = read.url("agent_url")
    runtime = read.string("runtime") or ("nemo_gym" if agent_url else "")
    if not runtime:
        raise read.fail("agent_url", 'is required (or set "runtime": "echo")')
    if runtime == "nemo_gym" and agent_url is None:
        raise read.fail("agent_url", "is required for the nemo_gym runtime")
    policy_raw = raw.get("interrupt_policy", InterruptPolicy.PROTECTED.value)
    try:
        policy = InterruptPolicy(policy_raw)
    except ValueError:
        raise read.fail("interrupt_policy", "must be one of protected, interruptible, resumable") from None
    readiness = raw.get("readiness_urls")
    if readiness is None:
        readiness_urls: tuple[str, ...] = (agent_url,) if agent_url else ()
    else:
        if not isinstance(readiness, list) or not readiness or not all(isinstance(u, str) for u in readiness):
            raise read.fail("readiness_urls", "must be a non-empty list of URLs")
        for url in readiness:
            _check_url(url, lambda problem: read.fail("readiness_urls", problem))
        readiness_urls = tuple(url.rstrip("/") for url in readiness)
    return EnvironmentSpec(
        config=config,
        environment=read.string("environment", required=True) or "",
        runtime=runtime,
        agent_name=read.string("agent_name", required=runtime == "nemo_gym"),
        agent_url=agent_url,
        interrupt_policy=policy,
        max_concurrency=read.integer("max_concurrency", 1, 1),
        queue_capacity=read.integer("queue_capacity", 8, 0),
        max_deadline_s=read.positive("max_deadline_s", 3600.0),
        abort_url=read.url("abort_url"),
        force_cleanup_url=read.url("force_cleanup_url"),
        cleanup_probe_url=read.url("cleanup_probe_url"),
        readiness_urls=readiness_urls,
        stateless=read.flag("stateless"),
    )


def parse_environments(text: str, *, source: str) -> tuple[EnvironmentSpec, ...]:
    """Parse the reference JSON object {config name: spec} into specs."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{source}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{source}: must be a non-empty JSON object of config name -> environment spec")
    specs = tuple(parse_spec(source, config, raw) for config, raw in data.items())
    seen: set[tuple[str, str]] = set()
    for spec in specs:
        if spec.key in seen:
            raise ConfigError(f"{source}: duplicate environment/config pair {spec.key!r}")
        seen.add(spec.key)
    return specs


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
    # The bridge runs only with an allowlist; without one the gateway makes no outgoing model calls.
    callback_policy: CallbackPolicy | None = None
    upstream_client: str = "pyreqwest"
    keepalive_s: float = 15.0
    # This gateway's own base URL, for runs that call their model through the bridge.
    public_url: str | None = None
    # When set, the trial API requires `Authorization: Bearer <api_token>` (gateway/auth.py).
    api_token: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(
        cls,
        environments: tuple[EnvironmentSpec, ...],
        environ: Mapping[str, str] = os.environ,
        *,
        callback_policy: CallbackPolicy | None = None,
        public_url: str | None = None,
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
            gym_commit=environ.get("NEMO_GYM_COMMIT", "unknown") or "unknown",
            api_token=_api_token(environ, "RELAX_GYM_API_TOKEN"),
        )


_TOKEN_RE = re.compile(r"[\x21-\x7e]{16,4096}")  # visible ASCII: what an HTTP header carries unchanged


def _api_token(environ: Mapping[str, str], name: str) -> str | None:
    """The token, None when unset or empty, else ConfigError naming the variable (never the value)."""
    token = environ.get(name, "")
    if not token:
        return None
    if not _TOKEN_RE.fullmatch(token):
        raise ConfigError(f"{name} must be 16 to 4096 visible ASCII characters (no spaces)")
    return token
