"""Calendar rows, checked before the reference converts them (the whole conversation and
``exp_cal_state`` kept, no tools) and again in their /run bodies.

Raw rows (HF ``nvidia/Nemotron-RL-agent-calendar_scheduling``, upstream ``data/example.jsonl``) carry
``responses_create_params`` (a system prompt and a long user/assistant history ending with the user's
turn, ``tools: []``) and ``exp_cal_state``, the events the final calendar must hold. Upstream's grader
turns every problem it meets into a silent 0 (an unreadable time, an unknown constraint, a missing
field), and an unknown constraint form is even taken as satisfied; so each event is checked here and a
bad one is a RowError naming the field, e.g. ``exp_cal_state["1"].constraint``.
"""

from __future__ import annotations

from typing import Any

from relax_gym_core.plugin import RowError

from relax_gym_calendar.schedule import Constraint, Event, parse_time

PARAMS = "responses_create_params"
STATE = "exp_cal_state"
_ROLES = frozenset({"system", "developer", "user", "assistant"})


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _time(event: dict[str, Any], field: str, where: str) -> int:
    value = event.get(field)
    if not isinstance(value, str):
        raise RowError(f"{where}.{field} must be a time string like '10:00', not {_type_name(value)}")
    try:
        return parse_time(value)
    except ValueError as exc:
        raise RowError(f"{where}.{field}: {exc}") from None


def _event(key: str, event: Any) -> Event:
    where = f'{STATE}["{key}"]'
    if not isinstance(event, dict):
        raise RowError(f"{where} must be an event object, not {_type_name(event)}")
    event_id = event.get("event_id")
    if isinstance(event_id, bool) or not isinstance(event_id, int) or str(event_id) != key:
        raise RowError(f"{where}.event_id must be the integer {key!r} (the grader matches it to the key)")
    duration = event.get("duration")
    if isinstance(duration, bool) or not isinstance(duration, int) or duration <= 0:
        raise RowError(f"{where}.duration must be a positive whole number of minutes, got {duration!r:.40}")
    earliest, latest = _time(event, "min_time", where), _time(event, "max_time", where)
    if latest - earliest < duration:
        raise RowError(f"{where}: a {duration}-minute event does not fit between min_time and max_time")
    constraint = event.get("constraint")
    if constraint is not None and not isinstance(constraint, str):
        raise RowError(f"{where}.constraint must be null or text, not {_type_name(constraint)}")
    try:
        parsed = Constraint.parse(constraint) if constraint is not None else None
    except ValueError as exc:
        raise RowError(f"{where}.constraint {constraint!r}: {exc}") from None
    name = event.get("event_name")
    return Event(
        key=key,
        event_id=event_id,
        name=name if isinstance(name, str) and name else f"Event {key}",
        duration=duration,
        earliest=earliest,
        latest=latest,
        constraint=parsed,
    )


def events_of(row: dict[str, Any]) -> list[Event]:
    """The expected events of a raw row (or /run body), checked."""
    if STATE not in row:
        raise RowError(f"{STATE} is missing (the calendar grader scores against it)")
    state = row[STATE]
    if not isinstance(state, dict):
        raise RowError(f"{STATE} must be an object of event id -> event, not {_type_name(state)}")
    return [_event(key, event) for key, event in state.items()]


def _check_params(params: Any) -> None:
    if not isinstance(params, dict):
        raise RowError(f"{PARAMS} must be an object with the conversation as input")
    messages = params.get("input")
    if not isinstance(messages, list) or not messages:
        raise RowError(f"{PARAMS}.input must be a non-empty messages array (the whole conversation)")
    for index, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in _ROLES:
            raise RowError(f"{PARAMS}.input[{index}].role must be one of {sorted(_ROLES)}, got {role!r:.30}")
        if not isinstance(message.get("content"), str | list):
            raise RowError(f"{PARAMS}.input[{index}].content must be text or a list of content parts")
    if messages[-1]["role"] != "user":
        raise RowError(f"{PARAMS}.input must end with the user's turn (the model answers it)")
    if params.get("tools", []) != []:
        raise RowError(f"{PARAMS}.tools must be empty: the calendar task has no tools")


def check_row(row: dict[str, Any]) -> list[Event]:
    """A raw row (or /run body) checked; its expected events."""
    if PARAMS not in row:
        raise RowError(f"{PARAMS} is missing (the conversation the model answers)")
    _check_params(row[PARAMS])
    return events_of(row)
