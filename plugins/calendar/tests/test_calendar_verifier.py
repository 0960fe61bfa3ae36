"""Against the REAL grader: upstream's calendar resources server (the installed class, launched from its
own directory as NeMo Gym does), shared by the test session (the relax_gym_verifier fixture). Its model
server points at a port nobody listens on: nothing here may call a model."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from relax_gym_core.plugin import RowError, answer
from relax_gym_core.testing import Hooks, check_probes, converted_row
from relax_gym_core.testing.gym import Verifier

from relax_gym_calendar.plugin import CALENDAR
from relax_gym_calendar.probes import calendar_text
from relax_gym_calendar.rows import check_row
from relax_gym_calendar.schedule import solve

pytestmark = [pytest.mark.e2e, pytest.mark.nemo_gym("calendar")]


@pytest.fixture
def grader(relax_gym_verifier: Callable[..., Verifier]) -> Verifier:
    return relax_gym_verifier(CALENDAR.name)


def grade(grader: Verifier, row: dict[str, Any], text: str) -> float:
    return grader(row, answer(text, "t"))


def test_every_probe_gets_its_reward_from_the_real_grader(hooks: Hooks, grader: Verifier) -> None:
    probes = list(hooks.environments.get(CALENDAR.name).verifier_probes())
    kinds = ["solved", "broken_constraint", "visible_think"]
    assert [probe.name for probe in probes] == [f"example{i}:{kind}" for i in range(5) for kind in kinds]
    check_probes(hooks, CALENDAR.name, grader)


def test_the_solved_calendar_still_scores_with_prose_around_it(
    grader: Verifier, rows: list[dict[str, Any]]
) -> None:
    events = check_row(rows[3])
    schedule = solve(events)
    assert schedule is not None
    text = f"Here is your updated calendar:\n{calendar_text(events, schedule)}\nLet me know!"
    assert grade(grader, rows[3], text) == 1.0
    assert grade(grader, rows[3], "Everything fits nicely this afternoon.") == 0.0  # prose only


def test_an_unknown_constraint_is_graded_as_satisfied_upstream(
    grader: Verifier, rows: list[dict[str, Any]], hooks: Hooks
) -> None:
    """Why conversion refuses constraint forms it cannot read: upstream takes them as always kept."""
    row = copy.deepcopy(rows[0])
    row["exp_cal_state"]["0"]["constraint"] = "around noon"
    anywhere = json.dumps(
        [
            {"event_id": 0, "event_name": "a", "start_time": "15:00", "duration": 60},
            {"event_id": 1, "event_name": "b", "start_time": "10:00", "duration": 60},
        ]
    )
    assert grade(grader, row, anywhere) == 1.0
    with pytest.raises(RowError, match=r'^exp_cal_state\["0"\]\.constraint'):
        converted_row(hooks.environments.get(CALENDAR.name), row)
