"""The calendar rules as the grader applies them, and the search for schedules (used by the probes, whose
rewards are checked against the real grader in test_calendar_verifier.py)."""

from __future__ import annotations

import itertools

import pytest

from relax_gym_calendar.schedule import Constraint, Event, breaking, calendar, format_time, parse_time, solve


@pytest.mark.parametrize(
    ("text", "minutes"),
    [
        ("10am", 600),
        ("10 am", 600),
        ("1:45pm", 825),
        ("12pm", 720),
        ("12:30pm", 750),
        ("12am", 0),
        ("10:00", 600),
        ("16:00", 960),
        (" 9:05 ", 545),
    ],
)
def test_times_read_as_the_grader_reads_them(text: str, minutes: int) -> None:
    assert parse_time(text) == minutes


@pytest.mark.parametrize("text", ["10AM", "noon", "13pm", "10:75", "24:00", "10", "1:5pm", ""])
def test_times_the_grader_cannot_read_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not"):
        parse_time(text)


def test_constraints() -> None:
    between = Constraint.parse("between 10am and 11:45am")
    assert between == Constraint("between", 600, 705)
    assert between.allows(600, 60) and between.allows(645, 60)
    assert not between.allows(660, 60)  # ends 12:00, after 11:45
    assert Constraint.parse("before 1:45pm").allows(765, 60)  # ends exactly at 1:45pm
    assert not Constraint.parse("before 1:45pm").allows(770, 60)
    assert Constraint.parse("after 2pm").allows(840, 30)
    assert not Constraint.parse("after 2pm").allows(835, 30)
    assert Constraint.parse("at 12:15pm") == Constraint("at", 735)
    for text in ("around noon", "between 2pm and 1pm", "before", "at 10AM"):
        with pytest.raises(ValueError):
            Constraint.parse(text)


def event(
    key: str, duration: int, constraint: str | None = None, window: tuple[str, str] = ("10:00", "16:00")
) -> Event:
    return Event(
        key=key,
        event_id=int(key),
        name=f"Event {key}",
        duration=duration,
        earliest=parse_time(window[0]),
        latest=parse_time(window[1]),
        constraint=Constraint.parse(constraint) if constraint else None,
    )


def overlapping(events: list[Event], schedule: dict[str, int]) -> bool:
    spans = sorted((schedule[e.key], schedule[e.key] + e.duration) for e in events)
    return any(end > start for (_, end), (start, _) in itertools.pairwise(spans))


def test_solve_keeps_every_rule() -> None:
    events = [
        event("0", 60, "at 11am"),
        event("1", 60, "before 1pm"),
        event("2", 45, "between 11:30am and 1:30pm"),
        event("3", 35, None, ("15:00", "16:00")),
    ]
    schedule = solve(events)
    assert schedule is not None
    assert (schedule["0"], schedule["1"]) == (660, 600)  # event 1 only fits before event 0
    assert all(e.keeps_rules(schedule[e.key]) for e in events)
    assert not overlapping(events, schedule)


def test_solve_finds_tight_packings_and_says_when_there_is_none() -> None:
    full = [event(str(i), 60) for i in range(6)]  # exactly fills 10:00-16:00
    schedule = solve(full)
    assert schedule is not None
    assert sorted(schedule.values()) == [600, 660, 720, 780, 840, 900]
    assert solve([*full, event("6", 5)]) is None
    assert solve([event("0", 60, "at 10am"), event("1", 30, "before 10:30am")]) is None
    assert solve([event("0", 90, "at 11am"), event("1", 90, "before 1pm")]) is None


def test_breaking_breaks_only_the_target_constraint() -> None:
    events = [event("0", 60, "between 10am and 11:45am"), event("1", 60, "before 1:45pm")]
    schedule = breaking(events, events[0])
    assert schedule is not None
    assert not events[0].keeps_rules(schedule["0"])
    assert events[0].earliest <= schedule["0"] and schedule["0"] + 60 <= events[0].latest  # still in window
    assert events[1].keeps_rules(schedule["1"])
    assert not overlapping(events, schedule)
    assert breaking(events, event("2", 30)) is None  # nothing to break


def test_the_calendar_is_the_json_shape_the_system_prompt_asks_for() -> None:
    events = [event("0", 60), event("1", 30)]
    assert calendar(events, {"0": 690, "1": 600}) == [
        {"event_id": 1, "event_name": "Event 1", "start_time": "10:00", "duration": 30},
        {"event_id": 0, "event_name": "Event 0", "start_time": "11:30", "duration": 60},
    ]
    assert format_time(545) == "09:05"
