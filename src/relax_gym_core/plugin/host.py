"""The plugin system's host face: what the gateway, the commands and the test support use to find plugins
and read what they registered. Plugins never import it (their face is relax_gym_core.plugin; their tests
get the plugin manager through relax_gym_core.testing).

Here: the plugin manager factory and its typed facade (manager.py), the registry the registration hooks
fill (registry.py), the checks the host applies to what a plugin gives it (environment.py: can it start
here, is a converted row a Relax row), the reference behaviour for an environment no plugin registers,
and the errors the host raises about plugins.
"""

from relax_gym_core.errors import (
    DuplicateEnvironmentError,
    PluginError,
    PluginLoadError,
    UnknownEnvironmentError,
)
from relax_gym_core.plugin.environment import (
    converted_row,
    reference_environment,
    relax_row_problem,
    startable,
)
from relax_gym_core.plugin.manager import Hooks, PluginInfo, make_plugin_manager
from relax_gym_core.plugin.registry import EnvironmentRegistry

__all__ = [
    "DuplicateEnvironmentError",
    "EnvironmentRegistry",
    "Hooks",
    "PluginError",
    "PluginInfo",
    "PluginLoadError",
    "UnknownEnvironmentError",
    "converted_row",
    "make_plugin_manager",
    "reference_environment",
    "relax_row_problem",
    "startable",
]
