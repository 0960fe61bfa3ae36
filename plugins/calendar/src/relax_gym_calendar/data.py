"""The upstream example rows, read from the INSTALLED nemo-gym package (never copied into this repo):
``resources_servers/calendar/data/example.jsonl``, 5 conversations of 10 to 42 messages."""

from __future__ import annotations

from typing import Any

from relax_gym_core.gym.installed import installed_file, read_jsonl

PACKAGE = "resources_servers.calendar"
EXAMPLE_FILE = "data/example.jsonl"


def example_rows() -> list[dict[str, Any]]:
    """The 5 upstream example rows, raw (fresh objects on every call)."""
    return read_jsonl(installed_file(PACKAGE, EXAMPLE_FILE))
