"""The agent's /run answer -> trial result: the reference mapping plus the verifier's own figures, and
never a fake zero.

Upstream's /verify answers a numeric ``reward`` next to the ``response`` it scored (plus
``library_reward``, math-verify's verdict, and ``judge_evaluations`` when the judge was asked). A /run
answer without them means nothing was scored: ``reference.verified_answer`` makes that an infrastructure
failure (``EnvironmentFailure(kind="verifier_error")``, Relax drops the group), never a reward of 0.
"""

from __future__ import annotations

import math
from typing import Any

from relax_gym_core.plugin import RunResult, reference


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def map_result(environment: str, body: dict[str, Any]) -> RunResult:
    reference.verified_answer(environment, body)  # or EnvironmentFailure(kind="verifier_error")
    result = reference.map_result(environment, body)
    metrics = dict(result.metrics)
    if _number(body.get("library_reward")):
        metrics["library_reward"] = body["library_reward"]
    judged = body.get("judge_evaluations")
    metrics["judge_calls"] = len(judged) if isinstance(judged, list) else 0
    return RunResult(
        status=result.status,
        reward=result.reward,
        metrics=metrics,
        artifact_ref=result.artifact_ref,
        error=result.error,
    )
