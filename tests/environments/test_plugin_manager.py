"""make_plugin_manager() with real distributions: discovery, blocking, load failures, bad hookimpls,
duplicate environments, and the in-process plugins tests register."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

import pytest

from relax_gym_core.errors import ConfigError, PluginError
from relax_gym_core.plugin import (
    STATELESS,
    DuplicateEnvironmentError,
    EnvironmentDefinition,
    NemoGymServer,
    PluginInfo,
    PluginLoadError,
    UnknownEnvironmentError,
    converted_row,
    hookimpl,
    make_plugin_manager,
)
from relax_gym_core.plugin.manager import DISABLE_VAR, TRACE_VAR

BROKEN_PLUGIN = """
import relax_gym_fake_sdk_that_is_not_installed  # the plugin's own dependency is missing
"""
MISSPELLED_PLUGIN = """
from relax_gym_core.plugin import hookimpl


@hookimpl
def convert_rows(environment, row):
    return {"input": [], "metadata": {}}
"""
WRONG_ARGUMENTS_PLUGIN = """
from relax_gym_core.plugin import hookimpl


@hookimpl
def convert_row(env, line):
    return None
"""


def definition(name: str) -> EnvironmentDefinition:
    return EnvironmentDefinition(
        name=name,
        configs=("default",),
        agent="agent",
        servers=(
            NemoGymServer(
                name="agent", kind="responses_api_agents", implementation="simple_agent", server_class="m:C"
            ),
        ),
    )


def plugin_registering(*names: str) -> types.SimpleNamespace:
    @hookimpl
    def register_environments(registrar: Any) -> None:
        for name in names:
            registrar.add(definition(name))

    return types.SimpleNamespace(register_environments=register_environments)


def test_entry_point_of_a_real_distribution_is_loaded(
    install_dist: Callable[..., Any], isolated_env: list[str], good_plugin: Callable[[str], str]
) -> None:
    dist = install_dist(
        distribution="relax-gym-fake",
        version="1.2.3",
        entry_points={"fake": "{pkg}.plugin"},
        modules={"plugin": good_plugin("fake_env")},
    )
    hooks = make_plugin_manager(blocked=isolated_env)
    info = PluginInfo(
        name="fake", distribution="relax-gym-fake", version="1.2.3", module=f"{dist.package}.plugin"
    )
    assert hooks.plugins == [info]
    assert hooks.environments.get("fake_env").configs == ("default", "hard")
    assert hooks.owner("fake_env") == info
    assert hooks.environments.get("fake_env").cleanup.probe_path == "/cleanup/{rollout_id}"
    assert make_plugin_manager(load_entry_points=False, blocked=isolated_env).plugins == []


def test_disable_variable_blocks_a_plugin_before_it_is_imported(
    install_dist: Callable[..., Any],
    isolated_env: list[str],
    good_plugin: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    good = install_dist(
        distribution="relax-gym-good",
        entry_points={"good": "{pkg}.plugin"},
        modules={"plugin": good_plugin("e")},
    )
    broken = install_dist(
        distribution="relax-gym-broken",
        entry_points={"broken": "{pkg}.plugin"},
        modules={"plugin": BROKEN_PLUGIN},
    )
    monkeypatch.setenv(DISABLE_VAR, ",".join([*isolated_env, " broken "]))
    hooks = make_plugin_manager()
    assert [info.name for info in hooks.plugins] == ["good"]
    assert f"{broken.package}.plugin" not in sys.modules  # blocked means never imported
    assert f"{good.package}.plugin" in sys.modules
    monkeypatch.setenv(DISABLE_VAR, ",".join([*isolated_env, "good", "broken"]))
    with pytest.raises(UnknownEnvironmentError, match="no installed plugin provides environment 'e'"):
        make_plugin_manager().environments.get("e")


def test_plugin_that_fails_to_import_names_entry_point_and_distribution(
    install_dist: Callable[..., Any], isolated_env: list[str]
) -> None:
    dist = install_dist(
        distribution="relax-gym-broken",
        entry_points={"broken": "{pkg}.plugin"},
        modules={"plugin": BROKEN_PLUGIN},
    )
    with pytest.raises(PluginLoadError) as caught:
        make_plugin_manager(blocked=isolated_env)
    message = str(caught.value)
    assert "entry point 'broken'" in message
    assert f"({dist.package}.plugin)" in message
    assert "distribution relax-gym-broken" in message
    assert "relax_gym_fake_sdk_that_is_not_installed" in message
    assert isinstance(caught.value.__cause__, ImportError)


def test_hookimpl_with_wrong_arguments_is_an_invalid_plugin(
    install_dist: Callable[..., Any], isolated_env: list[str]
) -> None:
    install_dist(
        distribution="relax-gym-wrong",
        entry_points={"wrong": "{pkg}.plugin"},
        modules={"plugin": WRONG_ARGUMENTS_PLUGIN},
    )
    with pytest.raises(
        PluginLoadError, match=r"entry point 'wrong' .* of distribution relax-gym-wrong is invalid"
    ):
        make_plugin_manager(blocked=isolated_env)


def test_misspelled_hook_fails_check_pending_naming_the_plugin(
    install_dist: Callable[..., Any], isolated_env: list[str]
) -> None:
    install_dist(
        distribution="relax-gym-typo",
        entry_points={"typo": "{pkg}.plugin"},
        modules={"plugin": MISSPELLED_PLUGIN},
    )
    with pytest.raises(PluginError) as caught:
        make_plugin_manager(blocked=isolated_env)
    assert not isinstance(caught.value, PluginLoadError)  # it imported fine; the hook name is wrong
    message = str(caught.value)
    assert "plugin 'typo' of distribution relax-gym-typo implements an unknown hook" in message
    assert "'convert_rows'" in message


def test_misspelled_hook_of_an_in_process_plugin_is_refused_too() -> None:
    @hookimpl
    def convert_rows(environment: str, row: dict[str, Any]) -> None:
        del environment, row

    plugin = types.SimpleNamespace(convert_rows=convert_rows)
    with pytest.raises(PluginError, match="plugin 'typo' implements an unknown hook 'convert_rows'"):
        make_plugin_manager(load_entry_points=False, plugins=[("typo", plugin)])


def test_in_process_plugin_with_wrong_arguments_is_a_plugin_error() -> None:
    @hookimpl
    def map_result(env: str, payload: dict[str, Any]) -> None:
        del env, payload

    with pytest.raises(PluginError, match="plugin 'wrong' is invalid"):
        make_plugin_manager(
            load_entry_points=False, plugins=[("wrong", types.SimpleNamespace(map_result=map_result))]
        )


def test_blocked_in_process_plugin_is_not_registered() -> None:
    hooks = make_plugin_manager(
        load_entry_points=False, blocked=["alpha"], plugins=[("alpha", plugin_registering("a"))]
    )
    assert hooks.plugins == []
    assert len(hooks.environments) == 0


def test_duplicate_environment_names_across_plugins_name_both() -> None:
    hooks = make_plugin_manager(
        load_entry_points=False,
        plugins=[
            ("alpha", plugin_registering("shared", "only_alpha")),
            ("beta", plugin_registering("shared")),
        ],
    )
    with pytest.raises(DuplicateEnvironmentError) as caught:
        _ = hooks.environments
    message = str(caught.value)
    assert "'shared'" in message
    assert "'alpha'" in message
    assert "'beta'" in message


def test_registration_hook_may_declare_fewer_arguments() -> None:
    calls: list[str] = []

    @hookimpl
    def register_environments() -> None:
        calls.append("called")

    hooks = make_plugin_manager(
        load_entry_points=False,
        plugins=[("quiet", types.SimpleNamespace(register_environments=register_environments))],
    )
    assert len(hooks.environments) == 0
    assert calls == ["called"]


def test_plugins_answer_their_environments_and_the_reference_answers_the_rest() -> None:
    @hookimpl
    def convert_row(environment: str, row: dict[str, Any]) -> dict[str, Any] | None:
        if environment != "mine":
            return None
        return {"input": [{"role": "user", "content": row["text"]}], "metadata": {"mine": True}}

    @hookimpl
    def cleanup_contract(environment: str) -> Any:
        return STATELESS if environment == "mine" else None

    plugin = types.SimpleNamespace(convert_row=convert_row, cleanup_contract=cleanup_contract)
    hooks = make_plugin_manager(load_entry_points=False, plugins=[("mine", plugin)])
    assert converted_row(hooks.environments.get("mine"), {"text": "hi"})["metadata"] == {"mine": True}
    raw = {"responses_create_params": {"input": []}, "id": 7}
    assert converted_row(hooks.environments.get("other"), raw) == {"input": [], "metadata": {"id": 7}}
    assert hooks.environments.get("mine").cleanup is STATELESS
    with pytest.raises(ConfigError, match="no plugin declares how environment 'other' is cleaned up"):
        hooks.environments.get("other").cleanup
    assert list(hooks.environments.get("mine").verifier_probes()) == []


def test_trace_goes_to_stderr_not_to_command_output(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(TRACE_VAR, "1")
    hooks = make_plugin_manager(load_entry_points=False)
    converted_row(
        hooks.environments.get("env"), {"responses_create_params": {"input": []}, "expected_answer": 1}
    )
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "convert_row" in captured.err
