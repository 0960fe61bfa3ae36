"""Verifier probes built from each row's own ``exp_cal_state`` (nothing hard-coded):

- ``solved``: a schedule found by search that keeps every rule -> 1.0
- ``broken_constraint``: a schedule that keeps every rule but one event's constraint (the first event,
  in key order, for which such a schedule exists) -> 0.0
- ``visible_think``: the solved schedule behind a ``<think>`` block -> 0.0. Upstream's grader refuses any
  ``<think>``: the trainer must run a reasoning parser so the model's thinking never reaches the answer.

Each answer is the calendar as the system prompt asks for it: only a JSON list.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

from relax_gym_core.plugin import VerifierProbe, answer

from relax_gym_calendar.rows import check_row
from relax_gym_calendar.schedule import Event, Schedule, breaking, calendar, solve

THINK = "<think>\nEach event goes in its window, after its constraint, without overlaps.\n</think>\n\n"


def calendar_text(events: Sequence[Event], schedule: Schedule) -> str:
    return json.dumps(calendar(events, schedule))


def broken_schedule(events: Sequence[Event]) -> Schedule | None:
    for event in sorted(events, key=lambda event: event.key):
        found = breaking(events, event)
        if found is not None:
            return found
    return None


def probes_for_row(row: Mapping[str, Any], name: str) -> list[VerifierProbe]:
    """The probes of one raw row (RowError if the row is unusable; none if no schedule exists)."""
    raw = copy.deepcopy(dict(row))
    events = check_row(raw)
    solved = solve(events)
    if solved is None:
        return []
    cases = [("solved", calendar_text(events, solved), 1.0)]
    broken = broken_schedule(events)
    if broken is not None:
        cases.append(("broken_constraint", calendar_text(events, broken), 0.0))
    cases.append(("visible_think", THINK + calendar_text(events, solved), 0.0))
    return [
        VerifierProbe(
            name=f"{name}:{kind}",
            row=copy.deepcopy(raw),
            output=answer(text, f"{name}_{kind}"),
            expected_reward=expected,
        )
        for kind, text, expected in cases
    ]


def verifier_probes(rows: Sequence[Mapping[str, Any]]) -> list[VerifierProbe]:
    """The probes of every row (upstream's example rows)."""
    return [probe for index, row in enumerate(rows) for probe in probes_for_row(row, f"example{index}")]
