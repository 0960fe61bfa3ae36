"""Calendar rules as upstream's grader applies them, and a small search for schedules that keep them.

An event of ``exp_cal_state`` has a duration (minutes), a window (``min_time``..``max_time``) and at most
one constraint: ``before X`` (ends by X), ``after X`` (starts at or after X), ``between X and Y``
(inside), ``at X`` (starts at X). Times are 12-hour (``10am``, ``1:45pm``) or 24-hour (``14:30``),
lower-case as the grader reads them. Events must not overlap.

``solve`` finds a schedule (every event placed, whole minutes) or proves there is none; ``allowed`` picks
which starts each event may take, so the same search also finds a schedule that breaks exactly one chosen
constraint and keeps every other rule.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

from attrs import frozen

type ConstraintKind = Literal["before", "after", "between", "at"]

_TWELVE_HOUR = re.compile(r"(\d{1,2})(?::(\d{2}))?\s*(am|pm)")
_TWENTY_FOUR_HOUR = re.compile(r"(\d{1,2}):(\d{2})")
_CONSTRAINT = re.compile(r"(before|after|at) (.+)|between (.+) and (.+)")
DAY = 24 * 60


def parse_time(text: str) -> int:
    """Minutes after midnight; ValueError for anything the grader would not read the same way."""
    value = text.strip()
    if match := _TWELVE_HOUR.fullmatch(value):
        hour, minute = int(match[1]), int(match[2] or 0)
        if not 1 <= hour <= 12 or minute >= 60:
            raise ValueError(f"{text!r} is not a 12-hour time")
        return (hour % 12 + (12 if match[3] == "pm" else 0)) * 60 + minute
    if match := _TWENTY_FOUR_HOUR.fullmatch(value):
        hour, minute = int(match[1]), int(match[2])
        if hour >= 24 or minute >= 60:
            raise ValueError(f"{text!r} is not a 24-hour time")
        return hour * 60 + minute
    raise ValueError(f"{text!r} is not a time like '10am', '1:45pm' or '14:30'")


def format_time(minutes: int) -> str:
    """24-hour HH:MM, the format the calendar's system prompt asks the model for."""
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


@frozen
class Constraint:
    kind: ConstraintKind
    first: int
    second: int | None = None  # the end of "between"

    @classmethod
    def parse(cls, text: str) -> Constraint:
        match = _CONSTRAINT.fullmatch(text.strip())
        if match is None:
            raise ValueError("not one of 'before X', 'after X', 'between X and Y', 'at X'")
        if match[3] is not None:
            first, second = parse_time(match[3]), parse_time(match[4])
            if second <= first:
                raise ValueError("the 'between' span ends before it starts")
            return cls("between", first, second)
        kind: ConstraintKind = "before" if match[1] == "before" else "after" if match[1] == "after" else "at"
        return cls(kind, parse_time(match[2]))

    def allows(self, start: int, duration: int) -> bool:
        end = start + duration
        if self.kind == "before":
            return end <= self.first
        if self.kind == "after":
            return start >= self.first
        if self.kind == "at":
            return start == self.first
        assert self.second is not None
        return start >= self.first and end <= self.second


@frozen(kw_only=True)
class Event:
    key: str  # its key in exp_cal_state (the grader matches str(event_id) against it)
    event_id: int
    name: str
    duration: int
    earliest: int  # min_time
    latest: int  # max_time: the event must end by then
    constraint: Constraint | None

    def keeps_rules(self, start: int) -> bool:
        """Inside its window and its constraint satisfied."""
        inside = self.earliest <= start and start + self.duration <= self.latest
        return inside and (self.constraint is None or self.constraint.allows(start, self.duration))


type Allowed = Callable[[Event, int], bool]
type Schedule = dict[str, int]  # event key -> start minute


def solve(events: Sequence[Event], allowed: Allowed | None = None) -> Schedule | None:
    """Starts for every event, none overlapping, each allowed (default: keeps its rules); None if none.

    Any schedule, read in time order, can be redone by placing each event at its first allowed minute
    after the previous one ends, and no event then ends later. So it is enough to know, for every set of
    events, the earliest time by which they can all be placed that way: a search over the subsets of
    events (2^n, n being at most 7 in upstream's data), not over start times.
    """
    allowed = allowed or (lambda event, start: event.keeps_rules(start))
    starts = [[start for start in range(DAY) if allowed(event, start)] for event in events]
    # best[placed events as bits] = (when the last one ends, (previous set, event index, its start))
    best: dict[int, tuple[int, tuple[int, int, int] | None]] = {0: (0, None)}
    for placed in range(1 << len(events)):  # a set is always reached before any larger one
        if placed not in best:
            continue
        free_from = best[placed][0]
        for index, event in enumerate(events):
            if placed & (1 << index):
                continue
            position = bisect.bisect_left(starts[index], free_from)
            if position == len(starts[index]):
                continue
            start = starts[index][position]
            grown = placed | (1 << index)
            if grown not in best or start + event.duration < best[grown][0]:
                best[grown] = (start + event.duration, (placed, index, start))
    everything = (1 << len(events)) - 1
    if everything not in best:
        return None
    schedule: Schedule = {}
    step = best[everything][1]
    while step is not None:
        placed, index, start = step
        schedule[events[index].key] = start
        step = best[placed][1]
    return schedule


def breaking(events: Sequence[Event], target: Event) -> Schedule | None:
    """A schedule where `target` breaks its constraint (inside its window) and all else holds."""
    constraint = target.constraint
    if constraint is None:
        return None

    def allowed(event: Event, start: int) -> bool:
        if event.key != target.key:
            return event.keeps_rules(start)
        inside = event.earliest <= start and start + event.duration <= event.latest
        return inside and not constraint.allows(start, event.duration)

    return solve(events, allowed)


def calendar(events: Sequence[Event], schedule: Mapping[str, int]) -> list[dict[str, object]]:
    """The calendar as the system prompt asks for it: a JSON list of event_id, event_name, start_time
    (24-hour HH:MM) and duration, in order of start time."""
    return [
        {
            "event_id": event.event_id,
            "event_name": event.name,
            "start_time": format_time(schedule[event.key]),
            "duration": event.duration,
        }
        for event in sorted(events, key=lambda event: (schedule[event.key], event.key))
    ]
