"""A failure the environment reports inside an answer that otherwise looks scored is never its reward:
NeMo Gym >= 0.5's judge failsafe (HTTP 200, reward 0.0, `_ng_failure_class`), a masked sample (top level,
0.7.0; or in `instance_config`, swe_agents), a `failure_kind` that does not say the score stands. The
reference mapping raises EnvironmentFailure of the kind that names it, with the reason; every plugin that
builds on it gets the same, and the contract kit holds every installed environment to it."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relax_gym_core.plugin import EnvironmentFailure, reference
from relax_gym_core.plugin.host import make_plugin_manager
from relax_gym_core.testing.contract import reported_answers

OUTPUT: list[Any] = [
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "4"}]}
]
SCORED: dict[str, Any] = {"response": {"id": "resp_1", "output": OUTPUT}, "reward": 1.0}
JUDGE_FAILED: dict[str, Any] = {  # as nemo_gym/judge.py's judge_failsafe answers (v0.5.0, main)
    **SCORED,
    "reward": 0.0,
    "_ng_failure_class": "judge_failed",
    "_ng_failure_judge_error": "JudgeError: HTTPStatusError: Server error '500 Internal Server Error'",
}

CASES: dict[str, tuple[dict[str, Any], str, str | None]] = {
    "judge failsafe": (JUDGE_FAILED, "judge_failed", JUDGE_FAILED["_ng_failure_judge_error"]),
    "another failure class": (
        {**SCORED, "_ng_failure_class": "tool_timeout", "_ng_failure_terminal": True},
        "tool_timeout",
        None,
    ),
    "top-level mask with kind and reason (0.7.0)": (
        {**SCORED, "mask_sample": True, "failure_kind": "agent_timeout", "failure_reason": "ran 3900 s"},
        "masked:agent_timeout",
        "ran 3900 s",
    ),
    "top-level mask without a kind": ({**SCORED, "mask_sample": True}, "masked", None),
    "mask in instance_config (swe_agents)": (
        {**SCORED, "instance_config": {"mask_sample": True}, "mask_sample": False},
        "masked",
        None,
    ),
    "a failure_kind that does not say the score stands": (
        {**SCORED, "failure_kind": "sandbox_lost", "failure_reason": "container OOM-killed"},
        "masked:sandbox_lost",
        "container OOM-killed",
    ),
    "a kind that is not a name": (
        {**SCORED, "mask_sample": True, "failure_kind": "agent timed out\n(3900 s)"},
        "masked:agent_timed_out_3900_s_",
        None,
    ),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("mapping", ["map_result", "verified_answer", "verified_result"])
def test_a_reported_failure_is_raised_by_name_with_its_reason(case: str, mapping: str) -> None:
    body, kind, reason = CASES[case]
    with pytest.raises(EnvironmentFailure) as caught:
        if mapping == "map_result":
            reference.map_result(dict(body), "judged_env")
        else:
            getattr(reference, mapping)("judged_env", dict(body))
    assert caught.value.kind == kind
    assert caught.value.reason == reason
    assert str(caught.value).startswith(f"judged_env: the environment reports {kind}: not a reward")


@pytest.mark.parametrize(
    "body",
    [
        SCORED,
        {**SCORED, "reward": 0.0},  # a valid wrong answer is a real 0
        {**SCORED, "mask_sample": False, "instance_config": {"mask_sample": False}},
        {**SCORED, "_ng_failure_class": None},
        {**SCORED, "_ng_failure_class": ""},
    ],
)
def test_a_plain_score_is_kept(body: dict[str, Any]) -> None:
    assert reference.reported_failure("env", body) is None
    assert reference.map_result(dict(body)).reward == body["reward"]


def test_a_degraded_but_valid_score_is_kept_with_its_kind_and_reason_in_the_metrics() -> None:
    """NeMo Gym 0.7.0 (#2608): failure metadata beside an explicit mask_sample false: a score that stands."""
    body = {**SCORED, "mask_sample": False, "failure_kind": "judge_retried", "failure_reason": "2nd try"}
    assert reference.reported_failure("env", body) is None
    result = reference.verified_result("env", body)
    assert result.reward == 1.0
    assert result.metrics["failure_kind"] == "judge_retried"
    assert result.metrics["failure_reason"] == "2nd try"


def test_a_reason_is_one_bounded_printable_line() -> None:
    body = {**JUDGE_FAILED, "_ng_failure_judge_error": "line one\nline two\x1b[31m " + "x" * 5000}
    failure = reference.reported_failure("env", body)
    assert failure is not None and failure.reason is not None
    assert "\n" not in failure.reason and "\x1b" not in failure.reason
    assert failure.reason.startswith("line one line two") and len(failure.reason) <= 300


@given(st.text(max_size=200))
def test_any_kind_becomes_a_bounded_name(kind: str) -> None:
    failure = reference.reported_failure("env", {**SCORED, "mask_sample": True, "failure_kind": kind})
    assert failure is not None
    assert failure.kind == "masked" if not kind.strip() else failure.kind.startswith("masked:")
    name = failure.kind.removeprefix("masked:")
    assert len(name) <= reference.MAX_KIND_CHARS and all(c.isascii() and c.isprintable() for c in name)
    assert " " not in name


def test_every_installed_environment_ends_a_reported_failure_by_name() -> None:
    """The plugins that override map_result build on the reference: none of them scores these answers."""
    hooks = make_plugin_manager()
    checked = 0
    for definition in hooks.environments:
        for label, (kind, answer) in reported_answers(SCORED).items():
            with pytest.raises(EnvironmentFailure) as caught:
                definition.map_result(answer)
            assert caught.value.kind == kind, (definition.name, label)
        checked += 1
    assert checked >= 7  # the seed plugins and echo at least
