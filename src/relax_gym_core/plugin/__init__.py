"""The plugin API: what an environment plugin imports, beside the protocol and as light as it.

A plugin registers environment objects with one hookimpl::

    from relax_gym_core import plugin

    class Mcqa(plugin.EnvironmentDefinition):
        def convert_row(self, row): ...  # only what differs from the reference behaviour

    @plugin.hookimpl
    def register_environments(registrar):
        registrar.add(Mcqa(name="mcqa", configs=("mcqa-v1",), agent="mcqa_agent", cleanup=plugin.STATELESS,
                           servers=(plugin.resources_server(...), plugin.simple_agent(...))))

Here: the environment object (environment.py), its servers (servers.py), cleanup contract (cleanup.py),
verifier probes and output builders (probes.py), the reference behaviour its methods default to
(reference.py), the run-adapter seam for a plugin's own runtime (runs.py), the hooks (hookspecs.py), and
the plugin system the core uses (manager.py, registry.py, specs.py). It imports the protocol and the errors
of the core, never a trial service, ledger, web framework or server. Servers that run inside the NeMo Gym
environment import relax_gym_core.ingym instead (standard library only).
"""

from relax_gym_core.errors import (
    DuplicateEnvironmentError,
    EnvironmentFailure,
    PluginError,
    PluginLoadError,
    RowError,
    UnknownEnvironmentError,
)
from relax_gym_core.plugin import reference
from relax_gym_core.plugin.cleanup import STATELESS, CleanupContract, CleanupURLs
from relax_gym_core.plugin.environment import (
    Admission,
    EnvironmentDefinition,
    EnvKey,
    converted_row,
    reference_environment,
    startable,
)
from relax_gym_core.plugin.hookspecs import hookimpl
from relax_gym_core.plugin.judge import JudgeEndpoint, JudgeVariables, judge_endpoint
from relax_gym_core.plugin.manager import Hooks, PluginInfo, make_plugin_manager
from relax_gym_core.plugin.probes import VerifierProbe, answer, function_call, message, verify_body
from relax_gym_core.plugin.registry import EnvironmentRegistrar, EnvironmentRegistry, RuntimeRegistrar
from relax_gym_core.plugin.runs import RunResult
from relax_gym_core.plugin.servers import (
    POLICY_MODEL,
    NemoGymServer,
    agent_server,
    resources_server,
    simple_agent,
)

__all__ = [
    "POLICY_MODEL",
    "STATELESS",
    "Admission",
    "CleanupContract",
    "CleanupURLs",
    "DuplicateEnvironmentError",
    "EnvKey",
    "EnvironmentDefinition",
    "EnvironmentFailure",
    "EnvironmentRegistrar",
    "EnvironmentRegistry",
    "Hooks",
    "JudgeEndpoint",
    "JudgeVariables",
    "NemoGymServer",
    "PluginError",
    "PluginInfo",
    "PluginLoadError",
    "RowError",
    "RunResult",
    "RuntimeRegistrar",
    "UnknownEnvironmentError",
    "VerifierProbe",
    "agent_server",
    "answer",
    "converted_row",
    "function_call",
    "hookimpl",
    "judge_endpoint",
    "make_plugin_manager",
    "message",
    "reference",
    "reference_environment",
    "resources_server",
    "simple_agent",
    "startable",
    "verify_body",
]
