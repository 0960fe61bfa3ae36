"""The prompt of a reasoning-gym row that brings none (rows.py) and of every generated row (generate.py).

Standard library only: the generator imports it inside the NeMo Gym environment, which has the
reasoning-gym library but not relax-gym's own dependencies.
"""

from __future__ import annotations

# reasoning_gym.utils.SYSTEM_PROMPTS["default"] of the pinned reasoning-gym (a test checks that they
# agree): it asks for the final answer inside <answer></answer>, which upstream's verifier extracts first.
ANSWER_FORMAT = (
    "Given a problem, your task is to answer the question by thinking step-by-step in a clear and specific "
    "manner.\nOnce you have thought about the reasoning process, provide the answer in the following "
    "format:\n<answer>answer here</answer>\nDo not explain your reasoning inside the answer tags, provide "
    "only the final answer. When an example is provided, you should strictly follow the format of the "
    "output/answer in that example.\n"
)


def prompt(question: str) -> str:
    """reasoning-gym's answer-format instructions, then the question."""
    return f"{ANSWER_FORMAT}\n{question}"
