"""The agent's /run answer -> trial result: the reference mapping plus reasoning-gym's own figures, and
never a fake zero.

claude_code_agent's /run answers upstream's reasoning_gym verify response (the row, the ``response`` it
scored, ``reward`` = ``score``, ``task_name``, ``extracted_answer``) plus ``turns_used`` and
``finished_naturally``. A /run answer without a response and a numeric reward means nothing was scored:
``EnvironmentFailure(kind="verifier_error")`` (Relax drops the group), never a reward of 0. Neither is an
empty output: the CLI then produced nothing at all (it failed or was killed), and upstream would score the
empty text 0.0 as if the model had answered wrongly (``kind="agent_error"``). A run that ended without a
final assistant message (max turns, time limit) keeps its score but is ``truncated``.
"""

from __future__ import annotations

import math
from typing import Any

from relax_gym_core.environments import EnvironmentFailure, RunResult, reference
from relax_gym_core.protocol import TrialStatus

VERIFIER_ERROR = "verifier_error"
AGENT_ERROR = "agent_error"


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def map_result(environment: str, body: dict[str, Any]) -> RunResult:
    response = body.get("response")
    if not isinstance(response, dict) or not isinstance(response.get("output"), list):
        raise EnvironmentFailure(
            f"{environment} /run answer has no response with an output list: the answer was not verified",
            kind=VERIFIER_ERROR,
        )
    reward = body.get("reward")
    if not _number(reward):
        raise EnvironmentFailure(
            f"{environment} /run answer has no numeric reward (got {reward!r:.40}): the verifier did not "
            "score the answer",
            kind=VERIFIER_ERROR,
        )
    if not response["output"]:
        raise EnvironmentFailure(
            f"{environment} /run answer has an empty output: the Claude Code CLI produced nothing, so its "
            "score is not the model's",
            kind=AGENT_ERROR,
        )
    result = reference.map_result(environment, body)
    metrics = dict(result.metrics)
    if isinstance(body.get("task_name"), str):
        metrics["task_name"] = body["task_name"]
    if isinstance(body.get("turns_used"), int) and not isinstance(body["turns_used"], bool):
        metrics["turns_used"] = body["turns_used"]
    extracted = body.get("extracted_answer")
    metrics["answer_extracted"] = isinstance(extracted, str) and bool(extracted)
    status = result.status
    if body.get("finished_naturally") is False:
        status = TrialStatus.TRUNCATED  # no final assistant message: the CLI was stopped, not done
    metrics["finished_naturally"] = status is not TrialStatus.TRUNCATED
    return RunResult(
        status=status,
        reward=result.reward,
        metrics=metrics,
        artifact_ref=result.artifact_ref,
        error=result.error,
    )
