"""make_plugin_manager() with real distributions: discovery, blocking, load failures, bad hookimpls, plugins
still implementing a removed hook, registration errors, duplicate environments, and the in-process plugins
tests register."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

import attrs
import pytest

from relax_gym_core.errors import PluginError
from relax_gym_core.plugin import (
    STATELESS,
    CleanupContract,
    EnvironmentDefinition,
    EnvironmentRegistrar,
    NemoGymServer,
    RowError,
    hookimpl,
    resources_server,
    simple_agent,
)
from relax_gym_core.plugin.host import (
    DuplicateEnvironmentError,
    PluginInfo,
    PluginLoadError,
    UnknownEnvironmentError,
    converted_row,
    make_plugin_manager,
)
from relax_gym_core.plugin.manager import DISABLE_VAR, TRACE_VAR
from relax_gym_core.protocol import Generation

BROKEN_PLUGIN = """
import relax_gym_fake_sdk_that_is_not_installed  # the plugin's own dependency is missing
"""
MISSPELLED_PLUGIN = """
from relax_gym_core.plugin import hookimpl


@hookimpl
def register_environment(registrar):
    pass
"""
WRONG_ARGUMENTS_PLUGIN = """
from relax_gym_core.plugin import hookimpl


@hookimpl
def register_environments(registry):
    pass
"""
# The six per-environment hooks of the old API, with the signatures they had; none is a hook any more.
REMOVED_HOOKS = {
    "convert_row": "environment, row",
    "drop_reason": "environment, row",
    "build_run_body": "environment, task, generation, rollout_id",
    "verifier_probes": "environment",
    "cleanup_contract": "environment",
    "map_result": "environment, body",
}
HOOKS = "(the hooks are register_environments, register_runtimes)"
AGENT = NemoGymServer(
    name="agent", kind="responses_api_agents", implementation="simple_agent", server_class="m:C"
)


COUNTDOWN = resources_server("countdown", "countdown", "relax_gym_countdown.server:Countdown")
MODEL_TYPO = {"type": "responses_api_models", "name": "policy_modle"}


def legacy_plugin(hook: str) -> str:
    """A plugin written for the old API: it registers an environment, then answers `hook` for it."""
    return f"""
from relax_gym_core.plugin import STATELESS, EnvironmentDefinition, NemoGymServer, hookimpl

AGENT = NemoGymServer(
    name="agent", kind="responses_api_agents", implementation="simple_agent", server_class="m:C"
)


@hookimpl
def register_environments(registrar):
    registrar.add(EnvironmentDefinition(name="legacy", configs=("c",), agent="agent", servers=(AGENT,),
                                        cleanup=STATELESS))


@hookimpl
def {hook}({REMOVED_HOOKS[hook]}):
    return None
"""


def in_process_plugin(**hooks: Any) -> types.ModuleType:
    """A plugin registered in-process: a module holding its hookimpls (pluggy keeps plugins in sets, so a
    plugin is hashable; a SimpleNamespace is not)."""
    plugin = types.ModuleType("in_process_plugin")
    vars(plugin).update(hooks)
    return plugin


def definition(name: str, **changes: Any) -> EnvironmentDefinition:
    fields: dict[str, Any] = {
        "name": name,
        "configs": ("default",),
        "agent": "agent",
        "servers": (AGENT,),
        "cleanup": STATELESS,
    }
    return EnvironmentDefinition(**{**fields, **changes})


def plugin_registering(*registered: str | object) -> types.ModuleType:
    """A plugin whose register_environments adds each of `registered`: a name (a good definition) or an
    object as it is."""

    @hookimpl
    def register_environments(registrar: Any) -> None:
        for item in registered:
            registrar.add(definition(item) if isinstance(item, str) else item)

    return in_process_plugin(register_environments=register_environments)


def test_entry_point_of_a_real_distribution_is_loaded(
    install_dist: Callable[..., Any], isolated_env: list[str], good_plugin: Callable[..., str]
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
    good_plugin: Callable[..., str],
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
    assert "'register_environment'" in message


@pytest.mark.parametrize("hook", sorted(REMOVED_HOOKS))
def test_a_plugin_still_implementing_a_removed_hook_fails_to_load_in_one_line(
    install_dist: Callable[..., Any], isolated_env: list[str], hook: str
) -> None:
    # Replaces the tests of the per-environment hooks (answer None for environments a plugin does not
    # own, firstresult order, the reference as a trylast plugin): a plugin still answering one of them
    # must not load half-working, whatever it returns; it is refused by name.
    install_dist(
        distribution="relax-gym-legacy",
        entry_points={"legacy": "{pkg}.plugin"},
        modules={"plugin": legacy_plugin(hook)},
    )
    with pytest.raises(PluginError) as caught:
        make_plugin_manager(blocked=isolated_env)
    assert str(caught.value) == (
        f"plugin 'legacy' of distribution relax-gym-legacy implements an unknown hook {hook!r} {HOOKS}"
    )


@pytest.mark.parametrize("hook", sorted(REMOVED_HOOKS))
def test_an_in_process_plugin_implementing_a_removed_hook_is_refused(hook: str) -> None:
    namespace: dict[str, Any] = {}
    exec(compile(legacy_plugin(hook), "legacy_plugin", "exec"), namespace)
    plugin = in_process_plugin(**{k: v for k, v in namespace.items() if k in ("register_environments", hook)})
    with pytest.raises(PluginError) as caught:
        make_plugin_manager(load_entry_points=False, plugins=[("old", plugin)])
    assert str(caught.value) == f"plugin 'old' implements an unknown hook {hook!r} {HOOKS}"


def test_misspelled_hook_of_an_in_process_plugin_is_refused_too() -> None:
    @hookimpl
    def register_runtime(registrar: Any) -> None:
        del registrar

    plugin = in_process_plugin(register_runtime=register_runtime)
    with pytest.raises(PluginError, match="plugin 'typo' implements an unknown hook 'register_runtime'"):
        make_plugin_manager(load_entry_points=False, plugins=[("typo", plugin)])


def test_in_process_plugin_with_wrong_arguments_is_a_plugin_error() -> None:
    @hookimpl
    def register_runtimes(registry: Any) -> None:
        del registry

    with pytest.raises(PluginError, match="plugin 'wrong' is invalid"):
        make_plugin_manager(
            load_entry_points=False,
            plugins=[("wrong", in_process_plugin(register_runtimes=register_runtimes))],
        )


def test_an_unhashable_in_process_plugin_is_refused_by_name() -> None:
    plugin = types.SimpleNamespace(register_environments=plugin_registering("e").register_environments)
    with pytest.raises(PluginError, match=r"^plugin 'loose' is invalid: a SimpleNamespace is unhashable"):
        make_plugin_manager(load_entry_points=False, plugins=[("loose", plugin)])


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


def test_an_environment_registered_twice_by_one_plugin_is_a_duplicate_too() -> None:
    hooks = make_plugin_manager(load_entry_points=False, plugins=[("alpha", plugin_registering("e", "e"))])
    with pytest.raises(
        DuplicateEnvironmentError,
        match="environment 'e' is registered by both plugin 'alpha' and plugin 'alpha'",
    ):
        _ = hooks.environments


@pytest.mark.parametrize(
    ("registered", "needle"),
    [
        ({"name": "e"}, "plugin 'p' registers dict, not an EnvironmentDefinition"),
        (definition("e", cleanup=None), "plugin 'p': environment 'e' has no CleanupContract"),
        (definition("e", cleanup="stateless"), "plugin 'p': environment 'e' has no CleanupContract"),
        (definition("e", configs=()), "plugin 'p': environment 'e' registers no config"),
        (
            definition("e", agent="ghost"),
            "plugin 'p': environment 'e': agent 'ghost' is not one of its servers",
        ),
        (
            definition("e", servers=(simple_agent("agent", resources="countdwn"), COUNTDOWN)),
            "plugin 'p': environment 'e': server 'agent' names resources server 'countdwn', which is not one "
            "of its servers (agent, countdown)",
        ),
        (
            definition("e", servers=(attrs.evolve(AGENT, config={"model_server": MODEL_TYPO}),)),
            "plugin 'p': environment 'e': server 'agent' names responses api model 'policy_modle', which is "
            "not one of its servers (agent)",
        ),
        (
            definition("e", servers=(AGENT, COUNTDOWN), readiness=("countdown", "ghost")),
            "plugin 'p': environment 'e': readiness names 'ghost', which is not one of its servers "
            "(agent, countdown)",
        ),
    ],
    ids=[
        "not a definition",
        "no cleanup",
        "cleanup not a contract",
        "no config",
        "agent not a server",
        "resources typo",
        "model typo",
        "readiness typo",
    ],
)
def test_registration_errors_name_the_plugin_and_the_rule(registered: object, needle: str) -> None:
    hooks = make_plugin_manager(load_entry_points=False, plugins=[("p", plugin_registering(registered))])
    with pytest.raises(PluginError) as caught:
        _ = hooks.environments
    assert str(caught.value) == needle


def test_an_environment_that_cannot_start_here_may_name_a_server_it_lacks_until_then() -> None:
    """A judged environment without a judge endpoint names its judge's server, which is there once the
    operator names the endpoint: listed (relax-gym plugins), refused at start by its own reason."""

    class Judged(EnvironmentDefinition):
        def unavailable(self) -> str | None:
            return "its verifier asks an LLM judge: name one"

    judge = {"judge_model_server": {"type": "responses_api_models", "name": "the_judge"}}
    judged = Judged(
        name="e",
        configs=("c",),
        agent="agent",
        servers=(simple_agent("agent", resources="countdown"), attrs.evolve(COUNTDOWN, config=judge)),
        cleanup=STATELESS,
    )
    hooks = make_plugin_manager(load_entry_points=False, plugins=[("p", plugin_registering(judged))])
    assert hooks.environments.get("e") is judged


def test_an_environment_with_its_own_runtime_needs_no_servers() -> None:
    own = definition("e", agent="local", servers=(), runtime="sandbox")
    hooks = make_plugin_manager(load_entry_points=False, plugins=[("p", plugin_registering(own))])
    assert hooks.environments.get("e") is own


def test_registration_hook_may_declare_fewer_arguments() -> None:
    calls: list[str] = []

    @hookimpl
    def register_environments() -> None:
        calls.append("called")

    hooks = make_plugin_manager(
        load_entry_points=False,
        plugins=[("quiet", in_process_plugin(register_environments=register_environments))],
    )
    assert len(hooks.environments) == 0
    assert calls == ["called"]


class Mine(EnvironmentDefinition):
    """Overrides conversion only: everything else is the reference behaviour."""

    def convert_row(self, row: dict[str, Any]) -> dict[str, Any]:
        return {"input": [{"role": "user", "content": row["text"]}], "metadata": {"mine": True}}


def test_a_registered_environment_behaves_as_its_object_and_any_other_as_the_reference() -> None:
    # Replaces "plugins answer their environments (None for the rest) and the reference answers the
    # rest": each environment is its own object, so no plugin can answer for another's.
    mine = Mine(name="mine", configs=("c",), agent="agent", servers=(AGENT,), cleanup=STATELESS)
    hooks = make_plugin_manager(load_entry_points=False, plugins=[("mine", plugin_registering(mine))])
    assert hooks.environments.get("mine") is mine
    assert hooks.environments.lookup("mine") is mine
    assert converted_row(mine, {"text": "hi"}) == {
        "input": [{"role": "user", "content": "hi"}],
        "metadata": {"mine": True},
    }
    assert mine.cleanup is STATELESS
    assert list(mine.verifier_probes()) == []
    assert mine.drop_reason({"input": [], "metadata": {}}) is None
    body = mine.build_run_body({"messages": [], "metadata": {"id": 1}}, Generation(), "t-0")
    assert body == {
        "responses_create_params": {"input": []},
        "id": 1,
        "_ng_rollout_id": "t-0",
        "_ng_task_index": "t",
        "_ng_rollout_index": "0",
    }
    assert mine.map_result({"reward": 0.5}).reward == 0.5

    # An environment no plugin registers: unknown to get() (naming what is installed), the reference
    # behaviour to lookup() (what `relax-gym serve` runs for an environments file naming it).
    with pytest.raises(UnknownEnvironmentError, match=r"environment 'other' \(installed: mine\)"):
        hooks.environments.get("other")
    other = hooks.environments.lookup("other")
    assert type(other) is EnvironmentDefinition
    assert (other.name, other.servers) == ("other", ())
    raw = {"responses_create_params": {"input": []}, "id": 7}
    assert converted_row(other, raw) == {"input": [], "metadata": {"id": 7}}
    with pytest.raises(RowError, match="must contain responses_create_params"):
        converted_row(other, {"text": "hi"})  # not Mine's conversion: the reference's refuses the row
    assert list(hooks.environments) == [mine]


def test_a_conversion_that_breaks_the_row_shape_is_a_plugin_error_naming_the_environment() -> None:
    class Broken(EnvironmentDefinition):
        def convert_row(self, row: dict[str, Any]) -> dict[str, Any]:
            return {"input": row["text"], "metadata": {}}

    broken = Broken(name="broken", configs=("c",), agent="agent", servers=(AGENT,), cleanup=STATELESS)
    with pytest.raises(
        PluginError, match="convert_row of environment 'broken': input must be a list of messages, got str"
    ):
        converted_row(broken, {"text": "hi"})


def test_cleanup_contracts_are_the_registered_objects() -> None:
    contract = CleanupContract.at("agent", "/cleanup/{rollout_id}")
    hooks = make_plugin_manager(
        load_entry_points=False, plugins=[("p", plugin_registering(definition("e", cleanup=contract)))]
    )
    assert hooks.environments.get("e").cleanup is contract


def test_trace_never_reaches_command_output(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(TRACE_VAR, "1")
    hooks = make_plugin_manager(load_entry_points=False, plugins=[("p", plugin_registering("e"))])
    converted_row(
        hooks.environments.get("e"), {"responses_create_params": {"input": []}, "expected_answer": 1}
    )
    _ = hooks.runtimes
    assert capsys.readouterr().out == ""  # stdout carries command output (relax-gym plugins --json)


def test_trace_names_the_registration_hooks_on_stderr(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(TRACE_VAR, "1")
    hooks = make_plugin_manager(load_entry_points=False, plugins=[("p", plugin_registering("e"))])
    _ = hooks.environments, hooks.runtimes
    captured = capsys.readouterr()
    assert captured.out == ""
    # One line per registration hook a plugin implements: which plugin registered what.
    assert captured.err.splitlines() == ["relax-gym: plugin 'p' register_environments: e"]


def test_a_plugin_that_crashes_while_registering_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken:
        @hookimpl
        def register_environments(self, registrar: EnvironmentRegistrar) -> None:
            raise TypeError(
                "EnvironmentDefinition.__init__() missing 1 required keyword-only argument: 'cleanup'"
            )

    hooks = make_plugin_manager(load_entry_points=False, plugins=[("half_migrated", Broken())])
    with pytest.raises(
        PluginError, match=r"^plugin 'half_migrated' failed in register_environments: TypeError: "
    ):
        _ = hooks.environments


def test_trace_names_a_plugin_that_crashed_and_what_it_registered_first(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    @hookimpl
    def register_environments(registrar: EnvironmentRegistrar) -> None:
        registrar.add(definition("e"))
        raise KeyError("half done")

    monkeypatch.setenv(TRACE_VAR, "1")
    hooks = make_plugin_manager(
        load_entry_points=False,
        plugins=[("crashing", in_process_plugin(register_environments=register_environments))],
    )
    with pytest.raises(PluginError, match="plugin 'crashing' failed in register_environments: KeyError"):
        _ = hooks.environments
    assert capsys.readouterr().err.splitlines() == [
        "relax-gym: plugin 'crashing' register_environments: e, then failed: KeyError"
    ]
