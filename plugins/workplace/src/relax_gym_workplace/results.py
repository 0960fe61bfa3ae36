"""The agent's /run answer -> trial result: the reference mapping, plus ``turns``, minus fake zeros.

Infrastructure failures raise ``EnvironmentFailure(kind="verifier_error")`` (``reference.verified_answer``
checks) rather than leave the reward empty: upstream's ``/verify`` always answers a float ``reward`` next
to the ``response`` it scored, so a ``/run`` answer without a ``response`` (with an ``output`` list) or
without a numeric ``reward`` means the verifier never scored this trajectory. That must fail the trial
(Relax drops the group) and never become a reward of 0, which would train the policy against a failure
that was not its own.
"""

from __future__ import annotations

from typing import Any

from relax_gym_core.plugin import RunResult, reference

from relax_gym_workplace.env import ENVIRONMENT


def count_turns(output: list[Any]) -> int:
    """How many model responses produced this trajectory (simple_agent's ``response.output``).

    Rule: one turn per maximal run of model-produced items (``message``, ``function_call``,
    ``reasoning``, ...) not interrupted by a ``function_call_output``. simple_agent appends each
    response's items, then the outputs of that response's calls, then asks the model again; so a
    response with calls is always followed by tool outputs, and only a response without calls ends the
    loop (or, holding neither a call nor an assistant message, e.g. reasoning only, is merged into the
    next one: the count is then a lower bound). A message and calls in one response count once.
    """
    turns = 0
    in_turn = False
    for item in output:
        if isinstance(item, dict) and item.get("type") == "function_call_output":
            in_turn = False
        elif not in_turn:
            turns += 1
            in_turn = True
    return turns


def map_result(body: dict[str, Any]) -> RunResult:
    output, _reward = reference.verified_answer(ENVIRONMENT, body)
    result = reference.map_result(ENVIRONMENT, body)
    metrics = {**result.metrics, "turns": count_turns(output)}
    return RunResult(
        status=result.status,
        reward=result.reward,
        metrics=metrics,
        artifact_ref=result.artifact_ref,
        error=result.error,
    )
