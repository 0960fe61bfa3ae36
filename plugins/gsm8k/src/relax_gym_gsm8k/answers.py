"""Expected answers as upstream's verifier needs them: a string (a number gets HTTP 422 from /verify,
and the agent's /run then fails with 500), checked per environment.

gsm8k answers are numbers. They arrive as NeMo Gym's benchmark rows write them (``expected_answer``: an
int, or a float, from benchmarks/gsm8k/prepare.py) or as the original GSM8K rows do (``answer``: a worked
solution whose last line is ``#### 18``, thousands separated by commas). Both become canonical decimal
text ("18", "2.5", "1000"). One exception is kept: upstream's prepare.py hand-fixes one question's answer
to the time "07:30", which math-verify compares as written.

math_with_judge answers are any non-empty text (LaTeX such as ``\\(\\frac{333}{1997}\\)``) or a number.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

from relax_gym_core.plugin import RowError

ANSWER_MARK = "####"
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_CLOCK = re.compile(r"\d{1,2}:\d{2}")


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _canonical(text: str) -> str:
    number = Decimal(text.replace(",", ""))
    if number == number.to_integral_value():
        return str(int(number))
    return format(number.normalize(), "f")


def _from_number(value: Any, field: str) -> str | None:
    """Canonical text of a JSON number, None if `value` is not one."""
    if isinstance(value, bool):
        raise RowError(f"{field} must be a number, not a boolean")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise RowError(f"{field} must be a finite number, got {value!r}")
        return _canonical(repr(value))
    return None


def is_number_text(text: str) -> bool:
    """A plain decimal number, optionally signed, thousands optionally separated by commas."""
    return _NUMBER.fullmatch(text.strip()) is not None


def number_answer(value: Any, field: str = "expected_answer") -> str:
    """A gsm8k answer (a number, or its text) as canonical decimal text."""
    text = _from_number(value, field)
    if text is not None:
        return text
    if not isinstance(value, str):
        raise RowError(f"{field} must be a number or its text, not {_type_name(value)}")
    stripped = value.strip()
    if _NUMBER.fullmatch(stripped):
        return _canonical(stripped)
    if _CLOCK.fullmatch(stripped):  # upstream's own hand-fixed answer "07:30"
        return stripped
    raise RowError(f"{field} must be a number (commas allowed), got {value!r:.60}")


def math_answer(value: Any, field: str = "expected_answer") -> str:
    """A math_with_judge answer: non-empty text (LaTeX allowed) or a number."""
    text = _from_number(value, field)
    if text is not None:
        return text
    if not isinstance(value, str):
        raise RowError(f"{field} must be a string (or a number), not {_type_name(value)}")
    if not value.strip():
        raise RowError(f"{field} must not be empty")
    return value


def gsm8k_final_answer(solution: Any) -> str:
    """The number on the ``#### <number>`` last line of an original GSM8K ``answer``."""
    if not isinstance(solution, str):
        raise RowError(
            f"answer must be the worked solution text ending '#### <number>', not {_type_name(solution)}"
        )
    lines = [line.strip() for line in solution.strip().splitlines()]
    last = lines[-1] if lines else ""
    if not last.startswith(ANSWER_MARK):
        raise RowError(f"answer must end with a '{ANSWER_MARK} <number>' line, got {last!r:.60}")
    return number_answer(last[len(ANSWER_MARK) :], field="answer")
