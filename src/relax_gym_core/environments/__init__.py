"""The plugin system: what plugins describe, the registry, the manager factory and typed facade."""

from relax_gym_core.environments.definitions import (
    STATELESS,
    CleanupContract,
    EnvironmentDefinition,
    NemoGymServer,
    VerifierProbe,
    verify_body,
)
from relax_gym_core.environments.hookspecs import hookimpl
from relax_gym_core.environments.manager import Hooks, PluginInfo, make_plugin_manager
from relax_gym_core.environments.registry import EnvironmentRegistrar, EnvironmentRegistry
from relax_gym_core.errors import (
    DuplicateEnvironmentError,
    EnvironmentFailure,
    PluginLoadError,
    RowError,
    UnknownEnvironmentError,
)
from relax_gym_core.runtimes.base import RunResult

__all__ = [
    "STATELESS",
    "CleanupContract",
    "DuplicateEnvironmentError",
    "EnvironmentDefinition",
    "EnvironmentFailure",
    "EnvironmentRegistrar",
    "EnvironmentRegistry",
    "Hooks",
    "NemoGymServer",
    "PluginInfo",
    "PluginLoadError",
    "RowError",
    "RunResult",
    "UnknownEnvironmentError",
    "VerifierProbe",
    "hookimpl",
    "make_plugin_manager",
    "verify_body",
]
