"""relax-gym plugin for NeMo Gym's mcqa environment: multiple-choice questions, the answer letter boxed.

Upstream's resources server and simple_agent run unchanged. What this plugin adds over the reference
behaviour is what upstream's verifier would otherwise turn into a silent 0: every row, and every /run body,
is checked (its options, its expected answer among them, its grading mode), and its verifier probes (the
right letter boxed -> 1.0, another letter -> 0.0) are built from upstream's own example rows, read in place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from relax_gym_core.gym.installed import example_rows as installed_rows
from relax_gym_core.plugin import (
    STATELESS,
    EnvironmentDefinition,
    EnvironmentRegistrar,
    RowError,
    RunResult,
    VerifierProbe,
    answer,
    hookimpl,
    reference,
    resources_server,
    simple_agent,
)

GRADING_MODES = ("strict_single_letter_boxed", "lenient_boxed", "lenient_answer_colon")


def example_rows() -> list[dict[str, Any]]:
    """Upstream's 5 example questions (resources_servers/mcqa/data/example.jsonl), fresh on every call."""
    return installed_rows("resources_servers.mcqa")


def letters(row: dict[str, Any]) -> list[str]:
    """The option letters of a raw row, checked; RowError names the field."""
    options = row.get("options")
    if not isinstance(options, list) or not options:
        raise RowError("options must be a non-empty list of {letter: text} objects")
    found: list[str] = []
    for index, option in enumerate(options):
        if not isinstance(option, dict) or len(option) != 1:
            raise RowError(f"options[{index}] must be one {{letter: text}} object")
        ((letter, text),) = option.items()
        if len(letter) != 1 or not letter.isalpha() or not letter.isupper() or not isinstance(text, str):
            raise RowError(f"options[{index}] must map one capital letter to its text, got {letter!r}")
        found.append(letter)
    if len(set(found)) != len(found):
        raise RowError(f"options repeat a letter: {found}")
    expected = row.get("expected_answer")
    if expected not in found:
        raise RowError(f"expected_answer must be one of the option letters {found}, got {expected!r:.20}")
    if row.get("grading_mode", GRADING_MODES[0]) not in GRADING_MODES:
        raise RowError(f"grading_mode must be one of {list(GRADING_MODES)}")
    return found


class Mcqa(EnvironmentDefinition):
    def check_row(self, row: dict[str, Any]) -> None:
        letters(row)  # each row before the reference conversion, and each /run body

    def map_result(self, body: dict[str, Any]) -> RunResult:
        return reference.verified_result(self.name, body)  # an unscored answer is never a reward of 0

    def verifier_probes(self) -> Sequence[VerifierProbe]:
        probes = []
        for index, row in enumerate(example_rows()):
            right = row["expected_answer"]
            wrong = next(letter for letter in letters(row) if letter != right)
            for kind, letter, reward in (("right", right, 1.0), ("wrong", wrong, 0.0)):
                output = answer(f"The answer is \\boxed{{{letter}}}", f"{index}_{kind}")
                probes.append(
                    VerifierProbe(
                        name=f"example{index}:{kind}", row=row, output=output, expected_reward=reward
                    )
                )
        return probes


MCQA = Mcqa(
    name="mcqa",
    configs=("mcqa-v1",),
    agent="mcqa_simple_agent",
    servers=(
        resources_server(
            "mcqa", "mcqa", "resources_servers.mcqa.app:MCQAResourcesServer", domain="knowledge"
        ),
        # One generation per trial (no tools): a reasoning-only reply would otherwise loop to the deadline.
        simple_agent("mcqa_simple_agent", resources="mcqa", max_steps=1),
    ),
    cleanup=STATELESS,  # nothing outlives the /run call
    description="NeMo Gym mcqa: multiple-choice questions (MMLU/GPQA style), the answer letter boxed, 0/1.",
    max_concurrency=16,
    queue_capacity=64,
)


@hookimpl
def register_environments(registrar: EnvironmentRegistrar) -> None:
    registrar.add(MCQA)
