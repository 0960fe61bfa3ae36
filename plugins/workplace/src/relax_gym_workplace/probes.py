"""Verifier probes derived from each row's own ground truth.

The workplace verifier replays the predicted calls and the ground truth on fresh databases and gives 1.0
only when the final states match. So, per row (as ``function_call`` items plus a closing assistant
message, the way a model answers):

- ``ground_truth``: the ground-truth calls replayed -> 1.0
- ``no_calls``: only the message -> 0.0 (1.0 here means the verifier saw no real ground truth, e.g. a
  string ``ground_truth``)
- ``missing_write``: the last write dropped -> 0.0
- ``wrong_id``: the last write that targets a record by id (``*_id`` argument) aimed at another id ->
  0.0, since the intended record is never written
- ``extra_write``: one more write after the ground truth -> 0.0. Creating calls (send, reply, forward,
  create, add) are duplicated; a repeated update or delete changes nothing, so it is aimed at another
  record instead (next free id). That retargeted update is a heuristic (the other record may already hold
  the value); the probes are checked against the real verifier for the example rows.

Probes that cannot be built for a row (no writes, no numeric ids) are left out.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from relax_gym_core.plugin import VerifierProbe, function_call, message

from relax_gym_workplace.rows import normalise_row

# Verbs in upstream tool names (e.g. email_reply_email, customer_relationship_manager_update_customer).
_CREATING = frozenset({"send", "reply", "forward", "create", "add"})
_IDEMPOTENT = frozenset({"update", "delete"})
_UNSAFE = re.compile(r"[^A-Za-z0-9_]")


def _verbs(name: str) -> set[str]:
    return set(name.split("_"))


def is_write(name: str) -> bool:
    return bool(_verbs(name) & (_CREATING | _IDEMPOTENT))


def _ids(calls: list[dict[str, str]]) -> set[str]:
    found: set[str] = set()
    for call in calls:
        for key, value in json.loads(call["arguments"]).items():
            if key.endswith("_id") and isinstance(value, str):
                found.add(value)
    return found


def _retarget(call: dict[str, str], taken: set[str]) -> dict[str, str] | None:
    """The call aimed at the next numeric id (same width) that the ground truth does not use."""
    arguments = json.loads(call["arguments"])
    for key, value in arguments.items():
        if key.endswith("_id") and isinstance(value, str) and value.isdigit():
            number = int(value) + 1
            while str(number).zfill(len(value)) in taken:
                number += 1
            arguments[key] = str(number).zfill(len(value))
            return {"name": call["name"], "arguments": json.dumps(arguments)}
    return None


def output_items(calls: list[dict[str, str]], tag: str, text: str = "Done.") -> tuple[dict[str, Any], ...]:
    """NeMo Gym Responses output items: one function_call per call, then an assistant message."""
    tag = _UNSAFE.sub("_", tag)
    items = [function_call(call["name"], call["arguments"], f"{tag}_{i}") for i, call in enumerate(calls)]
    return (*items, message(text, tag))


def probes_for_row(row: Mapping[str, Any]) -> list[VerifierProbe]:
    """The probes of one raw row (RowError if the row is unusable). Each probe's row is the normalised
    raw row, so ``ground_truth`` is always the list form."""
    raw = normalise_row(row)
    calls: list[dict[str, str]] = raw["ground_truth"]
    cases: list[tuple[str, list[dict[str, str]], float]] = [("ground_truth", calls, 1.0)]
    writes = [index for index, call in enumerate(calls) if is_write(call["name"])]
    if writes:
        last = writes[-1]
        taken = _ids(calls)
        cases.append(("no_calls", [], 0.0))
        cases.append(("missing_write", calls[:last] + calls[last + 1 :], 0.0))
        for index in reversed(writes):
            wrong = _retarget(calls[index], taken)
            if wrong is not None:
                cases.append(("wrong_id", [*calls[:index], wrong, *calls[index + 1 :]], 0.0))
                break
        final = calls[last]
        extra = dict(final) if _verbs(final["name"]) & _CREATING else _retarget(final, taken)
        if extra is not None:
            cases.append(("extra_write", [*calls, extra], 0.0))
    return [
        VerifierProbe(
            name=f"{raw['id']}:{name}",
            row=copy.deepcopy(raw),
            output=output_items(probe_calls, f"{raw['id']}_{name}"),
            expected_reward=expected,
        )
        for name, probe_calls, expected in cases
    ]


def verifier_probes(rows: Sequence[Mapping[str, Any]]) -> list[VerifierProbe]:
    """The probes of every row (upstream's example rows)."""
    return [probe for row in rows for probe in probes_for_row(row)]
