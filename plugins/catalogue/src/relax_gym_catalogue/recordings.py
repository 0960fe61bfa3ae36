"""Verifier probes from NeMo Gym's recorded rollouts (``data/example_rollouts.jsonl``): each one's whole
trajectory (``response.output``) replayed through the real agent loop must give its recorded ``reward``.

A replay needs the task the rollout was recorded on, with every field its verifier reads. Most recordings
lack some of them (the rows are the /verify answer, and older code dropped fields), so a recording is
joined to its row of ``example.jsonl`` by its prompt: upstream's rows as the agent sent them (pydantic
adds ``"type": "message"`` and nulls; a gymnasium agent appends the reset observation as a user message).
Where several rows share the prompt (a game seeded per row), the recording's ``_ng_task_index`` picks one
of them. A recording of a task not shipped is its own task (its fields that example rows have). What
cannot be replayed here is skipped, with its reason: never counted as passing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from relax_gym_core.plugin import VerifierProbe
from relax_gym_core.protocol import TASK_INDEX

_MESSAGE_ONLY = {"role", "content"}


def _item(item: Any) -> Any:
    """One input item as both sides agree on it: no nulls, no "type": "message", a lone text part
    unwrapped."""
    if not isinstance(item, Mapping):
        return item
    kept = {k: v for k, v in item.items() if v is not None and not (k == "type" and v == "message")}
    content = kept.get("content")
    if isinstance(content, list):
        parts = [
            {k: v for k, v in p.items() if v is not None} if isinstance(p, Mapping) else p for p in content
        ]
        if len(parts) == 1 and isinstance(parts[0], dict) and parts[0].get("type") in ("input_text", "text"):
            kept["content"] = parts[0].get("text")
        else:
            kept["content"] = parts
    return kept


def normalized(items: Any) -> list[str]:
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    return [json.dumps(_item(i), sort_keys=True) for i in items] if isinstance(items, list) else []


def _prompt(row: Mapping[str, Any]) -> Any:
    params = row.get("responses_create_params")
    return params.get("input") if isinstance(params, Mapping) else None


def _starts(recorded: list[str], prompt: list[str]) -> bool:
    """The recorded input is `prompt`, maybe followed by user messages only (a reset observation)."""
    if not prompt or recorded[: len(prompt)] != prompt:
        return False
    return all(json.loads(item).get("role") == "user" for item in recorded[len(prompt) :])


def own_task(recorded: Mapping[str, Any], examples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A recording as its own task: the fields example rows have, its params without nulls."""
    keys = {key for row in examples for key in row} - {"responses_create_params"}
    task = {key: value for key, value in recorded.items() if key in keys}
    params = recorded.get("responses_create_params")
    if isinstance(params, Mapping):
        task["responses_create_params"] = {k: v for k, v in params.items() if v is not None}
    return task


def task_of(
    recorded: Mapping[str, Any], examples: Sequence[Mapping[str, Any]]
) -> tuple[dict[str, Any] | None, str | None]:
    """The task a recording replays on (its example row, else itself), or None and why not."""
    prompt = normalized(_prompt(recorded))
    candidates = [i for i, row in enumerate(examples) if _starts(prompt, normalized(_prompt(row)))]
    if len(candidates) > 1:
        index = recorded.get(TASK_INDEX)
        if isinstance(index, int) and index in candidates:
            candidates = [index]
        else:
            return None, f"its prompt is that of {len(candidates)} example rows and it names none of them"
    if candidates:
        return dict(examples[candidates[0]]), None
    return own_task(recorded, examples), None


def recorded_probes(
    lines: Sequence[str | Mapping[str, Any] | None],
    examples: Sequence[Mapping[str, Any]],
    *,
    skip: str | None = None,
) -> list[VerifierProbe]:
    """One replay probe per recorded rollout (None: a line that is not one). `skip` is why none of them
    can be replayed here (the table says, e.g. an unseeded game); a recording without a trajectory or a
    reward, or whose task cannot be told, is skipped with its own reason."""
    probes = []
    for index, recorded in enumerate(lines):
        name = f"rollout{index}"
        if not isinstance(recorded, Mapping):
            probes.append(_skipped(name, "a placeholder line, not a recorded rollout"))
            continue
        response = recorded.get("response")
        output = response.get("output") if isinstance(response, Mapping) else None
        reward = recorded.get("reward")
        if not isinstance(output, list) or isinstance(reward, bool) or not isinstance(reward, int | float):
            probes.append(_skipped(name, "no recorded trajectory and reward"))
            continue
        task, problem = task_of(recorded, examples)
        why = skip or problem
        probes.append(
            VerifierProbe(
                name=name,
                row=task if task is not None else dict(recorded),
                output=tuple(output),
                expected_reward=float(reward),
                replay=True,
                skip=why,
            )
        )
    return probes


def _skipped(name: str, reason: str) -> VerifierProbe:
    return VerifierProbe(name=name, row={}, output=(), expected_reward=0.0, replay=True, skip=reason)
