"""The relax-nemo-gym/v1 reference behaviour: row conversion, the /run body, result mapping.

EnvironmentDefinition's methods default to these; a plugin that overrides one builds on them and on the
helpers beside them (output_counts, verified_answer, verified_result, reported_failure).

Result mapping goes one step past the reference: an answer in which the environment itself says it could not
score (reported_failure: NeMo Gym >= 0.5's judge failsafe, a masked sample) is an infrastructure failure
named by its kind, never the reward that sits beside it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any, Final

from relax_gym_core.errors import EnvironmentFailure, RowError
from relax_gym_core.plugin.runs import RunResult
from relax_gym_core.protocol import Generation, TrialStatus, run_indices
from relax_gym_core.protocol.jsonutil import deep_copy
from relax_gym_core.protocol.text import safe_text

_NOT_A_ROW = "NeMo Gym row must contain responses_create_params (a plugin converts rows of other shapes)"
_NOT_PRESERVED = frozenset({"input", "tools", "parallel_tool_calls", "instructions"})
_FANNED_INTO_PARAMS = frozenset({"tools", "parallel_tool_calls", "developer_message"})
VERIFIER_ERROR = "verifier_error"

# What NeMo Gym writes into an answer it could not score (read at v0.5.0, main and the 0.7.0 PRs):
# - `_ng_failure_class` (nemo_gym/judge.py, v0.5.0+): judge_failsafe answers a failed judge call with HTTP
#   200, reward 0.0, `_ng_failure_class: "judge_failed"` and the error in `_ng_failure_judge_error`; NeMo
#   Gym's own collector routes any row with a class to a failures file, out of its metrics.
# - `mask_sample` true, top level (0.7.0, #2611) or in `instance_config` (swe_agents and other agents): "not
#   policy evidence", with `failure_kind` / `failure_reason` (#2552, #2611) saying why.
FAILURE_CLASS: Final = "_ng_failure_class"
MASK_SAMPLE: Final = "mask_sample"
FAILURE_KIND: Final = "failure_kind"
FAILURE_REASON: Final = "failure_reason"
MASKED: Final = "masked"
_REASON_KEYS: Final = (FAILURE_REASON, "_ng_failure_judge_error", "_ng_failure_reason", "_ng_failure_error")
_KIND_CHARS = re.compile(r"[^A-Za-z0-9_.:-]+")
MAX_KIND_CHARS: Final = 64


def failure_kind_name(value: str) -> str:
    """An environment's failure kind as a bounded name (it becomes an error kind and a metrics label)."""
    return _KIND_CHARS.sub("_", value.strip())[:MAX_KIND_CHARS] or "unnamed"


def _reason(body: Mapping[str, Any]) -> str | None:
    for key in _REASON_KEYS:
        value = body.get(key)
        if isinstance(value, str) and value.strip():
            return safe_text(value)
    return None


def reported_failure(environment: str, body: Mapping[str, Any]) -> EnvironmentFailure | None:
    """The failure an environment reports inside an answer that otherwise looks scored, or None.

    - `_ng_failure_class` (any class): kind = the class (e.g. ``judge_failed``);
    - `mask_sample` true at the top level or in `instance_config`: kind ``masked:<failure_kind>`` (``masked``
      when none is named);
    - a `failure_kind` with no `mask_sample` beside it: kind ``masked:<failure_kind>``, as the answer does
      not say the score stands. With an explicit ``mask_sample: false`` it is NeMo Gym 0.7.0's "degraded but
      valid score" (#2608): scored, and the kind and reason are kept in the metrics (reported_degradation).

    The reason (`failure_reason`, `_ng_failure_judge_error`, ...) is one bounded printable line.
    """
    failure_class = body.get(FAILURE_CLASS)
    if isinstance(failure_class, str) and failure_class.strip():
        kind = failure_kind_name(failure_class)
    elif failure_class not in (None, False, ""):
        kind = "failure_class"  # a class that is not a name still says the answer is not a score
    else:
        instance = body.get("instance_config")
        masked = body.get(MASK_SAMPLE) is True or (
            isinstance(instance, Mapping) and instance.get(MASK_SAMPLE) is True
        )
        named = body.get(FAILURE_KIND)
        named = failure_kind_name(named) if isinstance(named, str) and named.strip() else None
        if not masked and (named is None or MASK_SAMPLE in body):
            return None
        kind = MASKED if named is None else f"{MASKED}:{named}"
    reason = _reason(body)
    message = f"{environment}: the environment reports {kind}: not a reward" + (
        f" ({reason})" if reason else ""
    )
    return EnvironmentFailure(message, kind=kind, reason=reason)


def reported_degradation(body: Mapping[str, Any]) -> dict[str, str]:
    """The `failure_kind` / `failure_reason` of a score the environment says stands (mask_sample false), as
    metrics: kept with the trial, never hidden."""
    named = body.get(FAILURE_KIND)
    if not isinstance(named, str) or not named.strip():
        return {}
    metrics = {FAILURE_KIND: failure_kind_name(named)}
    reason = _reason(body)
    if reason is not None:
        metrics[FAILURE_REASON] = reason
    return metrics


def raise_reported_failure(environment: str, body: Mapping[str, Any]) -> None:
    failure = reported_failure(environment, body)
    if failure is not None:
        raise failure


def convert_row(row: dict[str, Any]) -> dict[str, Any]:
    """Raw NeMo Gym row -> {"input": messages, "metadata": {...}} (reference converter)."""
    params = row.get("responses_create_params")
    if params is None:
        raise RowError(_NOT_A_ROW)
    if not isinstance(params, dict):
        raise RowError("responses_create_params must be an object")
    messages = params.get("input")
    if not isinstance(messages, list):
        raise RowError("responses_create_params.input must be a messages array")
    metadata = {key: value for key, value in row.items() if key != "responses_create_params"}
    preserved = {key: value for key, value in params.items() if key not in _NOT_PRESERVED}
    statement = row.get("problem_statement")
    if not messages and isinstance(statement, str) and statement:
        messages = [{"role": "user", "content": statement}]
        preserved["input"] = []  # the run body restores the empty agent input
    if preserved:
        metadata["responses_create_params"] = preserved
    answer = metadata.get("expected_answer")
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        metadata["expected_answer"] = str(answer)  # math_with_judge requires a string; prepare writes numbers
    for key in ("tools", "parallel_tool_calls"):
        if key in params:
            metadata[key] = params[key]
    if params.get("instructions"):
        metadata["developer_message"] = params["instructions"]
    return {"input": messages, "metadata": metadata}


def build_run_body(task: dict[str, Any], generation: Generation, rollout_id: str) -> dict[str, Any]:
    """Relax session input -> the agent's /run body (reference order of merges), with the rollout id as
    _ng_task_index/_ng_rollout_index (relax_gym_core.protocol.run_indices)."""
    task = deep_copy(task)  # per trial, and workplace tasks are ~17 KB: deepcopy was ~0.35 ms of them
    if isinstance(task.get("responses_create_params"), dict):
        body = task  # already a raw NeMo Gym row
    else:
        messages = task.pop("messages", [])
        metadata = task.pop("metadata", {})
        if not isinstance(messages, list) or not isinstance(metadata, dict):
            raise TypeError("Relax task must contain messages and metadata objects")
        params: dict[str, Any] = {"input": messages}
        preserved = metadata.pop("responses_create_params", {})
        if not isinstance(preserved, dict):
            raise TypeError("Relax task metadata.responses_create_params must be an object")
        params.update(preserved)
        for key in ("tools", "parallel_tool_calls"):
            if key in metadata:
                params[key] = metadata[key]
        if metadata.get("developer_message"):
            params["instructions"] = metadata["developer_message"]
        params.update(generation.responses_create_params)
        body = {"responses_create_params": params, **task}
        body.update({key: value for key, value in metadata.items() if key not in _FANNED_INTO_PARAMS})
    body.update(run_indices(rollout_id))
    return body


def output_counts(output: Any) -> dict[str, int]:
    """Counts of the Responses output items of a trajectory."""
    items = [item for item in output if isinstance(item, dict)] if isinstance(output, list) else []
    return {
        "model_output_items": len(items),
        "tool_calls": sum(item.get("type") == "function_call" for item in items),
        "tool_outputs": sum(item.get("type") == "function_call_output" for item in items),
        "assistant_messages": sum(item.get("type") == "message" for item in items),
    }


def verified_answer(environment: str, body: dict[str, Any]) -> tuple[list[Any], float]:
    """The scored output list and the reward of a verified /run answer.

    NeMo Gym's /verify answers a numeric ``reward`` next to the ``response`` it scored, so an answer
    without a response output list or a finite numeric (not boolean) reward was never scored: that is
    ``EnvironmentFailure(kind="verifier_error")`` (Relax drops the group), never a reward of 0. So is an
    answer in which the environment reports it could not score (reported_failure), whatever its reward.
    """
    raise_reported_failure(environment, body)
    response = body.get("response")
    output = response.get("output") if isinstance(response, dict) else None
    if not isinstance(output, list):
        raise EnvironmentFailure(
            f"{environment} /run answer has no response with an output list: the verifier did not score it",
            kind=VERIFIER_ERROR,
        )
    reward = body.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        raise EnvironmentFailure(
            f"{environment} /run answer has no numeric reward (got {reward!r:.40}): the verifier did not "
            "score it",
            kind=VERIFIER_ERROR,
        )
    return output, reward


def map_result(body: dict[str, Any], environment: str = "environment") -> RunResult:
    """The agent's /run answer -> trial result (reference normalisation); a failure the environment reports
    in it (reported_failure) is raised as EnvironmentFailure, never mapped to its reward."""
    raise_reported_failure(environment, body)
    metrics = dict(body["metrics"]) if isinstance(body.get("metrics"), dict) else {}
    metrics.update(reported_degradation(body))
    response = body.get("response")
    if isinstance(response, dict) and isinstance(response.get("output"), list):
        metrics.update(output_counts(response["output"]))
    artifact = body.get("artifact_ref")
    return RunResult(
        status=TrialStatus.TRUNCATED if body.get("truncated") else TrialStatus.COMPLETED,
        reward=body.get("reward"),
        metrics=metrics,
        artifact_ref=artifact if isinstance(artifact, str) and artifact else None,
    )


def verified_result(
    environment: str,
    body: dict[str, Any],
    metrics: Callable[[list[Any]], Mapping[str, Any]] | None = None,
) -> RunResult:
    """The reference result of a verified answer (verified_answer: an unscored one is verifier_error,
    never a reward of 0), with what `metrics(output)` adds to the reference metrics."""
    output, _reward = verified_answer(environment, body)
    result = map_result(body, environment)
    return result if metrics is None else result.with_metrics(metrics(output))
