"""reasoning-gym rows -> Relax rows and /run bodies.

A raw row is what reasoning-gym's NeMo Gym datasets hold (upstream's scripts/create_dataset.py, the
published Nemotron-RL-ReasoningGym-v1, and this plugin's generator): ``question``, ``answer`` (text, or
null for tasks whose scorer checks the answer itself), ``metadata`` (``source_dataset`` names the
reasoning-gym task whose scorer upstream's /verify calls, plus that task's own fields), optionally
``responses_create_params`` and ``agent_ref``.

- ``metadata.source_dataset`` is required: without it upstream's /verify raises, i.e. HTTP 500.
- ``agent_ref`` is dropped: it names upstream's agent (reasoning_gym_simple_agent); relax-gym routes a
  row by environment and config, and the agent is the environment's.
- The prompt: a row's own ``responses_create_params.input`` is kept as written; a row without one is
  prompted with reasoning-gym's own default prompt (it asks for the final answer inside
  ``<answer></answer>``, which upstream's verifier extracts first), then the question. ``question``
  itself always stays as it was: the scorer gets it.
"""

from __future__ import annotations

import copy
from typing import Any

from relax_gym_core.plugin import RowError, reference
from relax_gym_core.protocol import Generation

from relax_gym_reasoning_gym_cc.data import TASKS
from relax_gym_reasoning_gym_cc.prompts import prompt

PARAMS = "responses_create_params"
_DROPPED = ("agent_ref",)


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def check_fields(row: dict[str, Any]) -> None:
    """The fields upstream's /verify needs, as it needs them (else it answers 422 or 500)."""
    if "question" not in row:
        raise RowError("question is missing (the reasoning_gym verifier requires it)")
    question = row["question"]
    if not isinstance(question, str) or not question.strip():
        raise RowError(f"question must be a non-empty string, not {_type_name(question)}")
    if "answer" not in row:
        raise RowError(
            "answer is missing (the reasoning_gym verifier requires it; null when the task has none)"
        )
    if row["answer"] is not None and not isinstance(row["answer"], str):
        raise RowError(f"answer must be a string or null, not {_type_name(row['answer'])}")
    metadata = row.get("metadata")
    if not isinstance(metadata, dict):
        raise RowError(f"metadata must be an object naming source_dataset, not {_type_name(metadata)}")
    task = metadata.get("source_dataset")
    if task is None:
        raise RowError(
            "metadata.source_dataset is missing: it names the reasoning-gym task whose scorer verifies the "
            "answer (without it upstream's /verify fails with HTTP 500)"
        )
    if not isinstance(task, str) or not task.strip():
        raise RowError(f"metadata.source_dataset must be a reasoning-gym task name, not {task!r:.60}")


def _check_input(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise RowError(f"{PARAMS}.input must be a non-empty messages array")


def convert_row(row: dict[str, Any]) -> dict[str, Any]:
    """Raw reasoning-gym row -> ``{"input": [...], "metadata": {...}}``."""
    check_fields(row)
    raw = {key: value for key, value in row.items() if key not in _DROPPED}
    if PARAMS in raw:
        params = raw[PARAMS]
        if isinstance(params, dict):
            _check_input(params.get("input"))
        return reference.convert_row(copy.deepcopy(raw))  # RowError for a malformed object
    return {
        "input": [{"role": "user", "content": prompt(row["question"])}],
        "metadata": copy.deepcopy(raw),
    }


def drop_reason(relax_row: dict[str, Any]) -> str | None:
    """A row naming no reasoning-gym task teaches nothing: upstream scores it 0.0 whatever the answer."""
    metadata = relax_row.get("metadata")
    inner = metadata.get("metadata") if isinstance(metadata, dict) else None
    task = inner.get("source_dataset") if isinstance(inner, dict) else None
    return None if task in TASKS else "unknown reasoning-gym task"


def build_run_body(task: dict[str, Any], generation: Generation, rollout_id: str) -> dict[str, Any]:
    """The reference /run body, checked like a row: a task the verifier cannot score (no
    metadata.source_dataset: HTTP 500 upstream) is refused before the CLI runs, not after."""
    body = reference.build_run_body(task, generation, rollout_id)
    body.pop("agent_ref", None)
    check_fields(body)
    params = body.get(PARAMS)
    _check_input(params.get("input") if isinstance(params, dict) else None)
    return body
