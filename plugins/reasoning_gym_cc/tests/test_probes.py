"""The verifier probes as data (their rewards from the real verifier: test_verifier.py): built from the
bundled example rows, the right answer in the <answer> tags the prompt asks for, the wrong one well formed."""

from __future__ import annotations

import pytest
from relax_gym_core.testing import Hooks, OracleScript, converted_row

from relax_gym_reasoning_gym_cc.data import example_rows
from relax_gym_reasoning_gym_cc.probes import wrong_answer

ENV = "reasoning_gym"


def text_of(probe_output: tuple[object, ...]) -> str:
    (message,) = probe_output
    assert isinstance(message, dict)
    return str(message["content"][0]["text"])


def test_each_bundled_row_has_its_own_answer_and_a_wrong_one(hooks: Hooks) -> None:
    rows = example_rows()
    probes = list(hooks.environments.get(ENV).verifier_probes())
    assert [probe.name for probe in probes[:4]] == [
        "example0:basic_arithmetic:own_answer",
        "example0:basic_arithmetic:wrong_answer",
        "example1:basic_arithmetic:own_answer",
        "example1:basic_arithmetic:wrong_answer",
    ]
    assert [probe.expected_reward for probe in probes] == [1.0, 0.0] * len(rows)
    for index, row in enumerate(rows):
        right, wrong = probes[2 * index : 2 * index + 2]
        assert right.row == row == wrong.row
        assert text_of(right.output).endswith(f"<answer>{row['answer']}</answer>")
        assert text_of(wrong.output).endswith(f"<answer>{wrong_answer(rows, index)}</answer>")
        assert wrong_answer(rows, index) != row["answer"]
        converted_row(hooks.environments.get(ENV), dict(row))  # every probe row is a row of the environment


def test_wrong_answers_are_well_formed() -> None:
    rows = example_rows()
    assert [wrong_answer(rows, index) for index in range(4)] == ["-3", "4", "293", "147"]  # numbers + 1
    assert wrong_answer(rows, 4) == rows[5]["answer"]  # knights_knaves: the other row's (real) answer
    assert wrong_answer(rows, 5) == rows[4]["answer"]
    with pytest.raises(ValueError, match="example row 0 \\(knights_knaves\\): no other example"):
        wrong_answer([rows[4]], 0)


def test_the_oracle_knows_every_bundled_row(hooks: Hooks) -> None:
    """The probes' rows are the environment's example rows (demo, `rollout --policy oracle`)."""
    assert len(OracleScript(list(hooks.environments.get(ENV).verifier_probes()))) == len(example_rows()) == 6
