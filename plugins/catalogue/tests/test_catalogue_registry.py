"""The catalogue as registered from the installed NeMo Gym's own files (no server runs here): what each
environment is, how its recordings become probes, and the conformance kit's checks that need no server."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import attrs
import pytest
from relax_gym_core.plugin import STATELESS, EnvironmentRegistrar, hookimpl
from relax_gym_core.testing import (
    Hooks,
    check_conversion,
    check_registration,
    check_result_mapping,
    make_plugin_manager,
    unscored_answers,
)

from relax_gym_catalogue import plugin
from relax_gym_catalogue.catalogue import ENTRIES, Entry
from relax_gym_catalogue.plugin import TOOL_STEPS
from relax_gym_catalogue.recordings import recorded_probes, task_of
from relax_gym_catalogue.servers import REQUIRES, STATE
from relax_gym_catalogue.upstream import installed, located, read_server

NAMES = [entry.name for entry in ENTRIES]
DEDICATED = {"calendar", "math_with_judge", "mcqa", "reasoning_gym", "workplace_assistant"}
# Random corruptions of each environment's rows (the kit's default is 60): every catalogued environment
# converts with the one reference conversion, so the ~50 of them together still try it on ~750 broken
# rows, each environment's own among them.
CORRUPTIONS = 15


@pytest.fixture(scope="module")
def hooks() -> Hooks:
    return make_plugin_manager()


def test_at_least_thirty_environments_beyond_the_six_plugins_are_proven(hooks: Hooks) -> None:
    registry = hooks.environments
    catalogued = [d for d in registry if registry.owner(d.name) == "catalogue"]
    # every catalogued server this NeMo Gym has (CI's 0.4.0 lacks those of later releases)
    assert sorted(d.name for d in catalogued) == sorted(name for name in NAMES if installed(name))
    assert not DEDICATED & set(NAMES)  # a dedicated plugin runs those; the catalogue never shadows one
    provable = [d for d in catalogued if any(p.skip is None for p in d.verifier_probes())]
    assert len(provable) >= 30


@pytest.mark.parametrize("name", NAMES)
def test_each_environment_is_upstreams_server_as_upstream_configures_it(
    hooks: Hooks, name: str, require_installed: Callable[[str], None]
) -> None:
    require_installed(name)
    definition = hooks.environments.get(name)
    upstream = read_server(name, next(e.config for e in ENTRIES if e.name == name))
    check_registration(hooks, name, installed=True)
    assert definition.configs == (upstream.config,)
    assert definition.agent == upstream.agent.name
    resources, agent = definition.servers[:2]
    assert resources.name == upstream.resources.name
    fields = located(upstream.resources.own_fields(), upstream.directory)  # its files found where they are
    if next(e for e in ENTRIES if e.name == name).judge:  # its judge is never the policy: its own server
        fields["judge_model_server"] = {"type": "responses_api_models", "name": "relax_gym_judge"}
    assert dict(resources.config) == fields  # upstream's fields, untouched otherwise
    assert agent.config["resources_server"] == {"type": "resources_servers", "name": resources.name}
    assert agent.config["model_server"]["name"] == "policy_model"  # every model call goes to the gateway
    # Upstream's agent fields, its simple_agent bounded where upstream leaves it unbounded: one generation
    # without tools, TOOL_STEPS with them (a reasoning-only reply never loops to the trial's deadline).
    own = upstream.agent.own_fields()
    bounded = {key: value for key, value in agent.config.items() if key in own or key == "max_steps"}
    if upstream.agent.implementation == "simple_agent" and own.get("max_steps") is None:
        tools = any(row["responses_create_params"].get("tools") for row in upstream.example_rows())
        own["max_steps"] = TOOL_STEPS if tools else 1
    assert bounded == own
    # A server that needs packages or keeps state runs as its servers.py class; a stateful one has the
    # cleanup contract.
    ours = f"relax_gym_catalogue.servers:{name}"
    assert resources.server_class == (ours if name in STATE or name in REQUIRES else upstream.resources_class)
    if name in STATE:
        assert definition.cleanup.server == resources.name and definition.cleanup.probe_path is not None
    else:
        assert definition.cleanup == STATELESS


@pytest.mark.parametrize("name", NAMES)
def test_upstreams_example_rows_convert_and_unscored_answers_never_score(
    hooks: Hooks, name: str, require_installed: Callable[[str], None]
) -> None:
    require_installed(name)
    entry = next(e for e in ENTRIES if e.name == name)
    rows = read_server(name, entry.config).example_rows()
    if name == "structured_outputs":
        # Its rows repeat their params' parallel_tool_calls at the top level. The reference conversion
        # (Relax's) keeps one value, the params' (the same); upstream reads the top-level one only for
        # its aggregate metrics' breakdown. A known loss, so that field is left out of the check.
        rows = [{k: v for k, v in row.items() if k != "parallel_tool_calls"} for row in rows]
    check_conversion(hooks, name, rows, max_examples=CORRUPTIONS)
    body = {"response": {"output": []}, "reward": 1.0}
    check_result_mapping(hooks, name, body=body, failure_bodies=list(unscored_answers(body).values()))


def test_a_recording_is_joined_to_its_example_row_by_prompt(hooks: Hooks) -> None:
    """xlam_fc's recordings lack `expected_answers`: each replays on its own row of example.jsonl."""
    upstream = read_server("xlam_fc")
    examples = upstream.example_rows()
    for line in upstream.recorded_lines():
        recorded = json.loads(line)
        assert "expected_answers" not in recorded
        task, problem = task_of(recorded, examples)
        assert problem is None and task in examples


def test_rows_sharing_a_prompt_are_told_apart_by_the_recordings_task_index() -> None:
    upstream = read_server("grl_sokoban")  # five seeded levels, one prompt
    examples = upstream.example_rows()
    recordings = [json.loads(line) for line in upstream.recorded_lines()]
    for recorded in recordings:
        task, _problem = task_of(recorded, examples)
        assert task == examples[recorded["_ng_task_index"]]
    nameless = {k: v for k, v in recordings[0].items() if k != "_ng_task_index"}
    task, problem = task_of(nameless, examples)
    assert task is None and problem == "its prompt is that of 5 example rows and it names none of them"


def test_a_recording_of_a_task_not_shipped_is_its_own_task() -> None:
    upstream = read_server("gpqa_diamond")  # recorded on dataset rows 184, 96, ...
    examples = upstream.example_rows()
    recorded = json.loads(upstream.recorded_lines()[0])
    task, problem = task_of(recorded, examples)
    assert problem is None and task not in examples
    assert task is not None and "reward" not in task and "response" not in task
    assert set(task) <= {key for row in examples for key in row}
    assert None not in task["responses_create_params"].values()


def test_what_cannot_be_replayed_is_skipped_with_its_reason() -> None:
    good: dict[str, Any] = {
        "response": {"output": []},
        "reward": 1.0,
        "responses_create_params": {"input": []},
    }
    probes = recorded_probes([None, {"reward": 1.0}, good], [], skip=None)
    assert [p.skip for p in probes] == [
        "a placeholder line, not a recorded rollout",
        "no recorded trajectory and reward",
        None,
    ]
    assert all(p.replay for p in probes)
    table = recorded_probes([good], [], skip="its dealer draws from an unseeded random generator")
    assert table[0].skip == "its dealer draws from an unseeded random generator"


def test_a_server_this_nemo_gym_lacks_is_left_out_quietly_and_one_that_differs_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A server of a later NeMo Gym (main's, under CI's 0.4.0) is expected to be missing: a debug line. One
    that is there but whose files are not what the catalogue names (here, a config it lacks) warns."""
    entries = (Entry(name="no_such_server"), Entry(name="arc_agi", config="nope"), Entry(name="arc_agi"))
    monkeypatch.setattr(plugin, "ENTRIES", entries)
    with caplog.at_level(logging.DEBUG, logger=plugin.__name__):
        found = plugin.definitions()
    assert [definition.name for definition in found] == ["arc_agi"]
    said = [(record.levelno, record.getMessage()) for record in caplog.records]
    assert len(said) == 2, said
    (quiet, missing), (loud, differs) = said
    assert quiet == logging.DEBUG and "leaves out no_such_server" in missing
    assert "no such server in this NeMo Gym" in missing
    assert loud == logging.WARNING and "leaves out arc_agi" in differs and "nope.yaml" in differs


def test_without_a_nemo_gym_environment_it_registers_nothing_and_says_why(tmp_path: Any) -> None:
    environ = {**os.environ, "RELAX_GYM_NEMO_GYM_PYTHON": str(tmp_path / "no-python")}
    done = subprocess.run(
        [sys.executable, "-m", "relax_gym_core.cli", "plugins", "--json"],
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    by_plugin = {p["name"]: p["environments"] for p in document["plugins"]}
    assert by_plugin["catalogue"] == []
    assert by_plugin["mcqa"]  # the other plugins are untouched
    assert "relax-gym-catalogue registers nothing" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_plugin_of_its_own_for_a_catalogued_server_takes_its_name(
    hooks: Hooks, caplog: pytest.LogCaptureFixture
) -> None:
    """The catalogue registers after every other plugin (trylast) and leaves a taken name to its owner,
    whichever order the plugins were installed in: a user's own equivalence_rule plugin is not a duplicate."""
    theirs = attrs.evolve(hooks.environments.get("equivalence_rule"), description="my own equivalence_rule")

    class Mine:
        @hookimpl
        def register_environments(self, registrar: EnvironmentRegistrar) -> None:
            registrar.add(theirs)

    with caplog.at_level(logging.INFO, logger=plugin.__name__):
        mine = make_plugin_manager(plugins=[("mine", Mine())])
        registry = mine.environments
    assert registry.owner("equivalence_rule") == "mine"
    assert registry.get("equivalence_rule").description == "my own equivalence_rule"
    assert registry.owner("arc_agi") == "catalogue"  # the rest is still the catalogue's
    assert "relax-gym-catalogue leaves equivalence_rule to plugin mine" in caplog.text
