"""The create request of a session: stable request id, routing, task, callback endpoint."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from relax_gym_core.client import (
    ClientConfigError,
    ClientSettings,
    build_create_request,
    read_session_input,
    stable_request_id,
)
from relax_gym_core.protocol import PROTOCOL_VERSION, InterruptPolicy, request_to_wire


@pytest.fixture
def settings(environ_for: Any) -> Any:
    def make(**extra: str) -> ClientSettings:
        return ClientSettings.from_env(environ_for("http://gw:1", "/tmp/relax-agentic-command-a", **extra))

    return make


def test_request_id_formula_and_stability() -> None:
    expected = "relax-" + hashlib.sha256(b"/tmp/io\0sess-1\x002").hexdigest()
    assert stable_request_id("sess-1", 2, invocation_id="/tmp/io") == expected
    assert stable_request_id("sess-1", 2, invocation_id="/tmp/io") == expected
    assert stable_request_id("sess-1", 1) == "relax-" + hashlib.sha256(b"sess-1\x001").hexdigest()


def test_request_id_hides_the_session_and_varies_with_attempt_and_launch(session_id: str) -> None:
    first = stable_request_id(session_id, 1, invocation_id="/tmp/a")
    assert session_id not in first
    assert "session-" not in first
    assert stable_request_id(session_id, 2, invocation_id="/tmp/a") != first
    assert stable_request_id(session_id, 1, invocation_id="/tmp/b") != first  # Relax relaunch: new IO dir
    assert stable_request_id(session_id + "x", 1, invocation_id="/tmp/a") != first


def test_request_from_session_input(settings: Any, session_id: str) -> None:
    config = settings(
        NEMO_GYM_MODEL="policy",
        NEMO_GYM_ATTEMPT="2",
        NEMO_GYM_DEADLINE_S="120",
        NEMO_GYM_LEASE_S="9",
        NEMO_GYM_SAMPLING_PARAMS='{"temperature": 0.7}',
        NEMO_GYM_RESPONSES_CREATE_PARAMS='{"max_output_tokens": 32}',
    )
    session_input = {"messages": [{"role": "user", "content": "2+2?"}], "metadata": {"answer": "4"}}
    request = build_create_request(session_input, config)

    assert request.protocol_version == PROTOCOL_VERSION
    assert request.request_id == stable_request_id(
        session_id, 2, invocation_id="/tmp/relax-agentic-command-a"
    )
    assert (request.session.session_id, request.session.group_id) == (session_id, "train:prepare_group_7")
    assert (request.session.rollout_mode, request.session.attempt) == ("train", 2)
    assert (request.environment.name, request.environment.config) == ("echo", "echo")
    assert request.environment.task == session_input
    assert request.model_endpoint.base_url == "http://127.0.0.1:9/agentic_api"
    assert request.model_endpoint.api_key == session_id  # the session id is the callback credential
    assert request.model_endpoint.model == "policy"
    assert request.generation.sampling_params == {"temperature": 0.7}
    assert request.generation.responses_create_params == {"max_output_tokens": 32}
    assert request.interrupt_policy is InterruptPolicy.PROTECTED
    assert (request.deadline_s, request.lease_s) == (120.0, 9.0)
    assert request.metadata == {"integration": "relax"}

    session_input["messages"].append({"role": "user", "content": "mutated"})
    assert len(request.environment.task["messages"]) == 1  # the task is a copy

    wire = request_to_wire(request)
    assert set(wire["model_endpoint"]) == {"base_url", "api_key", "model"}  # reference serialisation
    assert session_id not in repr(request)


@pytest.mark.parametrize(
    ("metadata", "env", "expected"),
    [
        ({}, {}, ("echo", "echo")),
        ({}, {"NEMO_GYM_CONFIG": "echo_cfg"}, ("echo", "echo_cfg")),
        ({"environment": "math"}, {"NEMO_GYM_CONFIG": "echo_cfg"}, ("math", "echo_cfg")),
        ({"environment": "math"}, {}, ("math", "math")),
        ({"environment": "math", "config": "math_v2"}, {"NEMO_GYM_CONFIG": "x"}, ("math", "math_v2")),
        ({"environment": "", "config": None}, {}, ("echo", "echo")),
    ],
)
def test_routing_row_metadata_wins(
    settings: Any, metadata: dict[str, Any], env: dict[str, str], expected: tuple[str, str]
) -> None:
    request = build_create_request({"messages": [], "metadata": metadata}, settings(**env))
    assert (request.environment.name, request.environment.config) == expected


def test_routing_needs_an_environment(settings: Any) -> None:
    with pytest.raises(ClientConfigError, match="NEMO_GYM_ENVIRONMENT must be set"):
        build_create_request({"messages": []}, settings(NEMO_GYM_ENVIRONMENT=""))
    request = build_create_request(
        {"messages": [], "metadata": {"environment": "math"}}, settings(NEMO_GYM_ENVIRONMENT="")
    )
    assert request.environment.name == "math"


def test_non_string_route_is_refused_not_ignored(settings: Any) -> None:
    with pytest.raises(ClientConfigError, match=r"metadata.environment must be a non-empty string"):
        build_create_request({"messages": [], "metadata": {"environment": {"name": "math"}}}, settings())


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[]", "RELAX_INPUT_JSON must contain a JSON object"),
        ('{"metadata": {}}', "RELAX_INPUT_JSON must contain a messages array"),
        ('{"messages": "hi"}', "RELAX_INPUT_JSON must contain a messages array"),
        ('{"messages": [], "metadata": []}', "RELAX_INPUT_JSON metadata must be a JSON object"),
        ('{"messages": [', "RELAX_INPUT_JSON must contain valid JSON"),
        ('{"messages": [], "x": NaN}', "RELAX_INPUT_JSON must contain valid JSON with finite numbers"),
    ],
)
def test_session_input_shape(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "session_input.json"
    path.write_text(content)
    with pytest.raises(ClientConfigError, match=message):
        read_session_input(path)


def test_session_input_read(tmp_path: Path) -> None:
    path = tmp_path / "session_input.json"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "é"}]}))
    assert read_session_input(path) == {"messages": [{"role": "user", "content": "é"}]}
    with pytest.raises(ClientConfigError, match="RELAX_INPUT_JSON cannot be read"):
        read_session_input(tmp_path / "missing.json")
