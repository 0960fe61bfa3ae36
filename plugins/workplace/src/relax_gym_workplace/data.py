"""The upstream example rows, read from the INSTALLED nemo-gym package (never copied into this repo).

``resources_servers/workplace_assistant/data/example.jsonl`` holds 5 rows without a trailing newline
(``wc -l`` says 4). relax_gym_core.gym.installed finds it through this interpreter when NeMo Gym is
importable here, else by asking the NeMo Gym environment's python.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from relax_gym_core.gym.installed import installed_file, read_jsonl

PACKAGE = "resources_servers.workplace_assistant"
EXAMPLE_FILE = "data/example.jsonl"


def example_path() -> Path:
    """Where the installed example.jsonl is."""
    return installed_file(PACKAGE, EXAMPLE_FILE)


def example_rows() -> list[dict[str, Any]]:
    """The 5 upstream example rows, raw (fresh objects on every call)."""
    return read_jsonl(example_path())
