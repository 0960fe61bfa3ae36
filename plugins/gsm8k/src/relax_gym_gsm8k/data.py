"""Real rows from the installed nemo-gym package (read, never copied into this repository).

Upstream ships math_with_judge's ``data/example.jsonl`` (5 OpenMathReasoning rows, prompted with the
generic math prompt, answers such as "32" and ``\\(\\frac{333}{1997}\\)``). GSM8K itself ships no rows
(its prepare.py downloads the test split), so the gsm8k environment's real rows are the example rows
whose answer is a plain number: the same verifier, the same prompt, the shape of a gsm8k row.
"""

from __future__ import annotations

from typing import Any

from relax_gym_core.gym.installed import installed_file, read_jsonl

from relax_gym_gsm8k.answers import is_number_text

PACKAGE = "resources_servers.math_with_judge"
EXAMPLE_FILE = "data/example.jsonl"


def example_rows() -> list[dict[str, Any]]:
    """math_with_judge's 5 upstream example rows, raw (fresh objects on every call)."""
    return read_jsonl(installed_file(PACKAGE, EXAMPLE_FILE))


def numeric_example_rows() -> dict[int, dict[str, Any]]:
    """The example rows whose expected answer is a plain number (what a gsm8k answer is), by index."""
    return {
        index: row
        for index, row in enumerate(example_rows())
        if isinstance(row.get("expected_answer"), str) and is_number_text(row["expected_answer"])
    }
