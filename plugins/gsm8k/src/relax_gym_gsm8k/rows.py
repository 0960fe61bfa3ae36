"""Math rows -> Relax rows and /run bodies, for gsm8k and math_with_judge.

A raw row either carries its prompt already (``responses_create_params.input``, as NeMo Gym's math
datasets do) or only ``question``: then the prompt is NeMo Gym's generic math prompt
(benchmarks/prompts/generic/math.yaml, the prompt_config of upstream's gsm8k benchmark), which asks for
the answer inside ``\\boxed{}`` where the verifier looks for it. ``question`` always stays: the verifier
requires it. The expected answer becomes the string upstream requires (see answers.py).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from relax_gym_core.plugin import RowError, reference
from relax_gym_core.protocol import Generation

from relax_gym_gsm8k.answers import gsm8k_final_answer, math_answer, number_answer

# NeMo Gym's generic math prompt, as a str.format template (the installed YAML's `user` field; a test
# checks that they agree).
PROMPT_TEMPLATE = (
    "Solve the following math problem. Make sure to put the answer (and only answer) inside \\boxed{{}}."
    "\n\n{question}"
)
PARAMS = "responses_create_params"
type ExpectedAnswer = Callable[[dict[str, Any]], str]  # a row's expected answer, as its environment reads it


def prompt(question: str) -> str:
    return PROMPT_TEMPLATE.format(question=question)


def _question(row: dict[str, Any]) -> str:
    if "question" not in row:
        raise RowError("question is missing (the math verifier requires it)")
    question = row["question"]
    if not isinstance(question, str) or not question.strip():
        raise RowError("question must be a non-empty string")
    return question


def gsm8k_expected(row: dict[str, Any]) -> str:
    """From ``expected_answer`` (NeMo Gym benchmark rows) or else ``answer`` (original GSM8K rows)."""
    if "expected_answer" in row:
        return number_answer(row["expected_answer"])
    if "answer" in row:
        return gsm8k_final_answer(row["answer"])
    raise RowError(
        "expected_answer is missing: a gsm8k row needs expected_answer (NeMo Gym's benchmark rows) or "
        "answer (original GSM8K rows, whose last line is '#### <number>')"
    )


def math_expected(row: dict[str, Any]) -> str:
    if "expected_answer" not in row:
        raise RowError("expected_answer is missing (the math verifier requires it)")
    return math_answer(row["expected_answer"])


def _check_input(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise RowError(f"{PARAMS}.input must be a non-empty messages array")


def convert_row(row: dict[str, Any], expected_answer: ExpectedAnswer) -> dict[str, Any]:
    """Raw math row -> ``{"input": [...], "metadata": {...}}`` with a string ``expected_answer``
    (`expected_answer` is gsm8k_expected or math_expected)."""
    question = _question(row)
    expected = expected_answer(row)
    if PARAMS in row:
        params = row[PARAMS]
        if isinstance(params, dict):
            _check_input(params.get("input"))
        converted = reference.convert_row(row)  # RowError for a malformed params object
        metadata = dict(converted["metadata"])
        messages = converted["input"]
    else:
        metadata = copy.deepcopy(row)
        messages = [{"role": "user", "content": prompt(question)}]
    metadata["expected_answer"] = expected
    return {"input": messages, "metadata": metadata}


def build_run_body(
    task: dict[str, Any], generation: Generation, rollout_id: str, expected_answer: ExpectedAnswer
) -> dict[str, Any]:
    """The reference /run body, checked like a row: a task converted elsewhere with a numeric
    expected_answer is stringified here instead of failing upstream's /verify with 422."""
    body = reference.build_run_body(task, generation, rollout_id)
    _question(body)
    params = body.get(PARAMS)
    _check_input(params.get("input") if isinstance(params, dict) else None)
    body["expected_answer"] = expected_answer(body)
    return body
