"""The agent's /run answer -> trial result: the reference mapping plus reasoning-gym's own figures, and
never a fake zero.

claude_code_agent's /run answers upstream's reasoning_gym verify response (the row, the ``response`` it
scored, ``reward`` = ``score``, ``task_name``, ``extracted_answer``) plus ``turns_used`` and
``finished_naturally``. A /run answer without a response and a numeric reward means nothing was scored:
``reference.verified_answer`` raises ``EnvironmentFailure(kind="verifier_error")`` (Relax drops the group),
never a reward of 0. Neither is an
empty output: the CLI then produced nothing at all (it failed or was killed), and upstream would score the
empty text 0.0 as if the model had answered wrongly (``kind="agent_error"``). A run that ended without a
final assistant message (max turns, time limit) keeps its score but is ``truncated``.
"""

from __future__ import annotations

from typing import Any

from relax_gym_core.plugin import EnvironmentFailure, RunResult, reference
from relax_gym_core.protocol import TrialStatus

AGENT_ERROR = "agent_error"


def map_result(environment: str, body: dict[str, Any]) -> RunResult:
    output, _reward = reference.verified_answer(environment, body)
    if not output:
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
