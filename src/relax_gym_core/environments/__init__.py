"""The plugin system, and the public API of plugin distributions.

Plugins import what they describe (EnvironmentDefinition, NemoGymServer, CleanupContract, VerifierProbe,
RunResult), `hookimpl`, the errors they raise (RowError, EnvironmentFailure), and `reference` — the
reference conversion, run body and result mapping, to build on — from here; the core uses the
registry, the manager factory and the typed facade (Hooks).
"""

from relax_gym_core.environments import reference
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
    "reference",
    "verify_body",
]
