"""The plugin API's author face: what an environment plugin imports, beside the protocol and as light as it.

A plugin registers environment objects with one hookimpl::

    from relax_gym_core import plugin

    class Mcqa(plugin.EnvironmentDefinition):
        def convert_row(self, row): ...  # only what differs from the reference behaviour

    @plugin.hookimpl
    def register_environments(registrar):
        registrar.add(Mcqa(name="mcqa", configs=("mcqa-v1",), agent="mcqa_agent", cleanup=plugin.STATELESS,
                           servers=(plugin.resources_server(...), plugin.simple_agent(...))))

Exported here: the environment object (environment.py), the hooks' registrars (registry.py) and hookimpl
(hookspecs.py), its servers (servers.py), cleanup contract (cleanup.py), verifier probes and output
builders (probes.py), a run's result (runs.py, also the seam of a plugin's own runtime), the reference
behaviour its methods default to (reference.py), the LLM-judge helpers (judge.py), and the errors a plugin
raises. The host's face (the plugin manager and registry, the checks it applies to what plugins give it)
is relax_gym_core.plugin.host, which plugins never import. The package imports the protocol and the errors
of the core, never a trial service, ledger, web framework or server. Servers that run inside the NeMo Gym
environment import relax_gym_core.ingym instead (standard library only).
"""

from relax_gym_core.errors import EnvironmentFailure, RowError
from relax_gym_core.plugin import reference
from relax_gym_core.plugin.cleanup import STATELESS, CleanupContract, CleanupURLs
from relax_gym_core.plugin.environment import EnvironmentDefinition
from relax_gym_core.plugin.hookspecs import hookimpl
from relax_gym_core.plugin.judge import JudgeEndpoint, JudgeVariables, judge_endpoint
from relax_gym_core.plugin.probes import VerifierProbe, answer, function_call, message, verify_body
from relax_gym_core.plugin.registry import EnvironmentRegistrar, RuntimeRegistrar
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
    "CleanupContract",
    "CleanupURLs",
    "EnvironmentDefinition",
    "EnvironmentFailure",
    "EnvironmentRegistrar",
    "JudgeEndpoint",
    "JudgeVariables",
    "NemoGymServer",
    "RowError",
    "RunResult",
    "RuntimeRegistrar",
    "VerifierProbe",
    "agent_server",
    "answer",
    "function_call",
    "hookimpl",
    "judge_endpoint",
    "message",
    "reference",
    "resources_server",
    "simple_agent",
    "verify_body",
]
