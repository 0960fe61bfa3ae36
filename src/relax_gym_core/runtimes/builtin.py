"""The runtimes every gateway has: "echo" (in-process, for tests, benchmarks and the demo) and "nemo_gym"
(a NeMo Gym agent's POST /run). Plugins add theirs with the register_runtimes hook; a plugin cannot take
these names. Each factory imports its runtime when called, so listing the names costs nothing.
"""

from __future__ import annotations

from relax_gym_core.errors import PluginError
from relax_gym_core.plugin import EnvironmentDefinition
from relax_gym_core.plugin.host import Hooks
from relax_gym_core.plugin.registry import RuntimeFactory
from relax_gym_core.plugin.runs import Runtime
from relax_gym_core.plugin.specs import EnvironmentSpec


def _echo(_spec: EnvironmentSpec, _environment: EnvironmentDefinition) -> Runtime:
    from relax_gym_core.runtimes.echo import EchoRuntime  # noqa: PLC0415

    return EchoRuntime()


def _nemo_gym(spec: EnvironmentSpec, environment: EnvironmentDefinition) -> Runtime:
    from relax_gym_core.runtimes.nemo_gym import NemoGymRuntime  # noqa: PLC0415

    return NemoGymRuntime(spec, environment)


BUILTIN_RUNTIMES: dict[str, RuntimeFactory] = {"echo": _echo, "nemo_gym": _nemo_gym}


def runtime_factories(hooks: Hooks) -> dict[str, RuntimeFactory]:
    """The built-in runtimes plus every plugin's, or PluginError if a plugin takes a built-in name."""
    taken = sorted(set(BUILTIN_RUNTIMES) & set(hooks.runtimes))
    if taken:
        raise PluginError(
            f"runtime {taken[0]!r} is built in; a plugin must register its runtime under another name"
        )
    return {**BUILTIN_RUNTIMES, **hooks.runtimes}
