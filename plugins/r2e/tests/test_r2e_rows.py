"""Registration, the bundled tasks, row preparation and conversion (both runtimes), result mapping, and the
production configuration with its deadline policy. No server needed."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from relax_gym_core.errors import ConfigError
from relax_gym_core.plugin import CleanupContract, EnvironmentFailure, RowError
from relax_gym_core.protocol import Generation, InterruptPolicy
from relax_gym_core.testing import (
    Hooks,
    check_conversion,
    check_registration,
    check_result_mapping,
    converted_row,
)

from relax_gym_r2e import prepare, tasks, toolspecs
from relax_gym_r2e.production import DeadlinePolicy, ProductionPlan
from relax_gym_r2e.rows import prepare_row, r2e_instance
from relax_gym_r2e.rows import r2e_rows as bundled_r2e_rows

ENV = "r2e_gym"
ROLLOUT = f"{7:032x}-0"


@pytest.fixture(scope="module")
def r2e_rows() -> list[dict[str, Any]]:
    return bundled_r2e_rows()


@pytest.fixture(scope="module")
def swe_rows(r2e_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [prepare_row(row, dataset_name="R2E-Gym/R2E-Gym-Lite", split="train") for row in r2e_rows]


# ---- registration and the bundled tasks ------------------------------------------------------------------


def test_registration_follows_the_contract(hooks: Hooks) -> None:
    definition = check_registration(hooks, ENV, installed=False)
    assert definition.configs == ("r2e-gym-v1",)
    servers = {server.name: server for server in definition.servers}
    assert servers["r2e_gym"].server_class == "relax_gym_r2e.server:R2EResourcesServer"
    agent = servers[definition.agent]
    assert agent.server_class == "responses_api_agents.simple_agent.app:SimpleAgent"
    assert agent.config["resources_server"] == {"type": "resources_servers", "name": "r2e_gym"}
    assert definition.interrupt_policy is InterruptPolicy.PROTECTED
    assert definition.max_concurrency >= 8
    assert hooks.environments.get(ENV).cleanup == CleanupContract(
        server="r2e_gym",
        abort_path="/cleanup/{rollout_id}",
        force_path="/cleanup/{rollout_id}",
        probe_path="/cleanup/{rollout_id}",
    )


def test_at_least_five_tasks_of_different_bug_kinds_each_with_a_golden_patch() -> None:
    bundled = tasks.load_tasks()
    assert len(bundled) >= 5
    assert len({task.bug_kind for task in bundled.values()}) == len(bundled)
    for built in tasks.built_tasks().values():
        assert built.golden_patch.startswith("diff --git") and built.wrong_patch.startswith("diff --git")
        assert built.golden_patch != built.wrong_patch
        assert built.instance_id == f"relaxgym__{built.task.name}-{built.fix_commit}"


def test_building_is_deterministic_and_agents_cannot_reach_the_fix(tmp_path: Path) -> None:
    task = tasks.load_tasks()["semver"]
    first = tasks.build(task, source_repo=tmp_path / "source.git")
    assert first == tasks.build(task)  # same commits and patches on every build (and every machine)
    commits = subprocess.run(
        ["git", "--git-dir", str(tmp_path / "source.git"), "rev-list", "--all"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert commits == [first.base_commit]  # what agents clone holds the base commit only


@pytest.mark.parametrize(
    ("breaks", "message"),
    [
        (lambda t: t.pop("files"), "tasks/x.toml: [files] must be a non-empty table"),
        (lambda t: t["files"].update({"../escape.py": ""}), "[files] path '../escape.py' must be a plain"),
        (lambda t: t["files"].update({"r2e_tests/t.py": ""}), "[files] must not contain r2e_tests/"),
        (lambda t: t.update(fail_to_pass=["r2e_tests/test_y.py::test_a"]), "fail_to_pass names"),
        (lambda t: t.update(fix=dict(t["files"])), "[fix] changes nothing"),
        (lambda t: t.update(name="has-dash"), "name must be lower-case letters"),
    ],
)
def test_a_broken_task_file_is_refused_naming_file_and_field(breaks: Any, message: str) -> None:
    raw: dict[str, Any] = {
        "name": "x",
        "bug_kind": "k",
        "problem_statement": "p",
        "fail_to_pass": ["r2e_tests/test_x.py::test_a"],
        "pass_to_pass": [],
        "files": {"x.py": "A = 1\n"},
        "fix": {"x.py": "A = 2\n"},
        "wrong_fix": {"x.py": "A = 3\n"},
        "hidden_tests": {"r2e_tests/test_x.py": "def test_a(): pass\n"},
    }
    tasks.parse_task("tasks/x.toml", copy.deepcopy(raw))  # the unbroken task is fine
    breaks(raw)
    with pytest.raises(tasks.TaskError, match=r"^tasks/x\.toml: ") as caught:
        tasks.parse_task("tasks/x.toml", raw)
    assert message in str(caught.value)


# ---- R2E-Gym rows -> NeMo Gym rows (production) ----------------------------------------------------------


def test_prepare_derives_instance_sif_and_base_commit(r2e_rows: list[dict[str, Any]]) -> None:
    row = r2e_rows[0]
    built = tasks.built_tasks()[row["repo_name"]]
    instance = r2e_instance(row)
    assert instance.instance_id == built.instance_id
    assert instance.base_commit == built.base_commit  # parsed_commit_content.old_commit_hash
    assert instance.sif_name == f"{row['repo_name']}_final_{built.fix_commit}.sif"
    prepared = prepare_row(row, dataset_name="R2E-Gym/R2E-Gym-Lite", split="train")
    metadata = prepared["responses_create_params"]["metadata"]
    assert prepared["responses_create_params"]["input"] == []
    assert prepared["agent_ref"] == {"type": "responses_api_agents", "name": "swe_agents"}
    assert (metadata["instance_id"], metadata["base_commit"], metadata["split"]) == (
        built.instance_id,
        built.base_commit,
        "train",
    )
    instance_dict = json.loads(metadata["instance_dict"])
    assert instance_dict["repo"] == row["repo_name"] and instance_dict["version"] == built.fix_commit
    assert instance_dict["FAIL_TO_PASS"] == row["FAIL_TO_PASS"]


def test_without_old_commit_the_base_is_the_fix_commits_parent(r2e_rows: list[dict[str, Any]]) -> None:
    row = dict(r2e_rows[0], parsed_commit_content=json.dumps({"file_diffs": []}))
    assert r2e_instance(row).base_commit == f"{row['commit_hash']}^"


def _set(key: str, value: Any) -> Any:
    return lambda row: row.__setitem__(key, value)


BAD_R2E_ROWS = {
    "no repo_name": (lambda row: row.pop("repo_name"), "repo_name must be a non-empty string"),
    "image not R2E": (_set("docker_image", "python:3.11"), "docker_image 'python:3.11' is not"),
    "image owner with _": (
        lambda row: row.update(docker_image=row["docker_image"].replace("relaxgym", "relax_gym")),
        "docker_image owner 'relax_gym' contains '_'",
    ),
    "image repo with -": (
        lambda row: row.update(docker_image=row["docker_image"].replace("_final", "-x_final")),
        "docker_image repo 'durations-x' contains '-'",
    ),
    "commit mismatch": (_set("commit_hash", "0" * 40), "docker_image commit"),
    "parsed not JSON": (_set("parsed_commit_content", "{"), "parsed_commit_content is not JSON"),
    "parsed not object": (_set("parsed_commit_content", "[]"), "parsed_commit_content must be a JSON object"),
    "old commit not hex": (
        _set("parsed_commit_content", json.dumps({"old_commit_hash": "HEAD~1"})),
        "parsed_commit_content.old_commit_hash 'HEAD~1' is not a hex commit",
    ),
    "problem missing": (_set("problem_statement", " "), "problem_statement must be a non-empty string"),
}


@pytest.mark.parametrize("case", sorted(BAD_R2E_ROWS))
def test_inconsistent_r2e_rows_are_refused_naming_the_field(
    r2e_rows: list[dict[str, Any]], case: str
) -> None:
    breaks, message = BAD_R2E_ROWS[case]
    row = copy.deepcopy(r2e_rows[1])
    breaks(row)
    with pytest.raises(RowError) as caught:
        prepare_row(row, dataset_name="R2E-Gym/R2E-Gym-Lite", split="train")
    assert str(caught.value).startswith(message)  # the field first


# ---- NeMo Gym rows -> Relax rows -> /run bodies (both shapes) --------------------------------------------


def test_both_row_shapes_pass_the_conversion_contract(
    hooks: Hooks, rows: list[dict[str, Any]], swe_rows: list[dict[str, Any]]
) -> None:
    converted = check_conversion(hooks, ENV, [*rows, *swe_rows])
    local, swe = converted[: len(rows)], converted[len(rows) :]
    for row, relax_row in zip(rows, local, strict=True):
        assert relax_row["input"] == row["responses_create_params"]["input"]
        assert row["problem_statement"] in relax_row["input"][0]["content"]
        assert [tool["name"] for tool in relax_row["metadata"]["tools"]] == ["bash", "view", "str_replace"]
    for row, relax_row in zip(swe_rows, swe, strict=True):
        # swe_agents rows: Relax's prompt is the problem statement; the agent input stays empty.
        assert relax_row["input"] == [{"role": "user", "content": row["problem_statement"]}]
        assert relax_row["metadata"]["responses_create_params"]["input"] == []
        body = hooks.environments.get(ENV).build_run_body(
            {"messages": relax_row["input"], "metadata": relax_row["metadata"]}, Generation(), ROLLOUT
        )
        assert body["responses_create_params"]["input"] == []
        assert body["responses_create_params"]["metadata"] == row["responses_create_params"]["metadata"]


def test_the_local_prompt_explains_the_tools(rows: list[dict[str, Any]]) -> None:
    prompt = rows[0]["responses_create_params"]["input"][0]["content"]
    assert "/workspace/repo" in prompt and all(f"`{name}`" in prompt for name in toolspecs.TOOL_NAMES)


BAD_NEMO_ROWS = {
    "instance id shape": (lambda row: row.update(instance_id="astropy-1"), "instance_id 'astropy-1' is not"),
    "commit disagrees": (lambda row: row.update(commit_hash="f" * 40), "commit_hash"),
    "local base commit": (lambda row: row.update(base_commit="main"), "base_commit 'main' is not a hex"),
    "local tools missing": (
        lambda row: row["responses_create_params"].update(tools=[]),
        "responses_create_params.tools must list the r2e_gym tools",
    ),
    "local prompt missing": (
        lambda row: row["responses_create_params"].update(input=[]),
        "responses_create_params.input must be a non-empty",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_NEMO_ROWS))
def test_inconsistent_local_rows_are_refused(hooks: Hooks, rows: list[dict[str, Any]], case: str) -> None:
    breaks, message = BAD_NEMO_ROWS[case]
    row = copy.deepcopy(rows[0])
    breaks(row)
    with pytest.raises(RowError) as caught:
        converted_row(hooks.environments.get(ENV), row)
    assert str(caught.value).startswith(message)


def test_swe_agents_rows_whose_metadata_disagrees_are_refused(
    hooks: Hooks, swe_rows: list[dict[str, Any]]
) -> None:
    row = copy.deepcopy(swe_rows[0])
    row["responses_create_params"]["metadata"]["instance_id"] = "other__repo-abcdef1"
    with pytest.raises(RowError, match=r"^responses_create_params\.metadata\.instance_id .* differs"):
        converted_row(hooks.environments.get(ENV), row)
    row = copy.deepcopy(swe_rows[0])
    instance = json.loads(row["responses_create_params"]["metadata"]["instance_dict"])
    row["responses_create_params"]["metadata"]["instance_dict"] = json.dumps(
        {**instance, "base_commit": "0" * 40}
    )
    with pytest.raises(RowError, match=r"instance_dict\.base_commit"):
        converted_row(hooks.environments.get(ENV), row)


# ---- results ---------------------------------------------------------------------------------------------


def answer(**fields: Any) -> dict[str, Any]:
    return {"response": {"output": [{"type": "message", "content": []}]}, **fields}


@pytest.mark.parametrize(
    ("fields", "reward"),
    [
        ({"resolved": True, "patch_exists": True, "reward": 1.0}, 1.0),
        ({"resolved": False, "patch_exists": True, "reward": 0.1}, 0.1),  # the local server shapes
        ({"resolved": False, "patch_exists": False, "reward": 0.0}, 0.0),
        # swe_agents scores 1/0: the 0.1 shaping is applied here (Relax's R2E partial credit)
        ({"resolved": False, "patch_exists": True, "reward": 0.0, "mask_sample": False}, 0.1),
        ({"resolved": False, "patch_exists": None, "reward": 0.0, "agent_timed_out": True}, 0.0),
    ],
)
def test_the_reward_is_shaped_like_relax_does(hooks: Hooks, fields: dict[str, Any], reward: float) -> None:
    result = hooks.environments.get(ENV).map_result(answer(**fields))
    assert result.reward == reward
    assert result.metrics["resolved"] is fields["resolved"]
    assert result.metrics["upstream_reward"] == fields["reward"]
    for copied in ("mask_sample", "agent_timed_out"):
        if copied in fields:
            assert result.metrics[copied] == fields[copied]


def test_counts_and_timings_become_metrics(hooks: Hooks) -> None:
    result = hooks.environments.get(ENV).map_result(
        answer(
            reward=1.0,
            resolved=True,
            patch_exists=True,
            tests_total=5,
            fail_to_pass_passed=2,
            command_timeouts=1,
            eval_timed_out=False,
            tests_seconds=0.4,
            test_results={"a": "passed"},  # detail stays in the /run answer, not the metrics
        ),
    )
    assert {
        key: result.metrics[key] for key in ("tests_total", "fail_to_pass_passed", "command_timeouts")
    } == {
        "tests_total": 5,
        "fail_to_pass_passed": 2,
        "command_timeouts": 1,
    }
    assert result.metrics["eval_timed_out"] is False and "test_results" not in result.metrics


def test_an_unevaluated_answer_is_an_infrastructure_failure(hooks: Hooks) -> None:
    check_result_mapping(
        hooks,
        ENV,
        body=answer(resolved=False, patch_exists=False),
        failure_bodies=[{"reward": 0.0}, answer(resolved=True), answer(reward="1.0", resolved=True)],
    )
    with pytest.raises(EnvironmentFailure) as caught:
        hooks.environments.get(ENV).map_result(answer(resolved=True))
    assert caught.value.kind == "verifier_error"


# ---- production: swe_agents + Apptainer ------------------------------------------------------------------


def plan(**overrides: Any) -> ProductionPlan:
    return ProductionPlan(
        **{"sif_dir": "/data/sifs", "dataset_path": "/data/r2e_gym_train.jsonl", **overrides}
    )


def test_the_seeds_deadline_is_refused_with_the_numbers() -> None:
    with pytest.raises(ConfigError) as caught:
        plan(deadline_s=1200)
    message = str(caught.value)
    assert "trial deadline (NEMO_GYM_DEADLINE_S) 1200 s is shorter than" in message
    assert "agent timeout 3600 s + tests timeout 1800 s + cleanup grace 30 s = 5430 s" in message
    DeadlinePolicy(agent_timeout_s=600, tests_timeout_s=300, cleanup_grace_s=30).check(930)  # exactly enough


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"max_deadline_s": 5000}, "max_deadline_s 5000 s is below the trial deadline 5460 s"),
        ({"sif_prefix": "a/b"}, "sif_prefix must not contain '/'"),
        ({"sif_dir": "sifs"}, "sif_dir must be an absolute path"),
        ({"dataset_name": "my/swe-data"}, "must contain 'R2E-Gym'"),
        ({"lease_s": 0}, "lease_s 0 must be positive"),
    ],
)
def test_inconsistent_production_plans_are_refused(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        plan(**overrides)


def test_the_swe_agents_config_and_relax_flags_agree() -> None:
    production = plan(sif_prefix="r2e-", deadline_s=6000, lease_s=120)
    config = production.swe_agents_config()["swe_agents"]["responses_api_agents"]["swe_agents"]
    assert config["container_formatter"] == "/data/sifs/r2e-{instance_id}.sif"
    assert (config["swebench_agent_timeout"], config["swebench_tests_timeout"]) == (3600, 1800)
    assert config["dataset_path"] == "/data/r2e_gym_train.jsonl"
    flags = production.relax_flags("http://gym:28100")
    assert flags[flags.index("--agent-timeout") + 1] == "6060"  # the client outlives the trial
    assert "NEMO_GYM_DEADLINE_S=6000" in flags and "NEMO_GYM_CONFIG=r2e-gym-v1" in flags
    spec = production.environments("http://gym:28101")["r2e-gym-v1"]
    assert (spec["agent_name"], spec["max_deadline_s"], spec["environment"]) == ("swe_agents", 7200, ENV)


def test_the_prepare_tool_writes_rows_manifest_and_configs(
    tmp_path: Path, r2e_rows: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "r2e.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in r2e_rows))
    out = tmp_path / "out"
    code = prepare.main(["--input", str(source), "--output-dir", str(out), "--sif-dir", "/data/sifs"])
    assert code == 0, capsys.readouterr().err
    prepared = [json.loads(line) for line in (out / "r2e_gym_train.jsonl").read_text().splitlines()]
    manifest = [json.loads(line) for line in (out / "r2e_gym_train_sifs.jsonl").read_text().splitlines()]
    relax = [json.loads(line) for line in (out / "r2e_gym_train_relax.jsonl").read_text().splitlines()]
    assert len(prepared) == len(manifest) == len(relax) == len(r2e_rows)
    assert manifest[0]["sif_path"] == f"/data/sifs/{r2e_instance(r2e_rows[0]).sif_name}"
    assert relax[0]["input"][0]["content"] == r2e_rows[0]["problem_statement"]
    assert json.loads((out / "r2e_gym_swe_agents.yaml").read_text())["swe_agents"]
    assert (
        json.loads((out / "r2e_gym_environments.json").read_text())["r2e-gym-v1"]["agent_name"]
        == "swe_agents"
    )
    assert "--agent-timeout 5520" in capsys.readouterr().out


def test_the_prepare_tool_refuses_a_bad_row_or_deadline_and_writes_nothing(
    tmp_path: Path, r2e_rows: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    broken = dict(r2e_rows[1], commit_hash="0" * 40)
    source = tmp_path / "r2e.jsonl"
    source.write_text(json.dumps(r2e_rows[0]) + "\n\n" + json.dumps(broken) + "\n")
    out = tmp_path / "out"
    assert prepare.main(["--input", str(source), "--output-dir", str(out), "--sif-dir", "/s"]) == 2
    assert f"{source}:3: docker_image commit" in capsys.readouterr().err
    assert not out.exists()
    source.write_text(json.dumps(r2e_rows[0]) + "\n")
    assert (
        prepare.main(
            ["--input", str(source), "--output-dir", str(out), "--sif-dir", "/s", "--deadline-s", "1200"]
        )
        == 2
    )
    assert "1200 s is shorter than agent timeout 3600 s" in capsys.readouterr().err
    assert not out.exists()
