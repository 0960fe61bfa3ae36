"""The relax_gym hooks of the workplace plugin (entry point ``workplace``): thin, workplace_assistant only."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from relax_gym_core.plugin import hookimpl

from relax_gym_workplace import env, probes, results, rows

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
    registrar.add(env.DEFINITION)


@hookimpl
def convert_row(environment: str, row: dict[str, Any]) -> dict[str, Any] | None:
    return rows.convert_row(row) if environment == env.ENVIRONMENT else None


@hookimpl
def drop_reason(environment: str, row: dict[str, Any]) -> str | None:
    return rows.drop_reason(row) if environment == env.ENVIRONMENT else None


@hookimpl
def build_run_body(
    environment: str, task: dict[str, Any], generation: Generation, rollout_id: str
) -> dict[str, Any] | None:
    return rows.build_run_body(task, generation, rollout_id) if environment == env.ENVIRONMENT else None


@hookimpl
def verifier_probes(environment: str) -> list[VerifierProbe] | None:
    return probes.verifier_probes() if environment == env.ENVIRONMENT else None


@hookimpl
def cleanup_contract(environment: str) -> CleanupContract | None:
    return env.CLEANUP if environment == env.ENVIRONMENT else None


@hookimpl
def map_result(environment: str, body: dict[str, Any]) -> RunResult | None:
    return results.map_result(body) if environment == env.ENVIRONMENT else None
