"""ClientSettings.from_env: every reference variable, its default and its validation message."""

from __future__ import annotations

from typing import Any

import pytest

from relax_gym_core.client import ClientConfigError, ClientOptions, ClientSettings
from relax_gym_core.errors import ClientError
from relax_gym_core.protocol import InterruptPolicy


@pytest.fixture
def base_env(environ_for: Any) -> dict[str, str]:
    env: dict[str, str] = environ_for("http://gw.example:28100/", "/tmp/relax-agentic-command-x")
    del env["RELAX_GROUP_ID"]
    return env


def test_defaults_match_the_reference(base_env: dict[str, str], session_id: str) -> None:
    settings = ClientSettings.from_env(base_env)
    assert settings.gateway_url == "http://gw.example:28100"  # trailing slash stripped
    assert settings.base_url == "http://127.0.0.1:9/agentic_api"
    assert settings.session_id == session_id
    assert settings.session_io_dir == "/tmp/relax-agentic-command-x"
    assert (settings.group_id, settings.rollout_mode) == ("unknown", "train")
    assert (settings.environment, settings.config, settings.model) == ("echo", None, "model")
    assert settings.attempt == 1
    assert settings.responses_create_params == {}
    assert settings.sampling_params == {}
    assert settings.interrupt_policy is InterruptPolicy.PROTECTED
    assert (settings.deadline_s, settings.lease_s) == (1800.0, 60.0)
    assert settings.options == ClientOptions(
        startup_timeout_s=30.0,
        request_timeout_s=30.0,
        poll_interval_s=1.0,
        abort_timeout_s=2.0,
        retry_backoff_s=0.25,
        max_retries=2,
    )


def test_every_variable_is_read(base_env: dict[str, str]) -> None:
    env = {
        **base_env,
        "RELAX_GROUP_ID": "eval:gsm8k:3:prepare_group_1",
        "RELAX_ROLLOUT_MODE": "eval",
        "NEMO_GYM_CONFIG": "echo_cfg",
        "NEMO_GYM_MODEL": "policy",
        "OPENAI_MODEL": "ignored",
        "NEMO_GYM_ATTEMPT": "3",
        "NEMO_GYM_RESPONSES_CREATE_PARAMS": '{"max_output_tokens": 64}',
        "NEMO_GYM_SAMPLING_PARAMS": '{"temperature": 0.5}',
        "NEMO_GYM_INTERRUPT_POLICY": "resumable",
        "NEMO_GYM_DEADLINE_S": "90",
        "NEMO_GYM_LEASE_S": "7.5",
        "NEMO_GYM_STARTUP_TIMEOUT_S": "11",
        "NEMO_GYM_REQUEST_TIMEOUT_S": "12",
        "NEMO_GYM_POLL_INTERVAL_S": "0.2",
        "NEMO_GYM_ABORT_TIMEOUT_S": "1.5",
        "NEMO_GYM_RETRY_BACKOFF_S": "0",
        "NEMO_GYM_MAX_RETRIES": "0",
    }
    settings = ClientSettings.from_env(env)
    assert (settings.group_id, settings.rollout_mode) == ("eval:gsm8k:3:prepare_group_1", "eval")
    assert (settings.config, settings.model, settings.attempt) == ("echo_cfg", "policy", 3)
    assert settings.responses_create_params == {"max_output_tokens": 64}
    assert settings.sampling_params == {"temperature": 0.5}
    assert settings.interrupt_policy is InterruptPolicy.RESUMABLE
    assert (settings.deadline_s, settings.lease_s) == (90.0, 7.5)
    assert settings.options == ClientOptions(
        startup_timeout_s=11.0,
        request_timeout_s=12.0,
        poll_interval_s=0.2,
        abort_timeout_s=1.5,
        retry_backoff_s=0.0,
        max_retries=0,
    )


def test_model_falls_back_to_openai_model(base_env: dict[str, str]) -> None:
    assert ClientSettings.from_env({**base_env, "OPENAI_MODEL": "qwen"}).model == "qwen"
    assert ClientSettings.from_env({**base_env, "NEMO_GYM_MODEL": "", "OPENAI_MODEL": "qwen"}).model == "qwen"


def test_empty_optional_values_count_as_unset(base_env: dict[str, str]) -> None:
    env = {**base_env, "NEMO_GYM_DEADLINE_S": "", "NEMO_GYM_CONFIG": " ", "RELAX_ROLLOUT_MODE": ""}
    settings = ClientSettings.from_env(env)
    assert (settings.deadline_s, settings.config, settings.rollout_mode) == (1800.0, None, "train")


@pytest.mark.parametrize(
    "name", ["NEMO_GYM_URL", "RELAX_SESSION_ID", "RELAX_SESSION_IO_DIR", "RELAX_BASE_URL"]
)
def test_required_variables(base_env: dict[str, str], name: str) -> None:
    for missing in ({k: v for k, v in base_env.items() if k != name}, {**base_env, name: "  "}):
        with pytest.raises(ClientConfigError, match=f"^{name} must"):
            ClientSettings.from_env(missing)


POSITIVE = [
    "NEMO_GYM_DEADLINE_S",
    "NEMO_GYM_LEASE_S",
    "NEMO_GYM_STARTUP_TIMEOUT_S",
    "NEMO_GYM_REQUEST_TIMEOUT_S",
    "NEMO_GYM_POLL_INTERVAL_S",
    "NEMO_GYM_ABORT_TIMEOUT_S",
]


@pytest.mark.parametrize("name", POSITIVE)
@pytest.mark.parametrize("raw", ["x", "0", "-1", "nan", "inf"])
def test_positive_numbers(base_env: dict[str, str], name: str, raw: str) -> None:
    with pytest.raises(ClientConfigError) as caught:
        ClientSettings.from_env({**base_env, name: raw})
    assert str(caught.value) == f"{name} must be a positive finite number (got {raw!r})"


@pytest.mark.parametrize("raw", ["x", "-0.1", "nan"])
def test_backoff_must_be_non_negative(base_env: dict[str, str], raw: str) -> None:
    with pytest.raises(ClientConfigError, match=r"^NEMO_GYM_RETRY_BACKOFF_S must be a non-negative finite"):
        ClientSettings.from_env({**base_env, "NEMO_GYM_RETRY_BACKOFF_S": raw})


@pytest.mark.parametrize(
    ("name", "raw", "minimum"),
    [
        ("NEMO_GYM_MAX_RETRIES", "-1", 0),
        ("NEMO_GYM_MAX_RETRIES", "1.5", 0),
        ("NEMO_GYM_MAX_RETRIES", "two", 0),
        ("NEMO_GYM_ATTEMPT", "0", 1),
        ("NEMO_GYM_ATTEMPT", "true", 1),
        ("NEMO_GYM_ATTEMPT", "1e3", 1),
    ],
)
def test_integers(base_env: dict[str, str], name: str, raw: str, minimum: int) -> None:
    with pytest.raises(ClientConfigError) as caught:
        ClientSettings.from_env({**base_env, name: raw})
    assert str(caught.value) == f"{name} must be an integer >= {minimum} (got {raw!r})"


@pytest.mark.parametrize("name", ["NEMO_GYM_RESPONSES_CREATE_PARAMS", "NEMO_GYM_SAMPLING_PARAMS"])
@pytest.mark.parametrize("raw", ["[1]", '"text"', "{not json", '{"t": NaN}', '{"api_key": "sk-live'])
def test_json_objects(base_env: dict[str, str], name: str, raw: str) -> None:
    with pytest.raises(ClientConfigError, match=f"^{name} must contain a JSON object") as caught:
        ClientSettings.from_env({**base_env, name: raw})
    assert "sk-live" not in str(caught.value)  # the value may hold credentials: never echoed


def test_interrupt_policy_enum(base_env: dict[str, str]) -> None:
    with pytest.raises(ClientConfigError) as caught:
        ClientSettings.from_env({**base_env, "NEMO_GYM_INTERRUPT_POLICY": "polite"})
    assert str(caught.value) == (
        "NEMO_GYM_INTERRUPT_POLICY must be one of protected, interruptible, resumable (got 'polite')"
    )


@pytest.mark.parametrize("name", ["NEMO_GYM_URL", "RELAX_BASE_URL"])
@pytest.mark.parametrize("raw", ["gw:28100", "ftp://gw", "http://", "http://gw:99999", "http://gw/?q=1"])
def test_urls(base_env: dict[str, str], name: str, raw: str) -> None:
    with pytest.raises(ClientConfigError, match=f"^{name} must"):
        ClientSettings.from_env({**base_env, name: raw})


def test_callback_url_with_credentials_is_refused_without_echo(base_env: dict[str, str]) -> None:
    with pytest.raises(ClientConfigError) as caught:
        ClientSettings.from_env({**base_env, "RELAX_BASE_URL": "http://user:hunter2@relax:8000/agentic_api"})
    assert str(caught.value) == "RELAX_BASE_URL must not contain user info"


def test_errors_are_client_and_value_errors(base_env: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="NEMO_GYM_LEASE_S") as caught:
        ClientSettings.from_env({**base_env, "NEMO_GYM_LEASE_S": "soon"})
    assert isinstance(caught.value, ClientError)


def test_session_id_is_not_in_repr(base_env: dict[str, str], session_id: str) -> None:
    settings = ClientSettings.from_env(base_env)
    assert session_id not in repr(settings)
    assert "session-0123" not in str(settings)


def test_options_validate_direct_construction() -> None:
    with pytest.raises(ClientConfigError, match="poll_interval_s must be a positive finite number"):
        ClientOptions(poll_interval_s=0)
    with pytest.raises(ClientConfigError, match="max_retries must be an integer >= 0"):
        ClientOptions(max_retries=-1)


def test_api_token_is_read_checked_and_kept_out_of_reprs(base_env: dict[str, str]) -> None:
    assert ClientSettings.from_env(base_env).api_token is None
    settings = ClientSettings.from_env({**base_env, "RELAX_GYM_API_TOKEN": "tok-0123456789abcdef"})
    assert settings.api_token == "tok-0123456789abcdef"
    assert "tok-0123456789abcdef" not in repr(settings)
    with pytest.raises(ClientConfigError, match="RELAX_GYM_API_TOKEN must be visible ASCII") as caught:
        ClientSettings.from_env({**base_env, "RELAX_GYM_API_TOKEN": "two words"})
    assert "two words" not in str(caught.value)
