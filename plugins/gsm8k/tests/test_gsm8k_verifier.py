"""Against the REAL verifier: upstream's math_with_judge resources server (math-verify, judge off), shared
by the test session (the relax_gym_verifier fixture). gsm8k's resources server is the same class with the
same config under another name, so one server verifies both environments. Its model server points at a
port nobody listens on: nothing here may call a model."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from relax_gym_core.plugin import message, verify_body
from relax_gym_core.testing import Hooks, check_probes, converted_row
from relax_gym_core.testing.gym import Verifier

from relax_gym_gsm8k import plugin

pytestmark = [pytest.mark.e2e, pytest.mark.nemo_gym("gsm8k", "math_with_judge")]


@pytest.fixture
def verifier(relax_gym_verifier: Callable[..., Verifier]) -> Verifier:
    return relax_gym_verifier("math_with_judge")


def test_both_environments_verify_with_the_same_server_config() -> None:
    gsm8k, math = plugin.definitions(None)
    assert (gsm8k.servers[0].server_class, gsm8k.servers[0].config) == (
        math.servers[0].server_class,
        math.servers[0].config,
    )


@pytest.mark.parametrize(("environment", "count"), [("gsm8k", 4), ("math_with_judge", 10)])
def test_every_probe_gets_its_reward_from_the_real_verifier(
    hooks: Hooks, relax_gym_verifier: Callable[..., Verifier], environment: str, count: int
) -> None:
    probes = list(hooks.environments.get(environment).verifier_probes())
    assert len(probes) == count  # 2 (or 5) example rows x right/wrong
    check_probes(hooks, environment, relax_gym_verifier(environment))


def test_a_numeric_expected_answer_is_refused_upstream(
    verifier: Verifier, gsm8k_rows: dict[str, list[dict[str, Any]]], hooks: Hooks
) -> None:
    """Why conversion stringifies: upstream answers 422 for the int prepare.py writes."""
    benchmark = gsm8k_rows["benchmark"][0]
    output = [message("\\boxed{32}")]
    raw = {**benchmark, "responses_create_params": {"input": [{"role": "user", "content": "q"}]}}
    assert verifier.post(verify_body(raw, output)).status_code == 422
    converted = converted_row(hooks.environments.get("gsm8k"), copy.deepcopy(benchmark))
    fixed = {**raw, "expected_answer": converted["metadata"]["expected_answer"]}
    answer = verifier.post(verify_body(fixed, output))
    assert (answer.status_code, answer.json()["reward"]) == (200, 1.0)


def test_canonical_gsm8k_answers_are_scored_as_numbers(verifier: Verifier, hooks: Hooks) -> None:
    """The canonical answers ("1,000" -> "1000", 18.0 -> "18") still match the model's own spelling."""
    for raw_answer, written in (
        ("1,000", "\\boxed{1,000}"),
        (18.0, "\\boxed{18}"),
        ("07:30", "\\boxed{7:30}"),
    ):
        converted = converted_row(
            hooks.environments.get("gsm8k"), {"question": "q", "expected_answer": raw_answer}
        )
        row = {"responses_create_params": {"input": converted["input"]}, **converted["metadata"]}
        answer = verifier.post(verify_body(row, [message(written)]))
        assert answer.json()["reward"] == 1.0, (raw_answer, answer.text)
