"""The hooks an environment plugin implements (entry-point group ``relax_gym``).

Plugins answer only for their own environments: every per-environment hook receives the environment
name and returns None for names it does not own. Hooks marked firstresult stop at the first non-None
result. Hooks register and describe; the gateway's hot path works on the returned objects.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from relax_gym_core.environments.definitions import (
        CleanupContract,
        VerifierProbe,
    )
    from relax_gym_core.environments.registry import EnvironmentRegistrar, RuntimeRegistrar
    from relax_gym_core.protocol import Generation
    from relax_gym_core.runtimes.base import RunResult

PROJECT = "relax_gym"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)  # re-exported as relax_gym_core.hookimpl


@hookspec
def register_environments(registrar: EnvironmentRegistrar) -> None:
    """Register the environments this plugin provides with ``registrar.add(EnvironmentDefinition(...))``.

    Called once per plugin manager, when the registry is built. Registering a name twice (in one plugin
    or across plugins) is an error naming both plugins.
    """


@hookspec
def register_runtimes(registrar: RuntimeRegistrar) -> None:
    """Register runtimes this plugin brings with ``registrar.add(name, factory)``.

    A runtime runs the trials of environments whose spec (or EnvironmentDefinition.runtime) names it,
    for environments that do not run behind a NeMo Gym agent (a local sandbox, a CLI agent). The
    factory is called once per registered (environment, config) as ``factory(spec, hooks)`` and
    returns an object with the Runtime protocol of relax_gym_core.runtimes. "echo" and "nemo_gym" are
    built in. Registering a taken name is an error naming both plugins.
    """


@hookspec(firstresult=True)
def convert_row(environment: str, row: dict[str, Any]) -> dict[str, Any] | None:
    """Convert one raw NeMo Gym dataset row into a Relax row ``{"input": [...], "metadata": {...}}``.

    Raise ``RowError`` with a message naming the field for a row that cannot be used (the CLI adds the
    file and line). Stops at first non-None result; a built-in implementation follows the reference
    converter for environments whose plugins do not answer.
    """


@hookspec(firstresult=True)
def drop_reason(environment: str, row: dict[str, Any]) -> str | None:
    """Why a converted Relax row should be left out of a training mix, or None to keep it.

    `relax-gym mix` asks this for every row and counts what it drops by reason (e.g. a workplace row with
    no ground truth, which any do-nothing answer would score 1.0). Stops at first non-None result.
    """


@hookspec(firstresult=True)
def build_run_body(
    environment: str, task: dict[str, Any], generation: Generation, rollout_id: str
) -> dict[str, Any] | None:
    """Build the body of the agent's ``POST /run`` from the trial's task (the Relax session input).

    The core adds the trial's model-call tag afterwards; do not. Stops at first non-None result;
    a built-in implementation follows the reference (messages -> responses_create_params.input, metadata
    fan-out, _ng_task_index/_ng_rollout_index).
    """


@hookspec(firstresult=True)
def verifier_probes(environment: str) -> list[VerifierProbe] | None:
    """Known-good and known-bad outputs for real rows, with the reward the real verifier must give."""


@hookspec(firstresult=True)
def cleanup_contract(environment: str) -> CleanupContract | None:
    """How a run of this environment is released and proven released (or that it is stateless)."""


@hookspec(firstresult=True)
def map_result(environment: str, body: dict[str, Any]) -> RunResult | None:
    """Turn the agent's ``/run`` answer into the trial result (reward, status, metrics).

    Raise ``EnvironmentFailure(kind=...)`` when the answer shows an infrastructure failure: that must
    never become a reward of 0. Stops at first non-None result; a built-in implementation follows the
    reference normalisation.
    """


__all__ = [
    "build_run_body",
    "cleanup_contract",
    "convert_row",
    "drop_reason",
    "map_result",
    "register_environments",
    "register_runtimes",
    "verifier_probes",
]
