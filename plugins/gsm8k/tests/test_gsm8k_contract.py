"""Registration, conversion and result mapping of gsm8k and math_with_judge, through the conformance kit
and on real rows (their verifier probes are checked against the real server in test_gsm8k_verifier.py)."""

from __future__ import annotations

import copy
import json
import subprocess
from typing import Any

import pytest
from relax_gym_core.gym.installed import installed_file
from relax_gym_core.gym.processes import gym_python
from relax_gym_core.plugin import STATELESS, RowError, message
from relax_gym_core.protocol import Generation, InterruptPolicy
from relax_gym_core.testing import (
    Hooks,
    check_conversion,
    check_registration,
    check_result_mapping,
    converted_row,
    make_plugin_manager,
    unscored_answers,
)

from relax_gym_gsm8k.rows import PROMPT_TEMPLATE, prompt

ROLLOUT = f"{7:032x}-0"
ENVIRONMENTS = {
    "gsm8k": ("gsm8k-v1", "gsm8k_math_with_judge_simple_agent", "gsm8k_math_with_judge_resources_server"),
    "math_with_judge": ("math-with-judge-v1", "math_with_judge_simple_agent", "math_with_judge"),
}


# ---- registration ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("environment", sorted(ENVIRONMENTS))
def test_the_installed_plugin_registers_the_recipe_names(no_judge: None, environment: str) -> None:
    hooks = make_plugin_manager()  # through the entry point, as relax-gym finds it
    definition = check_registration(hooks, environment)
    owner = hooks.owner(environment)
    assert owner is not None and owner.distribution == "relax-gym-gsm8k"
    config, agent, resources = ENVIRONMENTS[environment]
    assert (definition.configs, definition.agent) == ((config,), agent)
    servers = {server.name: server for server in definition.servers}
    assert set(servers) == {agent, resources}
    verifier = servers[resources]
    # upstream's LibraryJudgeMathResourcesServer, subclassed: an undecided check is an error, not a 0.0
    assert verifier.server_class == "relax_gym_gsm8k.verifier:DecidedMathResourcesServer"
    assert verifier.config["should_use_judge"] is False  # off by default, as upstream
    assert servers[agent].config == {
        "max_steps": 1,
        "resources_server": {"type": "resources_servers", "name": resources},
        "model_server": {"type": "responses_api_models", "name": "policy_model"},
    }
    assert definition.interrupt_policy is InterruptPolicy.PROTECTED
    assert hooks.environments.get(environment).cleanup is STATELESS


def test_recipe_limits(hooks: Hooks) -> None:
    gsm8k, math = hooks.environments.get("gsm8k"), hooks.environments.get("math_with_judge")
    assert (gsm8k.max_concurrency, gsm8k.queue_capacity, gsm8k.max_deadline_s) == (8, 32, 1800)
    assert (math.max_concurrency, math.queue_capacity, math.max_deadline_s) == (256, 1024, 1800)


# ---- conversion ------------------------------------------------------------------------------------------


def test_gsm8k_rows_of_every_shape_pass_the_conversion_contract(
    hooks: Hooks, gsm8k_rows: dict[str, list[dict[str, Any]]]
) -> None:
    for shape, rows in gsm8k_rows.items():
        converted = check_conversion(hooks, "gsm8k", rows, max_examples=30)
        for row, relax_row in zip(rows, converted, strict=True):
            assert relax_row["metadata"]["expected_answer"] in ("32", "-3"), shape
            assert relax_row["metadata"]["question"] == row["question"]


def test_math_rows_pass_the_conversion_contract(hooks: Hooks, math_rows: list[dict[str, Any]]) -> None:
    unprompted = [
        {"question": row["question"], "expected_answer": row["expected_answer"]} for row in math_rows
    ]
    converted = check_conversion(hooks, "math_with_judge", [*math_rows, *unprompted], max_examples=30)
    for row, relax_row in zip(math_rows, converted[: len(math_rows)], strict=True):
        assert relax_row["input"] == row["responses_create_params"]["input"]
        assert relax_row["metadata"] == {
            "question": row["question"],
            "expected_answer": row["expected_answer"],
        }


def test_every_shape_of_one_gsm8k_row_gives_the_same_prompt_as_upstream_wrote(
    hooks: Hooks, gsm8k_rows: dict[str, list[dict[str, Any]]]
) -> None:
    """Upstream's example rows were written with its generic math prompt: ours must match it exactly."""
    upstream_input = gsm8k_rows["prompted"][0]["responses_create_params"]["input"]
    for shape in ("benchmark", "original"):
        row = gsm8k_rows[shape][0]
        converted = converted_row(hooks.environments.get("gsm8k"), copy.deepcopy(row))
        assert converted["input"] == upstream_input, shape
        assert converted["input"] == [{"role": "user", "content": prompt(row["question"])}]


def test_the_prompt_is_the_installed_generic_math_prompt() -> None:
    """benchmarks/prompts/generic/math.yaml of the installed nemo-gym (read there, with its YAML parser)."""
    path = installed_file("benchmarks", "prompts/generic/math.yaml")
    script = "import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))['user']))"
    done = subprocess.run(
        [gym_python(), "-c", script, str(path)], capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(done.stdout) == PROMPT_TEMPLATE


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("expected_answer", 18, "18"),
        ("expected_answer", 18.0, "18"),  # prepare.py's float before its int cast
        ("expected_answer", 2.5, "2.5"),
        ("expected_answer", -3, "-3"),
        ("expected_answer", "1,000", "1000"),
        ("expected_answer", " 42 ", "42"),
        ("expected_answer", "07:30", "07:30"),  # the time prepare.py hand-fixes for one question
        ("answer", "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 eggs.\n#### 18", "18"),
        ("answer", "So 5,600 in all.\n#### 5,600", "5600"),
        ("answer", "Half of it.\n####0.5\n", "0.5"),
    ],
)
def test_gsm8k_answers_become_canonical_strings(hooks: Hooks, field: str, value: Any, expected: str) -> None:
    converted = converted_row(hooks.environments.get("gsm8k"), {"question": "How many?", field: value})
    assert converted["metadata"]["expected_answer"] == expected
    if field == "answer":
        assert converted["metadata"]["answer"] == value  # the worked solution stays as it was


def test_an_expected_answer_wins_over_an_answer(hooks: Hooks) -> None:
    row = {"question": "q", "expected_answer": 7, "answer": "…\n#### 8"}
    assert converted_row(hooks.environments.get("gsm8k"), row)["metadata"]["expected_answer"] == "7"


def test_math_answers_may_be_latex_or_numbers(hooks: Hooks) -> None:
    for value, expected in ((r"\(\frac{1}{2}\)", r"\(\frac{1}{2}\)"), (0.5, "0.5"), (12, "12")):
        converted = converted_row(
            hooks.environments.get("math_with_judge"), {"question": "q", "expected_answer": value}
        )
        assert converted["metadata"]["expected_answer"] == expected


BAD_GSM8K: dict[str, tuple[dict[str, Any], str]] = {
    "neither answer field": ({"question": "q"}, "expected_answer is missing"),
    "no question": ({"expected_answer": 3}, "question is missing"),
    "question not text": ({"question": 3, "expected_answer": 3}, "question must be"),
    "blank question": ({"question": "  ", "expected_answer": 3}, "question must be"),
    "answer in words": ({"question": "q", "expected_answer": "eighteen"}, "expected_answer must be a number"),
    "answer a boolean": ({"question": "q", "expected_answer": True}, "expected_answer must be a number"),
    "answer null": ({"question": "q", "expected_answer": None}, "expected_answer must be a number"),
    "answer a list": ({"question": "q", "expected_answer": [18]}, "expected_answer must be a number"),
    "answer infinite": (
        {"question": "q", "expected_answer": float("inf")},
        "expected_answer must be a finite",
    ),
    "solution without mark": ({"question": "q", "answer": "It is 18."}, "answer must end with a '####"),
    "mark not last": ({"question": "q", "answer": "#### 18\nmore"}, "answer must end with a '####"),
    "mark with words": ({"question": "q", "answer": "…\n#### eighteen"}, "answer must be a number"),
    "solution not text": ({"question": "q", "answer": 18}, "answer must be the worked solution"),
    "params not an object": (
        {"question": "q", "expected_answer": 1, "responses_create_params": []},
        "responses_create_params must be an object",
    ),
    "empty prompt": (
        {"question": "q", "expected_answer": 1, "responses_create_params": {"input": []}},
        "responses_create_params.input must be a non-empty",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_GSM8K))
def test_bad_gsm8k_rows_raise_row_error_naming_the_field(hooks: Hooks, case: str) -> None:
    row, message = BAD_GSM8K[case]
    with pytest.raises(RowError) as caught:
        converted_row(hooks.environments.get("gsm8k"), copy.deepcopy(row))
    assert str(caught.value).startswith(message), str(caught.value)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"question": "q"}, "expected_answer is missing"),
        ({"question": "q", "answer": "…\n#### 3"}, "expected_answer is missing"),  # GSM8K's shape is gsm8k's
        ({"question": "q", "expected_answer": ""}, "expected_answer must not be empty"),
        ({"question": "q", "expected_answer": {"value": 1}}, "expected_answer must be a string"),
    ],
)
def test_bad_math_rows_raise_row_error_naming_the_field(
    hooks: Hooks, row: dict[str, Any], message: str
) -> None:
    with pytest.raises(RowError, match=f"^{message}"):
        converted_row(hooks.environments.get("math_with_judge"), row)


# ---- /run bodies -----------------------------------------------------------------------------------------


def test_a_numeric_answer_from_an_older_converter_reaches_verify_as_a_string(hooks: Hooks) -> None:
    task = {
        "messages": [{"role": "user", "content": prompt("What is 6 * 7?")}],
        "metadata": {"question": "What is 6 * 7?", "expected_answer": 42},
    }
    body = hooks.environments.get("gsm8k").build_run_body(copy.deepcopy(task), Generation(), ROLLOUT)
    assert body["expected_answer"] == "42"
    assert body["question"] == "What is 6 * 7?"
    assert body["responses_create_params"]["input"] == task["messages"]
    assert (body["_ng_task_index"], body["_ng_rollout_index"]) == (f"{7:032x}", "0")


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({"expected_answer": "42"}, "question is missing"),
        ({"question": "q"}, "expected_answer is missing"),
        ({"question": "q", "expected_answer": "forty-two"}, "expected_answer must be a number"),
    ],
)
def test_a_task_the_verifier_cannot_score_is_refused_before_the_run(
    hooks: Hooks, metadata: dict[str, Any], message: str
) -> None:
    task = {"messages": [{"role": "user", "content": "q"}], "metadata": metadata}
    with pytest.raises(RowError, match=f"^{message}"):
        hooks.environments.get("gsm8k").build_run_body(task, Generation(), ROLLOUT)


def test_a_task_without_a_prompt_is_refused(hooks: Hooks) -> None:
    task = {"messages": [], "metadata": {"question": "q", "expected_answer": "1"}}
    with pytest.raises(RowError, match=r"^responses_create_params\.input must be a non-empty"):
        hooks.environments.get("math_with_judge").build_run_body(task, Generation(), ROLLOUT)


# ---- results ---------------------------------------------------------------------------------------------

# The shape of a real /run answer of simple_agent over math_with_judge (a verify response).
REAL_BODY: dict[str, Any] = {
    "responses_create_params": {"input": [{"role": "user", "content": prompt("What is 6 * 7?")}]},
    "question": "What is 6 * 7?",
    "expected_answer": "42",
    "response": {
        "id": "resp_1",
        "output": [message("\\boxed{42}", "1")],
    },
    "reward": 1.0,
    "extracted_answer": "42",
    "library_reward": 1.0,
    "judge_evaluations": None,
}

FAILURES = unscored_answers(REAL_BODY)


@pytest.mark.parametrize("environment", sorted(ENVIRONMENTS))
def test_result_mapping_contract(hooks: Hooks, environment: str) -> None:
    check_result_mapping(
        hooks,
        environment,
        body=REAL_BODY,
        failure_bodies=list(FAILURES.values()),
        failure_kind="verifier_error",
    )


def test_results_carry_the_verifiers_own_figures(hooks: Hooks) -> None:
    judged = {**REAL_BODY, "reward": 1.0, "library_reward": 0.0, "judge_evaluations": [{}, {}]}
    result = hooks.environments.get("math_with_judge").map_result(judged)
    assert result.reward == 1.0
    assert (result.metrics["library_reward"], result.metrics["judge_calls"]) == (0.0, 2)
    assert result.metrics["assistant_messages"] == 1
    plain = hooks.environments.get("gsm8k").map_result(copy.deepcopy(REAL_BODY))
    assert (plain.metrics["library_reward"], plain.metrics["judge_calls"]) == (1.0, 0)
