"""reference.verified_answer: a /run answer the verifier never scored is EnvironmentFailure(kind=
"verifier_error"), never a reward of 0; a scored one gives back its output list and reward untouched."""

from __future__ import annotations

import math
from typing import Any

import pytest

from relax_gym_core.plugin import EnvironmentFailure, reference

MESSAGE = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "4"}]}
OUTPUT: list[Any] = [MESSAGE]
SCORED: dict[str, Any] = {"response": {"id": "resp_1", "output": OUTPUT}, "reward": 1.0}


@pytest.mark.parametrize("reward", [1.0, 0.0, 0, 1, -0.5, 0.1])
def test_a_scored_answer_gives_its_output_and_reward(reward: float) -> None:
    output, got = reference.verified_answer("env", {**SCORED, "reward": reward})
    assert output is OUTPUT
    assert got == reward and type(got) is type(reward)  # as answered: an int reward stays an int


def test_an_empty_output_list_is_still_a_scored_answer() -> None:
    assert reference.verified_answer("env", {"response": {"output": []}, "reward": 0.0}) == ([], 0.0)


NOT_SCORED: dict[str, dict[str, Any]] = {  # no response output list
    "empty answer": {},
    "error answer": {"detail": "Hit an exception calling an inner server"},
    "no response": {"reward": 1.0},
    "response not an object": {"response": [OUTPUT], "reward": 1.0},
    "response without output": {"response": {"id": "resp_1"}, "reward": 1.0},
    "output not a list": {"response": {"output": "4"}, "reward": 1.0},
}
NO_REWARD: dict[str, dict[str, Any]] = {  # a response, but no finite numeric reward
    "no reward": {"response": {"output": OUTPUT}},
    "null reward": {**SCORED, "reward": None},
    "text reward": {**SCORED, "reward": "1.0"},
    "boolean reward": {**SCORED, "reward": True},
    "nan reward": {**SCORED, "reward": math.nan},
    "infinite reward": {**SCORED, "reward": -math.inf},
    "list reward": {**SCORED, "reward": [1.0]},
}


@pytest.mark.parametrize(
    ("case", "says"),
    [(case, "no response with an output list") for case in NOT_SCORED]
    + [(case, "no numeric reward") for case in NO_REWARD],
)
def test_an_unscored_answer_is_a_verifier_error_naming_the_environment(case: str, says: str) -> None:
    with pytest.raises(EnvironmentFailure) as caught:
        reference.verified_answer("my_env", {**NOT_SCORED, **NO_REWARD}[case])
    assert caught.value.kind == "verifier_error"
    assert str(caught.value).startswith(f"my_env /run answer has {says}")


def test_a_long_bad_reward_is_quoted_short() -> None:
    with pytest.raises(EnvironmentFailure) as caught:
        reference.verified_answer("env", {**SCORED, "reward": "x" * 1000})
    assert "(got 'xxx" in str(caught.value)
    assert len(str(caught.value)) < 200
