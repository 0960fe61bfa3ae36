"""Verifier probes: per real row, its expected answer boxed -> 1.0, a wrong number boxed -> 0.0.

The rows are upstream's example rows (see plugin.py): all five for math_with_judge, those with a plain
number answer for gsm8k. The right answer is written the way the prompt asks (``\\boxed{<answer>}``),
with the ``\\( ... \\)`` or ``$ ... $`` around some upstream answers taken off, as a model would write it.
The wrong one is the answer plus one for a number, else 0 (never an answer in these rows). Note: for a
big symbolic answer (example row 1) math-verify spends its full 5 s comparison budget before saying 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from relax_gym_core.plugin import VerifierProbe, answer

from relax_gym_gsm8k.answers import is_number_text, number_answer


def unwrapped(answer: str) -> str:
    """The answer without one outer ``\\( \\)`` or ``$ $`` (a model boxes the bare expression)."""
    text = answer.strip()
    if text.startswith("\\(") and text.endswith("\\)"):
        text = text[2:-2].strip()
    if len(text) > 1 and text.startswith("$") and text.endswith("$"):
        text = text[1:-1].strip()
    return text


def boxed(answer: str) -> str:
    return f"\\boxed{{{answer}}}"


def wrong_number(answer: str) -> str:
    text = unwrapped(answer)
    if is_number_text(text):
        return number_answer(str(Decimal(number_answer(text)) + 1))
    return "0"


def probes_for_row(row: Mapping[str, Any], index: int) -> list[VerifierProbe]:
    expected = str(row["expected_answer"])
    right, wrong = boxed(unwrapped(expected)), boxed(wrong_number(expected))
    return [
        VerifierProbe(
            name=f"example{index}:boxed_answer",
            row=row,
            output=answer(f"The answer is {right}.", f"{index}_right"),
            expected_reward=1.0,
        ),
        VerifierProbe(
            name=f"example{index}:wrong_number",
            row=row,
            output=answer(f"The answer is {wrong}.", f"{index}_wrong"),
            expected_reward=0.0,
        ),
    ]


def verifier_probes(rows: Mapping[int, Mapping[str, Any]]) -> list[VerifierProbe]:
    """The probes of every row, by its index among upstream's example rows."""
    return [probe for index, row in rows.items() for probe in probes_for_row(row, index)]
