"""Verifier probes: per real row, its expected answer boxed -> 1.0, a wrong number boxed -> 0.0.

The rows are upstream's example rows (see data.py): all five for math_with_judge, those with a plain
number answer for gsm8k. The right answer is written the way the prompt asks (``\\boxed{<answer>}``),
with the ``\\( ... \\)`` or ``$ ... $`` around some upstream answers taken off, as a model would write it.
The wrong one is the answer plus one for a number, else 0 (never an answer in these rows). Note: for a
big symbolic answer (example row 1) math-verify spends its full 5 s comparison budget before saying 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from relax_gym_core.plugin import VerifierProbe

from relax_gym_gsm8k.answers import is_number_text, number_answer
from relax_gym_gsm8k.data import example_rows, numeric_example_rows
from relax_gym_gsm8k.env import GSM8K


def answer_output(text: str, tag: str = "0") -> tuple[Mapping[str, Any], ...]:
    """The Responses output of an agent whose one final message is `text`."""
    content = [{"type": "output_text", "text": text, "annotations": []}]
    return (
        {
            "type": "message",
            "id": f"msg_{tag}",
            "role": "assistant",
            "status": "completed",
            "content": content,
        },
    )


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
    answer = str(row["expected_answer"])
    right, wrong = boxed(unwrapped(answer)), boxed(wrong_number(answer))
    return [
        VerifierProbe(
            name=f"example{index}:boxed_answer",
            row=row,
            output=answer_output(f"The answer is {right}.", f"{index}_right"),
            expected_reward=1.0,
        ),
        VerifierProbe(
            name=f"example{index}:wrong_number",
            row=row,
            output=answer_output(f"The answer is {wrong}.", f"{index}_wrong"),
            expected_reward=0.0,
        ),
    ]


def verifier_probes(environment: str) -> list[VerifierProbe]:
    rows = numeric_example_rows() if environment == GSM8K else dict(enumerate(example_rows()))
    return [probe for index, row in rows.items() for probe in probes_for_row(row, index)]
