"""Against the REAL verifier: upstream's reasoning_gym resources server (reasoning-gym's own scorers),
shared by the test session (the relax_gym_verifier fixture). Its model server points at a port nobody
listens on: nothing here may call a model."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from relax_gym_core.plugin import answer, verify_body
from relax_gym_core.testing import Hooks, check_probes, converted_row
from relax_gym_core.testing.gym import Verifier

from relax_gym_reasoning_gym_cc.data import example_rows

pytestmark = [pytest.mark.e2e, pytest.mark.nemo_gym("reasoning_gym")]

ENV = "reasoning_gym"


@pytest.fixture
def verifier(relax_gym_verifier: Callable[..., Verifier]) -> Verifier:
    return relax_gym_verifier(ENV)


def output(text: str) -> list[dict[str, Any]]:
    return [dict(item) for item in answer(text)]


def test_every_probe_gets_its_reward_from_the_real_verifier(hooks: Hooks, verifier: Verifier) -> None:
    probes = list(hooks.environments.get(ENV).verifier_probes())
    assert len(probes) == 12  # 6 bundled rows (3 tasks) x own answer / wrong answer
    assert {probe.row["metadata"]["source_dataset"] for probe in probes} == {
        "basic_arithmetic",
        "leg_counting",
        "knights_knaves",
    }
    check_probes(hooks, ENV, verifier)


def test_a_row_without_source_dataset_is_a_server_error_upstream(hooks: Hooks, verifier: Verifier) -> None:
    """Why conversion refuses such a row: upstream's /verify answers 500, not a score."""
    row = example_rows()[2]
    broken = {**copy.deepcopy(row), "metadata": {"source_index": 0}}
    assert verifier.post(verify_body(broken, output(f"<answer>{row['answer']}</answer>"))).status_code == 500
    answer = verifier.post(verify_body(row, output(f"<answer>{row['answer']}</answer>")))
    assert (answer.status_code, answer.json()["reward"]) == (200, 1.0)


def test_the_last_tagged_answer_counts_and_untagged_text_is_the_whole_answer(verifier: Verifier) -> None:
    """What the prompt's <answer></answer> request is for: without tags upstream scores the whole text
    (leg_counting's scorer, reasoning-gym's default, then gives partial credit: len(answer) / len(text))."""
    row = example_rows()[2]  # leg_counting, answer "292"
    answer = row["answer"]
    assert verifier(row, output(f"First guess <answer>1</answer>, then <answer>{answer}</answer>")) == 1.0
    assert verifier(row, output(f"<answer>{answer}</answer> no, <answer>1</answer>")) == 0.0
    sentence = f"There are {answer} legs."
    assert verifier(row, output(sentence)) == pytest.approx(len(answer) / len(sentence))


def test_a_real_verify_answer_maps_to_its_reward_and_task(hooks: Hooks, verifier: Verifier) -> None:
    """The verify response claude_code_agent's /run passes on (plus its turn counts) -> the trial result."""
    row = example_rows()[4]  # knights_knaves
    for text, reward in ((f"<answer>{row['answer']}</answer>", 1.0), ("<answer>nobody</answer>", 0.0)):
        answer = verifier.post(verify_body(row, output(text)))
        assert answer.status_code == 200, answer.text
        body = {**answer.json(), "turns_used": 1, "finished_naturally": True}
        result = hooks.environments.get(ENV).map_result(body)
        assert result.reward == reward
        assert (result.metrics["task_name"], result.metrics["answer_extracted"]) == ("knights_knaves", True)


def test_a_converted_row_reaches_verify_as_upstream_needs_it(hooks: Hooks, verifier: Verifier) -> None:
    """A bare row (question, answer, metadata) through convert_row and build_run_body, then /verify."""
    from relax_gym_core.protocol import Generation  # noqa: PLC0415

    row = example_rows()[0]
    bare = {key: row[key] for key in ("question", "answer", "metadata")}
    converted = converted_row(hooks.environments.get(ENV), copy.deepcopy(bare))
    task = {"messages": converted["input"], "metadata": converted["metadata"]}
    body = hooks.environments.get(ENV).build_run_body(task, Generation(), f"{1:032x}-0")
    assert verifier(body, output(f"<answer>{row['answer']}</answer>")) == 1.0
