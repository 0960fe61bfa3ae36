"""The r2e_gym environment (entry point ``r2e``) as the local runtime runs it: our resources server
(relax_gym_r2e.server, on NeMo Gym's SimpleResourcesServer: bash / view / str_replace act on a per-rollout
checkout inside a bubblewrap sandbox, /verify runs the hidden tests) and NeMo Gym's unchanged simple_agent.
Production runs the same environment and config behind NeMo Gym's swe_agents with Apptainer instead
(relax_gym_r2e.production); that is configuration only here.

What differs from the reference: rows are checked (check_row) before conversion and again in their /run
bodies (rows.py: the swe_agents shape or the local one, every field named on error), probes are per
bundled task (probes.py), and results carry the SWE metrics of both runtimes, with Relax's R2E shaping
(below).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from relax_gym_core.ingym import CLEANUP_PATH
from relax_gym_core.plugin import (
    CleanupContract,
    EnvironmentDefinition,
    EnvironmentRegistrar,
    RunResult,
    VerifierProbe,
    hookimpl,
    reference,
    resources_server,
    simple_agent,
)
from relax_gym_core.protocol import InterruptPolicy, TrialStatus

from relax_gym_r2e import probes, rows

# ---- results: this plugin owns the SWE metric names, for both runtimes -------------------------------------
#
# Both answers carry the verdict at the top level: NeMo Gym's swe_agents (``resolved``, ``patch_exists``,
# ``agent_error_kind``, ``agent_timed_out``, ``eval_timed_out``, ``oom_killed``, ``eval_oom_killed``,
# ``mask_sample`` and timings; reward 1.0 / 0.0) and our local resources server (``resolved``,
# ``patch_exists``, test counts and timings; reward already 1.0 / 0.1 / 0.0). The reward is the answer's,
# with Relax's R2E shaping applied to swe_agents' unshaped zero: 0.0 with ``patch_exists`` true becomes 0.1
# (a patch that exists but does not resolve), so both runtimes score alike. An answer without a response
# output list or a numeric reward was never evaluated: ``reference.verified_answer`` makes that an
# infrastructure failure (EnvironmentFailure, kind verifier_error), never a reward of 0.

SHAPED, UNSOLVED = 0.1, 0.0
# Copied into metrics when present: swe_agents' names, then the local resources server's.
VERDICT_FIELDS = (
    "resolved",
    "patch_exists",
    "agent_error_kind",
    "agent_timed_out",
    "eval_timed_out",
    "oom_killed",
    "eval_oom_killed",
    "mask_sample",
)
COUNT_FIELDS = (
    "patch_applied",
    "patch_bytes",
    "tests_total",
    "tests_passed",
    "fail_to_pass_passed",
    "fail_to_pass_total",
    "pass_to_pass_passed",
    "pass_to_pass_total",
    "commands",
    "command_timeouts",
    "replayed",
)
TIMING_FIELDS = (
    "tests_seconds",
    "verify_seconds",
    "agent_seconds",
    "openhands_run_time",
    "final_eval_time",
    "total_command_exec_time",
    "total_model_call_time",
)


def shaped_reward(reward: float, *, patch_exists: bool) -> float:
    """swe_agents scores 1.0 / 0.0; a patch that exists but did not resolve earns the 0.1 shaping."""
    return SHAPED if reward == UNSOLVED and patch_exists else reward


def _json_scalar(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return value is None or isinstance(value, bool | int | str)


def verdict_metrics(body: dict[str, Any]) -> dict[str, Any]:
    """The verdict, counts and timings an answer carries (scalars only: detail stays in the /run answer)."""
    fields = (*VERDICT_FIELDS, *COUNT_FIELDS, *TIMING_FIELDS)
    return {field: body[field] for field in fields if field in body and _json_scalar(body[field])}


# ---- the environment -----------------------------------------------------------------------------------


class R2EGym(EnvironmentDefinition):
    def check_row(self, row: dict[str, Any]) -> None:
        # Each row (then converted the reference way: a swe_agents row's prompt is its problem statement,
        # the reference's R2E rule; a local row's is its input) and each /run body: a broken task fails
        # here, not inside the sandbox.
        rows.check_row(row)

    def map_result(self, body: dict[str, Any]) -> RunResult:
        # Not the reference mapping: the reward is shaped, and only the fields above become metrics.
        output, reward = reference.verified_answer(self.name, body)
        return RunResult(
            status=TrialStatus.TRUNCATED if body.get("truncated") else TrialStatus.COMPLETED,
            reward=shaped_reward(float(reward), patch_exists=body.get("patch_exists") is True),
            metrics={**reference.output_counts(output), **verdict_metrics(body), "upstream_reward": reward},
        )

    def verifier_probes(self) -> Sequence[VerifierProbe]:
        return probes.verifier_probes()


RESOURCES_SERVER = "r2e_gym"
AGENT = "r2e_gym_simple_agent"

R2E_GYM = R2EGym(
    name="r2e_gym",
    configs=("r2e-gym-v1",),
    agent=AGENT,
    servers=(
        resources_server(
            RESOURCES_SERVER,
            "r2e_gym",
            "relax_gym_r2e.server:R2EResourcesServer",
            domain="coding",
            command_timeout_s=30.0,
            max_command_timeout_s=300.0,
            tests_timeout_s=120.0,
            max_processes=64,
            max_memory_mb=1024,
        ),
        # Model turns per trial: R2E's local default, 30 agent turns.
        simple_agent(AGENT, resources=RESOURCES_SERVER, max_steps=30),
    ),
    # POST releases a rollout's sandboxes and directories, GET answers {"rollout_id", "clean"}.
    cleanup=CleanupContract.at(RESOURCES_SERVER, CLEANUP_PATH),
    description=(
        "R2E-Gym style repository repair: fix a bug in a small git repository with bash / view / "
        "str_replace in a bubblewrap sandbox; reward 1.0 when the hidden tests pass, 0.1 for a patch "
        "that does not, 0.0 for none."
    ),
    needs=("unprivileged user namespaces for bubblewrap", "git on the servers' host"),
    interrupt_policy=InterruptPolicy.PROTECTED,
    max_deadline_s=7200.0,
    max_concurrency=8,
    queue_capacity=16,
    readiness=(RESOURCES_SERVER, AGENT),
)


@hookimpl
def register_environments(registrar: EnvironmentRegistrar) -> None:
    registrar.add(R2E_GYM)
