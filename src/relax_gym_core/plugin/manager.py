"""Plugin manager factory (no import-time global) and the typed facade over its registries.

Hooks only register: the facade calls them through pluggy once, when a registry is first read, and the rest
of the core works on the registered objects (an environment's methods, a runtime factory). With
$RELAX_GYM_TRACE_PLUGINS set, pluggy's hook-call monitoring writes what each plugin registered to stderr.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence

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
        if not isinstance(plugin, Hashable):  # pluggy keeps plugins in sets (Hooks calls one at a time)
            raise PluginError(
                f"plugin {name!r} is invalid: a {type(plugin).__name__} is unhashable "
                "(a plugin is a module, or an object pluggy can keep in a set)"
            )
        try:
            pm.register(plugin, name=name)
        except (ValueError, pluggy.PluginValidationError) as exc:
            raise PluginError(f"plugin {name!r} is invalid: {exc}") from exc
        infos.append(PluginInfo(name=name, distribution=None, version=None, module=repr(plugin)))
    _check_pending(pm, infos)
    if os.environ.get(TRACE_VAR):
        pm.add_hookcall_monitoring(_before_hook, _trace_hook)
    return Hooks(pm, infos)


def _check_pending(pm: pluggy.PluginManager, infos: list[PluginInfo]) -> None:
    """A misspelled hookimpl fails here, loudly: a PluginError naming the plugin and the unknown hook."""
    try:
        pm.check_pending()
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


def _before_hook(hook: str, impls: Sequence[pluggy.HookImpl], kwargs: Mapping[str, object]) -> None:
    del hook, impls, kwargs  # the trace line is written when the call returns: it says what was registered


def _trace_hook(
    outcome: pluggy.Result[object],
    hook: str,
    impls: Sequence[pluggy.HookImpl],
    kwargs: Mapping[str, object],
) -> None:
    """One stderr line per plugin and hook (stdout carries command output: `relax-gym plugins --json`)."""
    if not impls:
        return
    registrar = kwargs.get("registrar")
    added = registrar.added if isinstance(registrar, EnvironmentRegistrar | RuntimeRegistrar) else ()
    what = ", ".join(added) or "nothing"
    if outcome.exception is not None:
        what += f", then failed: {type(outcome.exception).__name__}"
    plugins = ", ".join(repr(impl.plugin_name) for impl in impls)  # one, as Hooks calls them
    sys.stderr.write(f"relax-gym: plugin {plugins} {hook}: {what}\n")


class Hooks:
    """Typed access to what the plugins registered; core code never touches pm.hook directly."""

    def __init__(self, pm: pluggy.PluginManager, plugins: list[PluginInfo]) -> None:
        self.pm = pm
        self.plugins = plugins
        self._registry: EnvironmentRegistry | None = None
        self._runtimes: dict[str, RuntimeFactory] | None = None

    @property
    def environments(self) -> EnvironmentRegistry:
        if self._registry is None:
            registry = EnvironmentRegistry()
            self._register("register_environments", lambda plugin: EnvironmentRegistrar(registry, plugin))
            self._registry = registry
        return self._registry

    @property
    def runtimes(self) -> dict[str, RuntimeFactory]:
        """Runtime factories by name from the plugins' register_runtimes hooks (built-ins not included)."""
        if self._runtimes is None:
            factories: dict[str, tuple[str, RuntimeFactory]] = {}
            self._register("register_runtimes", lambda plugin: RuntimeRegistrar(factories, plugin))
            self._runtimes = {name: factory for name, (_plugin, factory) in factories.items()}
        return self._runtimes

    def _register(
        self, hook: str, registrar_for: Callable[[str], EnvironmentRegistrar | RuntimeRegistrar]
    ) -> None:
        """Call a registration hook through pluggy one plugin at a time, so each gets a registrar naming
        it: in registration order, except that `tryfirst` hookimpls come first and `trylast` ones last (a
        plugin that fills gaps, as the catalogue, registers after the others and gives way to them). A crash
        in one is a PluginError naming the plugin."""
        impls = getattr(self.pm.hook, hook).get_hookimpls()
        for impl in sorted(impls, key=lambda impl: 0 if impl.tryfirst else 2 if impl.trylast else 1):
            others = [other.plugin for other in impls if other is not impl]
            call = self.pm.subset_hook_caller(hook, remove_plugins=others)
            try:
                call(registrar=registrar_for(impl.plugin_name))
            except RelaxGymError:  # a plugin error, or the operator's (a ConfigError): says what is wrong
                raise
            except Exception as exc:
                raise PluginError(
                    f"plugin {impl.plugin_name!r} failed in {hook}: {type(exc).__name__}: {exc}"
                ) from exc

    def owner(self, environment: str) -> PluginInfo | None:
        name = self.environments.owner(environment)
        return next((info for info in self.plugins if info.name == name), None)
