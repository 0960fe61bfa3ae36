"""The agent's /run answer -> trial result: the reference mapping, minus fake zeros.

Upstream's /verify answers a numeric ``reward`` next to the ``response`` it graded; a /run answer
without them means nothing was graded: ``reference.verified_answer`` makes that an infrastructure failure
(``EnvironmentFailure(kind="verifier_error")``, Relax drops the group), never a reward of 0.
``metrics.answered`` says whether the final output item was a message with text (upstream grades 0
otherwise, e.g. a reply cut off while still reasoning).
"""

from __future__ import annotations

from typing import Any

from relax_gym_core.environments import RunResult, reference

from relax_gym_calendar.env import ENVIRONMENT


def answered(output: list[Any]) -> bool:
    last = output[-1] if output else None
    content = last.get("content") if isinstance(last, dict) else None
    first = content[0] if isinstance(content, list) and content else None
    return isinstance(first, dict) and isinstance(first.get("text"), str) and bool(first["text"])


def map_result(body: dict[str, Any]) -> RunResult:
    output, _reward = reference.verified_answer(ENVIRONMENT, body)
    result = reference.map_result(ENVIRONMENT, body)
    return RunResult(
        status=result.status,
        reward=result.reward,
        metrics={**result.metrics, "answered": answered(output)},
        artifact_ref=result.artifact_ref,
        error=result.error,
    )
