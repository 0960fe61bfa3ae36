"""Plugin manager factory (no import-time global) and the typed facade over its registries.

Hooks only register: the facade calls them once, when a registry is first read, and the rest of the core
works on the registered objects (an environment's methods, a runtime factory).
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from collections.abc import Iterable

import pluggy
from attrs import frozen

from relax_gym_core.errors import PluginError, PluginLoadError, RelaxGymError
from relax_gym_core.plugin import hookspecs
from relax_gym_core.plugin.registry import (
    EnvironmentRegistrar,
    EnvironmentRegistry,
    RuntimeFactory,
    RuntimeRegistrar,
)

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
    return Hooks(pm, infos, trace=bool(os.environ.get(TRACE_VAR)))


class Hooks:
    """Typed access to what the plugins registered; core code never touches pm.hook directly."""

    def __init__(self, pm: pluggy.PluginManager, plugins: list[PluginInfo], *, trace: bool = False) -> None:
        self.pm = pm
        self.plugins = plugins
        self._registry: EnvironmentRegistry | None = None
        self._runtimes: dict[str, RuntimeFactory] | None = None
        self._trace = trace

    @property
    def environments(self) -> EnvironmentRegistry:
        if self._registry is None:
            registry = EnvironmentRegistry()
            for impl in self.pm.hook.register_environments.get_hookimpls():
                before = {definition.name for definition in registry}
                self._register(impl, {"registrar": EnvironmentRegistrar(registry, impl.plugin_name)})
                self._say(impl, sorted({definition.name for definition in registry} - before))
            self._registry = registry
        return self._registry

    @property
    def runtimes(self) -> dict[str, RuntimeFactory]:
        """Runtime factories by name from the plugins' register_runtimes hooks (built-ins not included)."""
        if self._runtimes is None:
            factories: dict[str, tuple[str, RuntimeFactory]] = {}
            for impl in self.pm.hook.register_runtimes.get_hookimpls():
                before = set(factories)
                self._register(impl, {"registrar": RuntimeRegistrar(factories, impl.plugin_name)})
                self._say(impl, sorted(set(factories) - before))
            self._runtimes = {name: factory for name, (_plugin, factory) in factories.items()}
        return self._runtimes

    def _register(self, impl: pluggy.HookImpl, args: dict[str, object]) -> None:
        """Call one plugin's registration hook (one by one, so each gets a registrar naming it; like
        pluggy, with only the arguments it declares). A crash in it is a PluginError naming the plugin."""
        try:
            impl.function(*(args[name] for name in impl.argnames))
        except RelaxGymError:  # a plugin error, or the operator's (a ConfigError): says what is wrong
            raise
        except Exception as exc:
            raise PluginError(
                f"plugin {impl.plugin_name!r} failed in {impl.function.__name__}: {type(exc).__name__}: {exc}"
            ) from exc

    def _say(self, impl: pluggy.HookImpl, registered: list[str]) -> None:
        if self._trace:  # $RELAX_GYM_TRACE_PLUGINS; stderr: stdout carries command output (plugins --json)
            names = ", ".join(registered) or "nothing"
            sys.stderr.write(f"relax-gym: plugin {impl.plugin_name!r} {impl.function.__name__}: {names}\n")

    def owner(self, environment: str) -> PluginInfo | None:
        name = self.environments.owner(environment)
        return next((info for info in self.plugins if info.name == name), None)
