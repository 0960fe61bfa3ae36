"""The optional LLM judge's configuration: off by default; on, its calls go to the endpoint the operator
names and never to policy_model (the gateway); configurations that would do otherwise are refused.
test_gsm8k_judge_server.py runs the judge for real."""

from __future__ import annotations

import pytest
from relax_gym_core.errors import ConfigError
from relax_gym_core.gym.config import servers_of
from relax_gym_core.plugin import JudgeEndpoint
from relax_gym_core.testing import plugin_hooks
from relax_gym_core.testing.web import run_cli

from relax_gym_gsm8k import plugin
from relax_gym_gsm8k.judge import (
    API_KEY_VAR,
    JUDGE_SERVER,
    MODEL_VAR,
    URL_VAR,
    VERIFY_TIMEOUT_VAR,
    judge_settings,
    refuse_judge_through_bridge,
    verify_timeout_s,
)

SAFETY_S = 120  # guards against hangs only
JUDGE = {URL_VAR: "http://judge.internal:8000/v1", MODEL_VAR: "judge-model"}


def test_the_judge_is_off_by_default() -> None:
    assert judge_settings({}) is None
    assert judge_settings({URL_VAR: " ", MODEL_VAR: "", API_KEY_VAR: ""}) is None  # empty is unset
    for definition in plugin.definitions(judge_settings({})):
        resources = definition.servers[0]
        assert resources.config["should_use_judge"] is False
        assert JUDGE_SERVER not in {server.name for server in definition.servers}


def test_naming_an_endpoint_turns_it_on_for_both_environments() -> None:
    settings = judge_settings({**JUDGE, URL_VAR: " http://judge.internal:8000/v1/ "})
    assert settings == JudgeEndpoint(
        base_url="http://judge.internal:8000/v1", model="judge-model", api_key_variable=API_KEY_VAR
    )
    for definition in plugin.definitions(settings):
        servers = {server.name: server for server in definition.servers}
        resources = servers[definition.servers[0].name]
        assert resources.config["should_use_judge"] is True
        assert resources.config["judge_model_server"] == {
            "type": "responses_api_models",
            "name": JUDGE_SERVER,
        }
        judge = servers[JUDGE_SERVER]
        assert (judge.kind, judge.implementation) == ("responses_api_models", "openai_model")
        assert judge.config["openai_base_url"] == "http://judge.internal:8000/v1"
        assert judge.config["openai_model"] == "judge-model"


def test_both_environments_share_one_judge_server() -> None:
    settings = judge_settings(JUDGE)
    names = [server.name for server in servers_of(plugin.definitions(settings))]
    assert sorted(names) == sorted(
        [plugin.GSM8K_RESOURCES, plugin.GSM8K_AGENT, plugin.MATH_RESOURCES, plugin.MATH_AGENT, JUDGE_SERVER]
    )


def test_the_api_key_never_enters_the_definition(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(URL_VAR, JUDGE[URL_VAR])
    monkeypatch.setenv(MODEL_VAR, JUDGE[MODEL_VAR])
    monkeypatch.setenv(API_KEY_VAR, "sk-judge-secret")
    hooks = plugin_hooks("gsm8k", plugin)
    everything = repr([hooks.environments.get(name) for name in plugin.ENVIRONMENTS])
    assert "sk-judge-secret" not in everything
    assert f"${{oc.env:{API_KEY_VAR},EMPTY}}" in everything  # resolved inside the judge's own process


REFUSED = {
    "a trial's bridge route": (
        {**JUDGE, URL_VAR: "http://127.0.0.1:28100/ng-rollout/abc-0/v1"},
        "is a trial's model-call route on the relax-gym gateway",
    ),
    "no model": ({URL_VAR: JUDGE[URL_VAR]}, f"{URL_VAR} is set but {MODEL_VAR} is not"),
    "a model but no endpoint": ({MODEL_VAR: "judge-model"}, f"{MODEL_VAR} is set but {URL_VAR} is not"),
    "a model and an empty URL": ({**JUDGE, URL_VAR: ""}, f"{MODEL_VAR} is set but {URL_VAR} is not"),
    "not http": ({**JUDGE, URL_VAR: "judge.internal:8000"}, "must be an http(s) URL with a host"),
    "no host": ({**JUDGE, URL_VAR: "http:///v1"}, "must be an http(s) URL with a host"),
    "credentials": ({**JUDGE, URL_VAR: "http://user:pw@judge:99999/v1"}, "must not carry credentials"),
    "query": ({**JUDGE, URL_VAR: "http://judge/v1?key=1"}, "without query or fragment"),
    "bad port": ({**JUDGE, URL_VAR: "http://judge:99999/v1"}, "is not a URL"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_configurations_name_the_variable(case: str) -> None:
    environ, message = REFUSED[case]
    with pytest.raises(ConfigError) as caught:
        judge_settings(environ)
    assert str(caught.value).startswith("math judge: "), str(caught.value)
    assert message in str(caught.value)
    if case == "credentials":
        assert "pw" not in str(caught.value)  # a password is never echoed


def test_a_judge_on_policy_model_is_refused() -> None:
    config = {
        "should_use_judge": True,
        "judge_model_server": {"type": "responses_api_models", "name": "policy_model"},
    }
    with pytest.raises(
        ConfigError, match="its model server is 'policy_model', which is the relax-gym gateway"
    ):
        refuse_judge_through_bridge(config)
    refuse_judge_through_bridge({**config, "should_use_judge": False})  # off: never called, allowed


@pytest.mark.e2e  # the real CLI
@pytest.mark.parametrize("command", [["plugins"], ["up", "gsm8k", "--port", "0"]])
def test_the_cli_stops_with_one_line_before_starting_anything(command: list[str]) -> None:
    environ = {URL_VAR: "http://127.0.0.1:28100/ng-rollout/abc-0/v1", MODEL_VAR: "m"}
    result = run_cli(*command, env=environ, timeout_s=SAFETY_S)
    assert result.returncode == 2
    assert result.stderr.startswith("relax-gym: error: math judge: ")
    assert "Traceback" not in result.stderr
    assert "starting NeMo Gym servers" not in result.stderr + result.stdout


def test_the_verify_bound_is_upstreams_unless_the_operator_sets_one() -> None:
    assert verify_timeout_s({}) is None and verify_timeout_s({VERIFY_TIMEOUT_VAR: " "}) is None
    for definition in plugin.definitions(judge_settings({}), verify_timeout_s({})):
        assert "library_verifier_timeout_seconds" not in definition.servers[0].config  # upstream's 10 s
    for definition in plugin.definitions(judge_settings({}), verify_timeout_s({VERIFY_TIMEOUT_VAR: "45"})):
        assert definition.servers[0].config["library_verifier_timeout_seconds"] == 45.0
    for bad in ("0", "-1", "nan", "inf", "ten"):
        with pytest.raises(ConfigError, match=f"^{VERIFY_TIMEOUT_VAR}='{bad}' must be a positive number"):
            verify_timeout_s({VERIFY_TIMEOUT_VAR: bad})
