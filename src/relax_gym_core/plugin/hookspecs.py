"""The hooks a plugin implements (entry-point group ``relax_gym``): they only register objects.

An environment is an object (EnvironmentDefinition: data plus behaviour); a runtime is a factory. Both
hooks are called once per plugin manager, when its registries are built; nothing here runs per trial.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from relax_gym_core.plugin.registry import EnvironmentRegistrar, RuntimeRegistrar

PROJECT = "relax_gym"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)  # re-exported as relax_gym_core.hookimpl


@hookspec
def register_environments(registrar: EnvironmentRegistrar) -> None:
    """Register the environments this plugin provides: ``registrar.add(MyEnvironment(name=..., ...))``.

    Registering a name twice (in one plugin or across plugins) is an error naming both plugins.
    """


@hookspec
def register_runtimes(registrar: RuntimeRegistrar) -> None:
    """Register runtimes this plugin brings with ``registrar.add(name, factory)``.

    A runtime runs the trials of environments whose spec (or EnvironmentDefinition.runtime) names it,
    for environments that do not run behind a NeMo Gym agent (a local sandbox, a CLI agent). The
    factory is called once per registered (environment, config) as ``factory(spec, environment)`` (the
    environment's object) and returns an object with the Runtime protocol (relax_gym_core.plugin.runs).
    "echo" and "nemo_gym" are built in. Registering a taken name is an error naming both plugins.
    """


__all__ = ["register_environments", "register_runtimes"]
