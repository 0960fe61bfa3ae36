"""Verifier probes: per bundled example row, its own answer in ``<answer>`` tags -> 1.0, a wrong answer in
the same tags -> 0.0.

The rows are the bundled examples (data.py). The right output is what the prompt asks for: some working,
then ``<answer>{answer}</answer>`` (upstream's verifier extracts the last tagged answer). The wrong answer
is well formed, so the probe tests the scorer and not the extraction: the number plus one for a number,
else the answer of the next example row of the same task that differs (real, and wrong for this row).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from relax_gym_core.plugin import VerifierProbe, answer

from relax_gym_reasoning_gym_cc.data import example_rows

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def tagged(text: str) -> str:
    return f"I worked it out step by step.\n<answer>{text}</answer>"


def _task(row: Mapping[str, Any]) -> str:
    return str(row["metadata"]["source_dataset"])


def wrong_answer(rows: Sequence[Mapping[str, Any]], index: int) -> str:
    """A well-formed answer that is not rows[index]'s."""
    own = str(rows[index]["answer"])
    if _NUMBER.fullmatch(own):
        return str(Decimal(own) + 1)
    task = _task(rows[index])
    for offset in range(1, len(rows)):
        other = rows[(index + offset) % len(rows)]
        if _task(other) == task and other["answer"] != rows[index]["answer"]:
            return str(other["answer"])
    raise ValueError(f"example row {index} ({task}): no other example of the task has a different answer")


def verifier_probes() -> list[VerifierProbe]:
    rows = example_rows()
    probes: list[VerifierProbe] = []
    for index, row in enumerate(rows):
        name = f"example{index}:{_task(row)}"
        probes += [
            VerifierProbe(
                name=f"{name}:own_answer",
                row=row,
                output=answer(tagged(str(row["answer"])), f"{index}_right"),
                expected_reward=1.0,
            ),
            VerifierProbe(
                name=f"{name}:wrong_answer",
                row=row,
                output=answer(tagged(wrong_answer(rows, index)), f"{index}_wrong"),
                expected_reward=0.0,
            ),
        ]
    return probes
