"""Plugin manager factory (no import-time global) and the typed facade over pm.hook."""

from __future__ import annotations

import importlib.metadata
import os
import sys
from collections.abc import Iterable
from typing import Any

import pluggy
from attrs import frozen

from relax_gym_core.environments import hookspecs, reference
from relax_gym_core.environments.definitions import CleanupContract, VerifierProbe, relax_row_problem
from relax_gym_core.environments.registry import (
    EnvironmentRegistrar,
    EnvironmentRegistry,
    RuntimeFactory,
    RuntimeRegistrar,
)
from relax_gym_core.errors import ConfigError, PluginError, PluginLoadError
from relax_gym_core.protocol import Generation
from relax_gym_core.runtimes.base import RunResult

ENTRY_POINT_GROUP = hookspecs.PROJECT
DISABLE_VAR = "RELAX_GYM_DISABLE_PLUGINS"
TRACE_VAR = "RELAX_GYM_TRACE_PLUGINS"


@frozen(kw_only=True)
class PluginInfo:
    name: str
    distribution: str | None
    version: str | None
    module: str


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    return sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)


def make_plugin_manager(
    *,
    load_entry_points: bool = True,
    blocked: Iterable[str] | None = None,
    plugins: Iterable[tuple[str, object]] = (),
) -> Hooks:
    """Build a fresh plugin manager: specs, blocked names, entry points, extra plugins, built-ins.

    `blocked` defaults to $RELAX_GYM_DISABLE_PLUGINS (comma-separated entry-point names).
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    names = blocked if blocked is not None else os.environ.get(DISABLE_VAR, "").split(",")
    for name in names:
        if name.strip():
            pm.set_blocked(name.strip())
    infos: list[PluginInfo] = []
    if load_entry_points:
        for ep in _entry_points():
            if pm.is_blocked(ep.name):
                continue
            dist = ep.dist
            where = f"entry point {ep.name!r} ({ep.value}) of distribution {dist.name if dist else '?'}"
            try:
                module = ep.load()
            except Exception as exc:
                raise PluginLoadError(
                    f"plugin {where} failed to import: {type(exc).__name__}: {exc}"
                ) from exc
            try:
                pm.register(module, name=ep.name)
            except (ValueError, pluggy.PluginValidationError) as exc:
                raise PluginLoadError(f"plugin {where} is invalid: {exc}") from exc
            infos.append(
                PluginInfo(
                    name=ep.name,
                    distribution=dist.name if dist else None,
                    version=dist.version if dist else None,
                    module=ep.value,
                )
            )
    for name, plugin in plugins:
        if pm.is_blocked(name):
            continue
        try:
            pm.register(plugin, name=name)
        except (ValueError, pluggy.PluginValidationError) as exc:
            raise PluginError(f"plugin {name!r} is invalid: {exc}") from exc
        infos.append(PluginInfo(name=name, distribution=None, version=None, module=repr(plugin)))
    pm.register(reference, name="relax_gym.reference")
    try:
        pm.check_pending()  # a misspelled hookimpl fails here, loudly
    except pluggy.PluginValidationError as exc:
        name = pm.get_name(exc.plugin) or repr(exc.plugin)
        info = next((info for info in infos if info.name == name), None)
        where = f" of distribution {info.distribution}" if info and info.distribution else ""
        unknown = sorted(
            hook
            for hook, caller in vars(pm.hook).items()
            if not hook.startswith("_")
            and not caller.has_spec()
            and any(impl.plugin is exc.plugin for impl in caller.get_hookimpls())
        )
        raise PluginError(
            f"plugin {name!r}{where} implements an unknown hook {', '.join(map(repr, unknown))} "
            f"(the hooks are {', '.join(hookspecs.__all__)})"
        ) from exc
    if os.environ.get(TRACE_VAR):
        pm.trace.root.setwriter(sys.stderr.write)  # stdout carries command output (plugins --json)
        pm.enable_tracing()
    return Hooks(pm, infos)


class Hooks:
    """Typed access to the hooks; core code never touches pm.hook directly."""

    def __init__(self, pm: pluggy.PluginManager, plugins: list[PluginInfo]) -> None:
        self.pm = pm
        self.plugins = plugins
        self._registry: EnvironmentRegistry | None = None
        self._runtimes: dict[str, RuntimeFactory] | None = None

    @property
    def environments(self) -> EnvironmentRegistry:
        if self._registry is None:
            registry = EnvironmentRegistry()
            for impl in self.pm.hook.register_environments.get_hookimpls():
                # Called one by one so each plugin gets a registrar naming it; like pluggy, pass only
                # the arguments the implementation declares.
                args = {"registrar": EnvironmentRegistrar(registry, impl.plugin_name)}
                impl.function(*(args[name] for name in impl.argnames))
            self._registry = registry
        return self._registry

    @property
    def runtimes(self) -> dict[str, RuntimeFactory]:
        """Runtime factories by name from the plugins' register_runtimes hooks (built-ins not included)."""
        if self._runtimes is None:
            factories: dict[str, tuple[str, RuntimeFactory]] = {}
            for impl in self.pm.hook.register_runtimes.get_hookimpls():
                args = {"registrar": RuntimeRegistrar(factories, impl.plugin_name)}
                impl.function(*(args[name] for name in impl.argnames))
            self._runtimes = {name: factory for name, (_plugin, factory) in factories.items()}
        return self._runtimes

    def owner(self, environment: str) -> PluginInfo | None:
        name = self.environments.owner(environment)
        return next((info for info in self.plugins if info.name == name), None)

    def convert_row(self, environment: str, row: dict[str, Any]) -> dict[str, Any]:
        """The Relax row for a raw row; PluginError if the answering plugin broke the row shape."""
        result = self.pm.hook.convert_row(environment=environment, row=row)
        problem = relax_row_problem(result)
        if problem is not None:
            raise PluginError(f"convert_row for environment {environment!r}: {problem}")
        converted: dict[str, Any] = result
        return converted

    def drop_reason(self, environment: str, row: dict[str, Any]) -> str | None:
        reason: str | None = self.pm.hook.drop_reason(environment=environment, row=row)
        return reason

    def build_run_body(
        self, environment: str, task: dict[str, Any], generation: Generation, rollout_id: str
    ) -> dict[str, Any]:
        body: dict[str, Any] = self.pm.hook.build_run_body(
            environment=environment, task=task, generation=generation, rollout_id=rollout_id
        )
        return body

    def verifier_probes(self, environment: str) -> list[VerifierProbe]:
        probes: list[VerifierProbe] | None = self.pm.hook.verifier_probes(environment=environment)
        return probes or []

    def cleanup_contract(self, environment: str) -> CleanupContract:
        contract: CleanupContract | None = self.pm.hook.cleanup_contract(environment=environment)
        if contract is None:
            raise ConfigError(
                f"no plugin declares how environment {environment!r} is cleaned up (cleanup_contract)"
            )
        return contract

    def map_result(self, environment: str, body: dict[str, Any]) -> RunResult:
        result: RunResult = self.pm.hook.map_result(environment=environment, body=body)
        return result
