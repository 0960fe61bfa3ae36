"""The conformance kit passes a good plugin and fails each known-bad variant with a message naming the
rule; its strategies produce valid wire values; its pytest plugin gives plugin authors a fresh manager."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from relax_gym_core.errors import PluginError
from relax_gym_core.plugin import (
    CleanupContract,
    EnvironmentDefinition,
    EnvironmentFailure,
    NemoGymServer,
    RowError,
    VerifierProbe,
    hookimpl,
)
from relax_gym_core.plugin.host import Hooks, make_plugin_manager
from relax_gym_core.plugin.reference import convert_row as reference_convert
from relax_gym_core.plugin.runs import RunResult
from relax_gym_core.protocol import CreateTrialRequest, Generation, TrialSnapshot, structure, unstructure
from relax_gym_core.protocol.jsonutil import is_finite_json
from relax_gym_core.testing import (
    ConformanceError,
    check_conversion,
    check_probes,
    check_registration,
    check_result_mapping,
    corrupted_rows,
    create_requests,
    json_values,
    snapshots,
)

ENV = "math_env"
AGENT = NemoGymServer(
    name="simple_agent",
    kind="responses_api_agents",
    implementation="simple_agent",
    server_class="responses_api_agents.simple_agent.app:SimpleAgent",
)
RESOURCE = NemoGymServer(
    name="math",
    kind="resources_servers",
    implementation="math_with_judge",
    server_class="resources_servers.math_with_judge.app:MathResourcesServer",
    config={"judge": None},
)
CONTRACT = CleanupContract(
    server="math", abort_path="/cleanup/{rollout_id}", probe_path="/cleanup/{rollout_id}"
)
GSM8K: dict[str, Any] = {
    "responses_create_params": {"input": [{"role": "user", "content": "What is 3 + 5?"}]},
    "expected_answer": 8,
    "reference_solution": "8",
}
TOOLS_ROW: dict[str, Any] = {
    "responses_create_params": {
        "input": [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "Mail Bob"}],
        "tools": [{"type": "function", "name": "send_email"}],
        "parallel_tool_calls": False,
        "instructions": "Use tools.",
        "temperature": 0.7,
    },
    "ground_truth": [{"name": "send_email", "arguments": "{}"}],
    "category": "email",
}
R2E: dict[str, Any] = {
    "responses_create_params": {"input": [], "model": "model", "top_p": 0.8},
    "instance_id": "repo__1",
    "problem_statement": "Fix the crash.",
}
ROWS: list[dict[str, Any]] = [GSM8K, TOOLS_ROW, R2E]
INFRA_FAILURE = {"response": {"output": []}, "verifier_error": "judge unreachable"}


def boxed(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": f"\\boxed{{{text}}}"}],
    }


PROBES = [
    VerifierProbe(name="right", row=GSM8K, output=(boxed("8"),), expected_reward=1.0),
    VerifierProbe(name="wrong", row=GSM8K, output=(boxed("9"),), expected_reward=0.0),
]


def math_verifier(row: dict[str, Any], output: list[dict[str, Any]]) -> float:
    """Stands in for the real resources server: 1.0 when the last boxed answer is the expected one."""
    text = " ".join(part["text"] for item in output for part in item.get("content", []))
    answers = re.findall(r"\\boxed\{([^}]*)\}", text)
    return 1.0 if answers and answers[-1] == str(row.get("expected_answer")) else 0.0


class MathEnvironment(EnvironmentDefinition):
    """Converts and builds bodies with the reference; a /run answer naming a verifier error is an
    infrastructure failure. Subclasses below break one rule each."""

    def map_result(self, body: dict[str, Any]) -> RunResult:
        if "verifier_error" in body:
            raise EnvironmentFailure(body["verifier_error"], kind="verifier_error")
        return super().map_result(body)

    def verifier_probes(self) -> Sequence[VerifierProbe]:
        return PROBES


def environment(cls: type[EnvironmentDefinition] = MathEnvironment, **changes: Any) -> EnvironmentDefinition:
    """The math environment as `cls` (its behaviour), with `changes` to its data."""
    fields: dict[str, Any] = {
        "name": ENV,
        "configs": ("default",),
        "agent": "simple_agent",
        "servers": (AGENT, RESOURCE),
        "readiness": ("math",),
        "cleanup": CONTRACT,
    }
    return cls(**{**fields, **changes})


DEFINITION = environment()


class Registers:
    """A plugin registering the given environment objects."""

    def __init__(self, *definitions: EnvironmentDefinition) -> None:
        self.definitions = definitions

    @hookimpl
    def register_environments(self, registrar: Any) -> None:
        for definition in self.definitions:
            registrar.add(definition)


def hooks_for(*definitions: EnvironmentDefinition) -> Hooks:
    """A fresh manager whose one plugin, 'math', registers `definitions` (default: the good one)."""
    plugin = Registers(*(definitions or (DEFINITION,)))
    return make_plugin_manager(load_entry_points=False, plugins=[("math", plugin)])


def kit_failure(check: Callable[[], object]) -> str:
    with pytest.raises(ConformanceError) as caught:
        check()
    return str(caught.value)


def test_a_good_plugin_passes_every_check() -> None:
    hooks = hooks_for()
    assert check_registration(hooks, ENV, installed=False) is DEFINITION
    converted = check_conversion(hooks, ENV, ROWS)
    assert converted == [reference_convert(copy.deepcopy(row)) for row in ROWS]
    check_result_mapping(hooks, ENV, failure_bodies=[INFRA_FAILURE])
    check_probes(hooks, ENV, math_verifier)


def test_registration_requires_an_installed_distribution_by_default() -> None:
    message = kit_failure(lambda: check_registration(hooks_for(), ENV))
    assert "plugin 'math' is not an installed distribution with a version" in message


def test_installed_plugin_passes_registration(
    install_dist: Callable[..., Any], isolated_env: list[str], good_plugin: Callable[..., str]
) -> None:
    install_dist(
        distribution="relax-gym-fake",
        entry_points={"fake": "{pkg}.plugin"},
        modules={"plugin": good_plugin("e")},
    )
    assert check_registration(make_plugin_manager(blocked=isolated_env), "e").name == "e"


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"configs": ("default", "default")}, "configs repeat a name"),
        ({"configs": ("default", " ")}, "configs must be non-empty strings"),
        (
            {"servers": (AGENT, attrs.evolve(RESOURCE, server_class="resources_servers.math.app.Math"))},
            "server_class 'resources_servers.math.app.Math' is not 'module:Class'",
        ),
        (
            {"servers": (AGENT, attrs.evolve(RESOURCE, kind="resource_servers"))},  # type: ignore[arg-type]
            "kind 'resource_servers' is not one of",
        ),
        (
            {"servers": (attrs.evolve(AGENT, kind="resources_servers"), RESOURCE)},
            "agent 'simple_agent' must be a responses_api_agents server",
        ),
        ({"servers": (AGENT, RESOURCE, RESOURCE)}, "server names repeat"),
        (
            {"servers": (AGENT, attrs.evolve(RESOURCE, config={"x": float("nan")}))},
            "config must be a JSON object",
        ),
        ({"max_concurrency": 0}, "max_concurrency must be at least 1"),
        ({"max_deadline_s": float("inf")}, "max_deadline_s must be a positive number"),
    ],
)
def test_bad_definitions_are_named(change: dict[str, Any], needle: str) -> None:
    hooks = hooks_for(attrs.evolve(DEFINITION, **change))
    assert needle in kit_failure(lambda: check_registration(hooks, ENV, installed=False))


@pytest.mark.parametrize(
    ("contract", "needle"),
    [
        (CleanupContract(server="math"), "needs a probe_path"),
        (
            CleanupContract(server="math", probe_path="/cleanup"),
            "probe_path '/cleanup' must be an absolute path",
        ),
        (
            CleanupContract(server="math", probe_path="/c/{rollout_id}", force_path="f/{rollout_id}"),
            "force_path",
        ),
        (
            CleanupContract(server="ghost", probe_path="/c/{rollout_id}"),
            "server 'ghost' is not one of its servers",
        ),
        (CleanupContract(stateless=True, probe_path="/c/{rollout_id}"), "stateless but also names"),
    ],
)
def test_bad_cleanup_contracts_are_named(contract: CleanupContract, needle: str) -> None:
    hooks = hooks_for(environment(cleanup=contract))
    assert needle in kit_failure(lambda: check_registration(hooks, ENV, installed=False))


def test_an_environment_without_a_cleanup_contract_is_refused_at_registration() -> None:
    # Replaces "a missing cleanup_contract hook answer is a ConfigError": the contract is a required
    # field of the environment object, and the registry refuses anything else there by name.
    with pytest.raises(TypeError, match="cleanup"):
        EnvironmentDefinition(  # type: ignore[call-arg]
            name=ENV, configs=("default",), agent="simple_agent", servers=(AGENT,)
        )
    with pytest.raises(PluginError, match="plugin 'math': environment 'math_env' has no CleanupContract"):
        check_registration(hooks_for(environment(cleanup=None)), ENV, installed=False)


class ScoresAnything(MathEnvironment):
    """Maps an answer by a field only its own verifier writes (what a plugin answering for every
    environment used to impose on all of them)."""

    def map_result(self, body: dict[str, Any]) -> RunResult:
        return RunResult(reward=body["score"])


def test_an_environment_is_checked_as_its_own_object() -> None:
    # Replaces "a plugin answering for other environments is caught": behaviour is an environment's
    # methods, so one environment's broken mapping is found on it and cannot reach another's.
    hooks = hooks_for(DEFINITION, environment(ScoresAnything, name="scores"))
    check_result_mapping(hooks, ENV, failure_bodies=[INFRA_FAILURE])
    message = kit_failure(lambda: check_result_mapping(hooks, "scores"))
    assert "environment 'scores': result mapping contract broken" in message
    assert "a normal body with reward 1.0 raised KeyError: 'score'; map it to its reward" in message


# ---- conversion ------------------------------------------------------------------------------------------


class Crashing(MathEnvironment):
    def convert_row(self, row: dict[str, Any]) -> dict[str, Any]:
        assert isinstance(
            row["responses_create_params"]["input"], list
        )  # KeyError/TypeError/... on broken rows
        return super().convert_row(row)


class LosesField(MathEnvironment):
    def convert_row(self, row: dict[str, Any]) -> dict[str, Any]:
        converted = super().convert_row(row)
        converted["metadata"].pop("ground_truth", None)
        return converted


class LosesTools(MathEnvironment):
    def convert_row(self, row: dict[str, Any]) -> dict[str, Any]:
        converted = super().convert_row(row)
        converted["metadata"].pop("tools", None)
        return converted


class Mutates(MathEnvironment):
    def convert_row(self, row: dict[str, Any]) -> dict[str, Any]:
        row.pop("reference_solution", None)
        return super().convert_row(row)


class ExtraKey(MathEnvironment):
    def convert_row(self, row: dict[str, Any]) -> dict[str, Any]:
        return {**super().convert_row(row), "label": 1}


class Refuses(MathEnvironment):
    def convert_row(self, row: dict[str, Any]) -> dict[str, Any]:
        if "category" in row:
            raise RowError("category is not supported")
        return super().convert_row(row)


class NoRolloutIndices(MathEnvironment):
    def build_run_body(self, task: dict[str, Any], generation: Generation, rollout_id: str) -> dict[str, Any]:
        del generation, rollout_id
        metadata = copy.deepcopy(task["metadata"])
        params = {"input": task["messages"], **metadata.pop("responses_create_params", {})}
        for key in ("tools", "parallel_tool_calls"):
            if key in metadata:
                params[key] = metadata.pop(key)
        if metadata.get("developer_message"):
            params["instructions"] = metadata.pop("developer_message")
        return {"responses_create_params": params, **metadata}


class MutatesTask(MathEnvironment):
    def build_run_body(self, task: dict[str, Any], generation: Generation, rollout_id: str) -> dict[str, Any]:
        body = super().build_run_body(task, generation, rollout_id)
        task["metadata"].clear()
        return body


def _name(value: object) -> str | None:
    return value.__name__ if isinstance(value, type) else None


@pytest.mark.parametrize(
    ("cls", "rows", "needles"),
    [
        (Crashing, [TOOLS_ROW, R2E], ["convert_row raised", "for a broken row; raise RowError"]),
        (LosesField, ROWS, ["rows[1]: top-level field 'ground_truth' did not come back"]),
        (LosesTools, ROWS, ["rows[1]: responses_create_params.tools did not reach the /run body"]),
        (Mutates, ROWS, ["rows[0]: convert_row mutated the raw row"]),
        (
            ExtraKey,
            ROWS,
            [
                "convert_row of environment 'math_env': must return exactly "
                "{'input': [...], 'metadata': {...}}, got ['input', 'label'"
            ],
        ),
        (Refuses, ROWS, ["rows[1]: a good row was refused: category is not supported"]),
        (NoRolloutIndices, ROWS, ["_ng_task_index/_ng_rollout_index are (None, None)"]),
        (MutatesTask, ROWS, ["rows[0]: build_run_body mutated the task it was given"]),
    ],
    ids=_name,
)
def test_conversion_contract_failures_are_named(
    cls: type[EnvironmentDefinition], rows: list[Any], needles: list[str]
) -> None:
    hooks = hooks_for(environment(cls))
    message = kit_failure(lambda: check_conversion(hooks, ENV, rows, max_examples=100))
    for needle in needles:
        assert needle in message


def test_normalised_keys_only_need_to_be_present() -> None:
    class Renumbers(MathEnvironment):
        def convert_row(self, row: dict[str, Any]) -> dict[str, Any]:
            converted = super().convert_row(row)
            if isinstance(row.get("category"), str):
                converted["metadata"]["category"] = row["category"].upper()
            return converted

    hooks = hooks_for(environment(Renumbers))
    assert "top-level field 'category' came back as 'EMAIL'" in kit_failure(
        lambda: check_conversion(hooks, ENV, ROWS)
    )
    check_conversion(hooks, ENV, [TOOLS_ROW], normalised={"category"})


def test_conversion_needs_rows() -> None:
    with pytest.raises(ValueError, match="at least one real row"):
        check_conversion(hooks_for(), ENV, [])


# ---- result mapping --------------------------------------------------------------------------------------


class ZeroForMissing(MathEnvironment):
    def map_result(self, body: dict[str, Any]) -> RunResult:
        return RunResult(reward=body.get("reward") or 0.0)


class Halves(MathEnvironment):
    def map_result(self, body: dict[str, Any]) -> RunResult:
        return RunResult(reward=None if body.get("reward") is None else 0.5)


class NeedsResponse(MathEnvironment):
    def map_result(self, body: dict[str, Any]) -> RunResult:
        return RunResult(reward=body.get("reward"), metrics={"items": len(body["response"]["output"])})


class ReturnsDict(MathEnvironment):
    def map_result(self, body: dict[str, Any]) -> Any:
        return {"reward": body.get("reward")}


@pytest.mark.parametrize(
    ("cls", "needle"),
    [
        (ZeroForMissing, "a body without a reward mapped to reward 0.0: a missing reward must stay None"),
        (Halves, "a normal body with reward 1.0 mapped to reward 0.5"),
        (NeedsResponse, "a body that is empty raised KeyError"),
        (ScoresAnything, "a normal body with reward 0.0 raised KeyError: 'score'; map it to its reward"),
        (ScoresAnything, "failure_bodies[0] raised KeyError: 'score'; raise EnvironmentFailure with a kind"),
        (ReturnsDict, "map_result must return a RunResult, got dict"),
        (
            MathEnvironment,
            "failure_bodies[1] mapped to a result with reward None instead of raising EnvironmentFailure",
        ),
    ],
    ids=_name,
)
def test_result_mapping_failures_are_named(cls: type[EnvironmentDefinition], needle: str) -> None:
    failures = [INFRA_FAILURE, {"response": {"output": []}, "sandbox": "lost"}]
    hooks = hooks_for(environment(cls))
    assert needle in kit_failure(lambda: check_result_mapping(hooks, ENV, failure_bodies=failures))


def test_missing_reward_may_be_an_environment_failure_instead_of_none() -> None:
    class Strict(MathEnvironment):
        def map_result(self, body: dict[str, Any]) -> RunResult:
            if body.get("reward") is None:
                raise EnvironmentFailure("no reward", kind="verifier_error")
            return RunResult(reward=body["reward"])

    hooks = hooks_for(environment(Strict))
    body = {"response": {"output": [boxed("8")]}, "reward": 0.3}
    check_result_mapping(hooks, ENV, body=body, reported_failures=False)
    # Its own mapping scores what NeMo Gym says it could not score: the kit names each such answer.
    message = kit_failure(lambda: check_result_mapping(hooks, ENV, body=body))
    assert (
        "a body with a failed judge, reward 0.0 mapped to reward 0.0: the environment says it could not"
        in message
    )
    assert "a body with instance_config.mask_sample, reward 1.0 mapped to reward 1.0" in message


def test_the_reference_mapping_ends_what_nemo_gym_reports_by_its_kind() -> None:
    check_result_mapping(hooks_for(), ENV, body={"response": {"output": [boxed("8")]}, "reward": 0.3})


# ---- probes ----------------------------------------------------------------------------------------------


def probing(probes: Sequence[VerifierProbe]) -> EnvironmentDefinition:
    """The math environment declaring `probes`."""

    class Probing(MathEnvironment):
        def verifier_probes(self) -> Sequence[VerifierProbe]:
            return list(probes)

    return environment(Probing)


def test_probe_with_the_wrong_reward_is_named() -> None:
    message = kit_failure(lambda: check_probes(hooks_for(), ENV, lambda row, output: 1.0))
    assert "probe 'wrong': the verifier gave reward 1.0, expected 0.0" in message
    assert "probe 'right'" not in message


@pytest.mark.parametrize(
    ("probes", "verify", "needle"),
    [
        ([], math_verifier, "declares no verifier probes"),
        (PROBES[:1], math_verifier, "all probes expect the same reward"),
        ([PROBES[0], attrs.evolve(PROBES[1], name="right")], math_verifier, "probe names repeat"),
        (
            PROBES,
            lambda row, output: math_verifier(row, output) == 1.0,
            "verify returned True, not a finite number",
        ),
        (
            [*PROBES, attrs.evolve(PROBES[0], name="odd", row={"q": 1})],
            math_verifier,
            "probe 'odd': its row does not convert",
        ),
    ],
)
def test_probe_rules(probes: list[VerifierProbe], verify: Any, needle: str) -> None:
    hooks = hooks_for(probing(probes))
    assert needle in kit_failure(lambda: check_probes(hooks, ENV, verify))


def test_single_probe_is_allowed_without_contrast() -> None:
    check_probes(hooks_for(probing(PROBES[:1])), ENV, math_verifier, require_contrast=False)


# ---- strategies ------------------------------------------------------------------------------------------


@given(create_requests(environment=ENV, config="default"))
def test_create_requests_are_valid_and_aimed(request: CreateTrialRequest) -> None:
    assert (request.environment.name, request.environment.config) == (ENV, "default")
    assert structure(unstructure(request), CreateTrialRequest) == request


@given(snapshots())
def test_snapshots_are_valid(snapshot: TrialSnapshot) -> None:
    assert structure(unstructure(snapshot), TrialSnapshot, name="snapshot") == snapshot


@given(json_values())
def test_json_values_are_finite_json(value: Any) -> None:
    assert is_finite_json(value)
    assert json.loads(json.dumps(value, allow_nan=False)) == value


@given(st.data())
def test_corrupted_rows_never_touch_the_good_rows(data: st.DataObject) -> None:
    rows = copy.deepcopy(ROWS)
    broken = data.draw(corrupted_rows(rows))
    assert isinstance(broken, dict)
    assert rows == ROWS


def test_corrupted_rows_needs_rows() -> None:
    with pytest.raises(ValueError, match="at least one good row"):
        corrupted_rows([])


# ---- pytest plugin ---------------------------------------------------------------------------------------


def test_pytest_plugin_gives_each_test_a_fresh_manager_with_installed_plugins(
    install_dist: Callable[..., Any],
    good_plugin: Callable[[str], str],
    tmp_path: Path,
    isolated_env: list[str],
) -> None:
    dist = install_dist(
        distribution="relax-gym-fake",
        entry_points={"fake": "{pkg}.plugin"},
        modules={"plugin": good_plugin("fake_env")},
    )
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_contract.py").write_text(
        textwrap.dedent(
            """
            from relax_gym_core.testing import check_registration

            seen = []


            def test_registration(relax_gym_hooks):
                assert check_registration(relax_gym_hooks, "fake_env").agent == "simple_agent"
                seen.append(relax_gym_hooks)


            def test_fresh_manager(relax_gym_hooks):
                assert [plugin.name for plugin in relax_gym_hooks.plugins] == ["fake"]
                assert all(hooks is not relax_gym_hooks for hooks in seen)
            """
        )
    )
    (suite / "pytest.ini").write_text("[pytest]\n")
    env = {"PYTHONPATH": str(dist.site), "PATH": "/usr/bin:/bin"}
    if isolated_env:
        env["RELAX_GYM_DISABLE_PLUGINS"] = ",".join(isolated_env)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            # No `-p relax_gym_core.testing.pytest_plugin`: the pytest11 entry point must load it.
            "-p",
            "no:cacheprovider",
        ],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout


def test_failure_bodies_must_raise_the_kind_asked_for() -> None:
    hooks = hooks_for()  # the good plugin's failure is kind verifier_error
    check_result_mapping(hooks, ENV, failure_bodies=[INFRA_FAILURE], failure_kind="verifier_error")
    message = kit_failure(
        lambda: check_result_mapping(hooks, ENV, failure_bodies=[INFRA_FAILURE], failure_kind="sandbox_lost")
    )
    assert "failure_bodies[0] raised EnvironmentFailure('verifier_error'), not kind 'sandbox_lost'" in message
