"""The relax_gym hooks of the gsm8k plugin (entry point ``gsm8k``): thin, gsm8k and math_with_judge only."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from relax_gym_core.plugin import STATELESS, hookimpl

from relax_gym_gsm8k import env, probes, results, rows
from relax_gym_gsm8k.judge import judge_settings, verify_timeout_s

if TYPE_CHECKING:
    from relax_gym_core.plugin import (
        CleanupContract,
        EnvironmentRegistrar,
        RunResult,
        VerifierProbe,
    )
    from relax_gym_core.protocol import Generation


@hookimpl
def register_environments(registrar: EnvironmentRegistrar) -> None:
    # The judge and the verify bound are read here, when the registry is built: a refused
    # configuration stops the command (ConfigError) before any server starts.
    for definition in env.definitions(judge_settings(), verify_timeout_s()):
        registrar.add(definition)


@hookimpl
def convert_row(environment: str, row: dict[str, Any]) -> dict[str, Any] | None:
    return rows.convert_row(environment, row) if environment in env.ENVIRONMENTS else None


@hookimpl
def build_run_body(
    environment: str, task: dict[str, Any], generation: Generation, rollout_id: str
) -> dict[str, Any] | None:
    if environment not in env.ENVIRONMENTS:
        return None
    return rows.build_run_body(environment, task, generation, rollout_id)


@hookimpl
def verifier_probes(environment: str) -> list[VerifierProbe] | None:
    return probes.verifier_probes(environment) if environment in env.ENVIRONMENTS else None


@hookimpl
def cleanup_contract(environment: str) -> CleanupContract | None:
    # Nothing outlives the /run call: relax-gym confirms cleanup without calling anything.
    return STATELESS if environment in env.ENVIRONMENTS else None


@hookimpl
def map_result(environment: str, body: dict[str, Any]) -> RunResult | None:
    return results.map_result(environment, body) if environment in env.ENVIRONMENTS else None
