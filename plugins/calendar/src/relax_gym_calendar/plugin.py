"""The calendar environment (entry point ``calendar``): upstream's calendar resources server and
simple_agent, under the names Relax launch scripts use, with the relax-nemo-gym/v1 calendar recipe's limits.

Stateless (no tools, no session: the grader reads the final message), one generation per trial. What
differs from the reference: rows are checked (check_row, before conversion and again in their /run bodies;
rows.py: upstream's grader turns any bad event into a silent 0), probes are built by schedule search
(probes.py), and a result says whether the final item was a message with text (upstream grades 0
otherwise, e.g. a reply cut off while reasoning).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from relax_gym_core.gym.installed import example_rows as installed_rows
from relax_gym_core.plugin import (
    STATELESS,
    EnvironmentDefinition,
    EnvironmentRegistrar,
    RunResult,
    VerifierProbe,
    hookimpl,
    reference,
    resources_server,
    simple_agent,
)

from relax_gym_calendar import probes, rows

PACKAGE = "resources_servers.calendar"  # upstream's example rows: data/example.jsonl, read in place


def example_rows() -> list[dict[str, Any]]:
    """Upstream's 5 example conversations (10 to 42 messages), raw, fresh objects on every call."""
    return installed_rows(PACKAGE)


def answered(output: list[Any]) -> dict[str, bool]:
    last = output[-1] if output else None
    content = last.get("content") if isinstance(last, dict) else None
    first = content[0] if isinstance(content, list) and content else None
    return {
        "answered": isinstance(first, dict) and isinstance(first.get("text"), str) and bool(first["text"])
    }


class Calendar(EnvironmentDefinition):
    def check_row(self, row: dict[str, Any]) -> None:
        # Each row, and each /run body: a task without a usable exp_cal_state fails here, not as a 422 in
        # /verify.
        rows.check_row(row)

    def map_result(self, body: dict[str, Any]) -> RunResult:
        return reference.verified_result(self.name, body, answered)

    def verifier_probes(self) -> Sequence[VerifierProbe]:
        return probes.verifier_probes(example_rows())


CALENDAR = Calendar(
    name="calendar",
    configs=("calendar-v1",),
    agent="calendar_simple_agent",
    servers=(
        # The launcher puts upstream's directory on sys.path as NeMo Gym does (its app imports `utils`).
        resources_server(
            "calendar", "calendar", "resources_servers.calendar.app:CalendarResourcesServer", domain="agent"
        ),
        # One generation per trial: a reply with neither a message nor a tool call would loop otherwise.
        simple_agent("calendar_simple_agent", resources="calendar", max_steps=1),
    ),
    cleanup=STATELESS,  # nothing outlives the /run call
    description=(
        "NeMo Gym calendar: schedule every event of a long conversation under its constraints, answered "
        "as one JSON list and graded strictly 0/1 (stateless, one generation per trial, no tools)."
    ),
    max_deadline_s=1800.0,
    max_concurrency=8,
    queue_capacity=32,
)


@hookimpl
def register_environments(registrar: EnvironmentRegistrar) -> None:
    registrar.add(CALENDAR)
