"""The agent's /run answer -> trial result, for both runtimes: this plugin owns the SWE metric names.

Both answers carry the verdict at the top level: NeMo Gym's swe_agents (``resolved``, ``patch_exists``,
``agent_error_kind``, ``agent_timed_out``, ``eval_timed_out``, ``oom_killed``, ``eval_oom_killed``,
``mask_sample`` and timings; reward 1.0 / 0.0) and our local resources server (``resolved``,
``patch_exists``, test counts and timings; reward already 1.0 / 0.1 / 0.0). The reward is the answer's,
with Relax's R2E shaping applied to swe_agents' unshaped zero: 0.0 with ``patch_exists`` true becomes
0.1 (a patch that exists but does not resolve), so both runtimes score alike.

An answer without a response output list or a numeric reward was never evaluated:
``reference.verified_answer`` makes that an infrastructure failure (EnvironmentFailure, kind
verifier_error), never a reward of 0.
"""

from __future__ import annotations

import math
from typing import Any

from relax_gym_core.plugin import RunResult, reference
from relax_gym_core.protocol import TrialStatus

from relax_gym_r2e.env import ENVIRONMENT

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


def map_result(body: dict[str, Any]) -> RunResult:
    output, reward = reference.verified_answer(ENVIRONMENT, body)
    metrics: dict[str, Any] = reference.output_counts(output)
    for field in (*VERDICT_FIELDS, *COUNT_FIELDS, *TIMING_FIELDS):
        if field in body and _json_scalar(body[field]):
            metrics[field] = body[field]
    metrics["upstream_reward"] = reward
    return RunResult(
        status=TrialStatus.TRUNCATED if body.get("truncated") else TrialStatus.COMPLETED,
        reward=shaped_reward(float(reward), patch_exists=body.get("patch_exists") is True),
        metrics=metrics,
    )
