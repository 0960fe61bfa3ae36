"""What a gateway serves: one EnvironmentSpec per registered (environment, config).

The environments file (`relax-gym serve --environments FILE`, or $NEMO_GYM_GATEWAY_ENVIRONMENTS_JSON) is
the reference's JSON object {config name: spec}. It is read and written with the project's one cattrs
converter: unknown keys are refused, every problem names the source, the config and the key. The
admission limits default to the reference's (1 / 8 / 3600 s / protected, set once in environment.py);
the cleanup keys of a spec are a CleanupURLs, the form the runtimes read.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from attrs import field, frozen
from cattrs.gen import make_dict_structure_fn

from relax_gym_core.errors import ConfigError, FieldError, ProtocolError
from relax_gym_core.plugin.cleanup import CleanupURLs
from relax_gym_core.plugin.environment import (
    DEFAULT_INTERRUPT_POLICY,
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_MAX_DEADLINE_S,
    DEFAULT_QUEUE_CAPACITY,
    EnvironmentDefinition,
)
from relax_gym_core.protocol import InterruptPolicy, converter, structure
from relax_gym_core.protocol.types import split_http_url

_CLEANUP_KEYS = frozenset(a.name for a in attrs.fields(CleanupURLs))
_RUNTIME_NEEDS_AGENT = "nemo_gym"

type EnvKey = tuple[str, str]  # (environment name, config name): what a gateway admits trials under


def _url(name: str) -> Any:
    def check(_inst: object, _attr: attrs.Attribute[Any], value: str | None) -> None:
        if value is not None and split_http_url(value) is None:
            raise FieldError(f"{name} must be an absolute http(s) URL (got {value!r})")

    return check


def _at_least(name: str, minimum: int) -> Any:
    def check(_inst: object, _attr: attrs.Attribute[Any], value: int) -> None:
        if value < minimum:
            raise FieldError(f"{name} must be an integer >= {minimum} (got {value!r})")

    return check


def _positive_finite(_inst: object, _attr: attrs.Attribute[Any], value: float) -> None:
    if not math.isfinite(value) or value <= 0:
        raise FieldError(f"max_deadline_s must be a positive finite number (got {value!r})")


def _non_empty(name: str) -> Any:
    def check(_inst: object, _attr: attrs.Attribute[Any], value: str | None) -> None:
        if value is not None and not value.strip():
            raise FieldError(f"{name} must be a non-empty string")

    return check


def _no_slash(value: str | None) -> str | None:
    return value.rstrip("/") if isinstance(value, str) else value


@frozen(kw_only=True)
class EnvironmentSpec:
    """One registered (environment, config): which runtime runs its trials, where, and how many."""

    config: str
    environment: str = field(validator=_non_empty("environment"))
    runtime: str = field(default=_RUNTIME_NEEDS_AGENT, validator=_non_empty("runtime"))
    agent_name: str | None = field(default=None, validator=_non_empty("agent_name"))
    agent_url: str | None = field(default=None, converter=_no_slash, validator=_url("agent_url"))
    interrupt_policy: InterruptPolicy = DEFAULT_INTERRUPT_POLICY
    max_concurrency: int = field(default=DEFAULT_MAX_CONCURRENCY, validator=_at_least("max_concurrency", 1))
    queue_capacity: int = field(default=DEFAULT_QUEUE_CAPACITY, validator=_at_least("queue_capacity", 0))
    max_deadline_s: float = field(default=DEFAULT_MAX_DEADLINE_S, validator=_positive_finite)
    # GET answering 2xx when ready; default: the agent's URL.
    readiness_urls: tuple[str, ...] = ()
    cleanup: CleanupURLs = field(factory=CleanupURLs)
    # Where its servers write their output (the agent's first): a failed run quotes their last lines in the
    # gateway's log, so "agent_error / HTTP 500" comes with its cause. `relax-gym up` fills it in.
    server_logs: tuple[str, ...] = ()

    def __attrs_post_init__(self) -> None:
        if self.runtime == _RUNTIME_NEEDS_AGENT:
            if self.agent_url is None:
                raise FieldError(f"agent_url is required for the {_RUNTIME_NEEDS_AGENT} runtime")
            if self.agent_name is None:
                raise FieldError(f"agent_name is required for the {_RUNTIME_NEEDS_AGENT} runtime")
        for url in self.readiness_urls:
            _url("readiness_urls")(self, None, url)
        for name in _CLEANUP_KEYS - {"stateless"}:
            _url(name)(self, None, getattr(self.cleanup, name))

    @property
    def key(self) -> EnvKey:
        return (self.environment, self.config)


# ---- the file format: flat keys (the reference's), structured with the one converter ------------------

_structure_spec = make_dict_structure_fn(EnvironmentSpec, converter, _cattrs_forbid_extra_keys=True)
_structure_cleanup = make_dict_structure_fn(CleanupURLs, converter, _cattrs_forbid_extra_keys=True)
_FILE_KEYS = frozenset(a.name for a in attrs.fields(EnvironmentSpec)) - {"config", "cleanup"} | _CLEANUP_KEYS


def _from_file(raw: Any, _type: Any) -> EnvironmentSpec:
    if not isinstance(raw, dict):
        raise FieldError("must be a JSON object")
    body = dict(raw)
    for key in ("max_concurrency", "queue_capacity"):
        value = body.get(key)
        if isinstance(value, str) and value.strip().isdigit():
            body[key] = int(value)  # the reference accepts numeric strings here
    if isinstance(body.get("readiness_urls"), list):
        if not body["readiness_urls"]:
            raise FieldError("readiness_urls must be a non-empty list of URLs")
        body["readiness_urls"] = [_no_slash(url) for url in body["readiness_urls"]]
    if "runtime" not in body and "agent_url" not in body:
        raise FieldError('agent_url is required (or set "runtime": "echo")')
    if "readiness_urls" not in body and isinstance(body.get("agent_url"), str):
        body["readiness_urls"] = [_no_slash(body["agent_url"])]
    cleanup = {key: body.pop(key) for key in list(body) if key in _CLEANUP_KEYS}
    spec: EnvironmentSpec = _structure_spec({**body, "cleanup": {}}, EnvironmentSpec)
    return attrs.evolve(spec, cleanup=_structure_cleanup(cleanup, CleanupURLs))


def _to_file(spec: EnvironmentSpec) -> dict[str, Any]:
    body: dict[str, Any] = {
        attribute.name: converter.unstructure(getattr(spec, attribute.name))
        for attribute in attrs.fields(EnvironmentSpec)
        if attribute.name not in ("config", "cleanup")
    }
    body["readiness_urls"] = list(spec.readiness_urls)
    body.update(converter.unstructure(spec.cleanup))
    return {key: value for key, value in body.items() if value is not None}


converter.register_structure_hook(EnvironmentSpec, _from_file)
converter.register_unstructure_hook(EnvironmentSpec, _to_file)


def parse_spec(source: str, config: str, raw: object) -> EnvironmentSpec:
    where = f"{source}: environment config {config!r}"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a JSON object")
    unknown = sorted(set(raw) - _FILE_KEYS)
    if unknown:  # before structuring, so the message lists what is allowed
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(_FILE_KEYS))})")
    try:
        return structure({**raw, "config": config}, EnvironmentSpec, name="spec")
    except ProtocolError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def parse_environments(text: str, *, source: str) -> tuple[EnvironmentSpec, ...]:
    """Parse the reference JSON object {config name: spec} into specs."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{source}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{source}: must be a non-empty JSON object of config name -> environment spec")
    specs = tuple(parse_spec(source, config, raw) for config, raw in data.items())
    seen: set[EnvKey] = set()
    for spec in specs:
        if spec.key in seen:
            raise ConfigError(f"{source}: duplicate environment/config pair {spec.key!r}")
        seen.add(spec.key)
    return specs


def environments_document(specs: tuple[EnvironmentSpec, ...]) -> dict[str, Any]:
    """The specs as an environments file would hold them (what parse_environments reads back)."""
    return {spec.config: converter.unstructure(spec) for spec in specs}


__all__ = [
    "EnvKey",
    "EnvironmentSpec",
    "environments_document",
    "parse_environments",
    "parse_spec",
]


def specs_for(
    definitions: Sequence[EnvironmentDefinition],
    urls: Mapping[str, str],
    *,
    max_concurrency: int | None = None,
    logs: Mapping[str, str] | None = None,
) -> tuple[EnvironmentSpec, ...]:
    """Gateway specs for every registered config of `definitions`, whose servers listen at `urls` (base URL
    by server name, as `relax-gym up` started them) and write their output to `logs` (file by server name)."""
    logs = logs or {}
    specs = []
    for definition in definitions:
        contract = definition.cleanup
        cleanup = contract.resolve(urls[contract.server] if contract.server else None)
        behind_agent = definition.runtime == "nemo_gym"
        readiness = definition.readiness or tuple(server.name for server in definition.servers)
        names = sorted(
            (server.name for server in definition.servers), key=lambda name: name != definition.agent
        )
        server_logs = tuple(logs[name] for name in names if name in logs)
        for config in definition.configs:
            specs.append(
                EnvironmentSpec(
                    config=config,
                    environment=definition.name,
                    runtime=definition.runtime,
                    agent_name=definition.agent if behind_agent else None,
                    agent_url=urls[definition.agent] if behind_agent else None,
                    interrupt_policy=definition.interrupt_policy,
                    max_concurrency=max_concurrency or definition.max_concurrency,
                    queue_capacity=definition.queue_capacity,
                    max_deadline_s=definition.max_deadline_s,
                    readiness_urls=tuple(urls[name] + "/" for name in readiness),
                    cleanup=cleanup,
                    server_logs=server_logs,
                )
            )
    return tuple(specs)
