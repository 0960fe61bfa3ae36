"""The real `relax-gym-client` process as Relax runs it: env vars in, output file and exit code out."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from relax_gym_core.client import stable_request_id
from relax_gym_core.testing.web import GatewayProcess, start_gateway

SAFETY_S = 60  # guards against hangs only
CONSOLE_SCRIPT = Path(sys.executable).with_name("relax-gym-client")
MODULE = [sys.executable, "-m", "relax_gym_core.client"]


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    spec = {"echo": {"environment": "echo", "runtime": "echo", "max_concurrency": 4, "queue_capacity": 4}}
    with start_gateway(spec) as process:
        yield process


@pytest.fixture
def session(tmp_path: Path, environ_for: Any) -> Any:
    """A Relax-like session dir with its input file; returns (environ, io_dir)."""

    def make(echo: dict[str, Any], gateway_url: str) -> tuple[dict[str, str], Path]:
        io_dir = tmp_path / "relax-agentic-command-1"
        io_dir.mkdir()
        (io_dir / "session_input.json").write_text(
            json.dumps({"messages": [{"role": "user", "content": "hi"}], "metadata": {"echo": echo}})
        )
        base = {k: v for k, v in os.environ.items() if not k.startswith(("RELAX_", "NEMO_GYM_", "OPENAI_"))}
        environ = {
            **base,
            **environ_for(gateway_url, str(io_dir), NEMO_GYM_POLL_INTERVAL_S="0.05"),
            "RELAX_INPUT_JSON": str(io_dir / "session_input.json"),
            "RELAX_OUTPUT_JSON": str(io_dir / "session_output.json"),
        }
        return environ, io_dir

    return make


def run_client(command: list[str], environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, env=environ, capture_output=True, text=True, timeout=SAFETY_S, check=False)


def test_success_writes_the_output_file(gateway: GatewayProcess, session: Any, session_id: str) -> None:
    environ, io_dir = session({"reward": 0.5}, gateway.url)
    result = run_client(MODULE, environ)
    assert (result.returncode, result.stderr, result.stdout) == (0, "", "")
    output = json.loads((io_dir / "session_output.json").read_text())
    assert output["metadata"]["nemo_gym"].pop("cleanup") in ("pending", "confirmed")
    request_id = stable_request_id(session_id, 1, invocation_id=str(io_dir))
    assert output == {
        "reward": 0.5,
        "metadata": {
            "nemo_gym": {
                "request_id": request_id,
                "status": "completed",
                "metrics": {"echo": True},
                "artifact_ref": f"/v1/trials/{request_id}/trajectory",  # the gateway kept its trajectory
            },
            "rollout_stop_reason": "completed",
            # The trajectory's counts, as numbers Relax logs as metrics (this echo trial asked no model).
            **dict.fromkeys(("model_calls", "answered_calls", "tool_calls", "tool_outputs"), 0),
            **dict.fromkeys(("input_tokens", "output_tokens"), 0),
        },
    }
    assert sorted(p.name for p in io_dir.iterdir()) == ["session_input.json", "session_output.json"]


def test_explicit_paths_override_the_variables(gateway: GatewayProcess, session: Any, tmp_path: Path) -> None:
    environ, io_dir = session({"reward": 0.25}, gateway.url)
    environ["RELAX_INPUT_JSON"] = str(tmp_path / "missing.json")
    target = tmp_path / "elsewhere.json"
    command = [*MODULE, "--input-json", str(io_dir / "session_input.json"), "--output-json", str(target)]
    result = run_client(command, environ)
    assert result.returncode == 0, result.stderr
    assert json.loads(target.read_text())["reward"] == 0.25


@pytest.mark.parametrize(
    ("echo", "message"),
    [
        ({"fail": True}, "relax-gym-client: Remote trial failed with error code 'agent_error'"),
        ({"reward": None}, "relax-gym-client: NeMo Gym trial has no reward: request_id=relax-"),
    ],
)
def test_unexportable_trials_exit_1_with_one_line(
    gateway: GatewayProcess, session: Any, session_id: str, echo: dict[str, Any], message: str
) -> None:
    environ, io_dir = session(echo, gateway.url)
    result = run_client(MODULE, environ)
    assert result.returncode == 1
    assert result.stderr.startswith(message)
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr
    assert session_id not in result.stderr + result.stdout
    assert not (io_dir / "session_output.json").exists()


def test_configuration_error_names_the_variable(session: Any) -> None:
    environ, io_dir = session({}, "http://127.0.0.1:9")
    environ["NEMO_GYM_LEASE_S"] = "soon"
    result = run_client(MODULE, environ)
    assert (result.returncode, result.stderr) == (
        1,
        "relax-gym-client: NEMO_GYM_LEASE_S must be a positive finite number (got 'soon')\n",
    )
    del environ["NEMO_GYM_URL"]
    result = run_client(MODULE, environ)
    assert result.stderr == "relax-gym-client: NEMO_GYM_URL must point to the shared NeMo Gym gateway\n"
    assert not (io_dir / "session_output.json").exists()


def test_unreachable_gateway_fails_cleanly(session: Any, session_id: str) -> None:
    # Refused connections are retried until the startup timeout (a gateway may be restarting).
    environ, io_dir = session({}, "http://127.0.0.1:9")
    environ.update(NEMO_GYM_RETRY_BACKOFF_S="0", NEMO_GYM_STARTUP_TIMEOUT_S="2")
    result = run_client(MODULE, environ)
    assert result.returncode == 1
    assert re.fullmatch(
        r"relax-gym-client: Gateway create request failed after \d+ attempts \(ConnectError\)\n",
        result.stderr,
    )
    assert not (io_dir / "session_output.json").exists()


def wait_for_status(
    gateway_url: str, request_id: str, wanted: set[str], process: Any = None
) -> dict[str, Any]:
    deadline = time.monotonic() + SAFETY_S
    with httpx.Client(base_url=gateway_url, trust_env=False) as http:
        while True:
            response = http.get(f"/v1/trials/{request_id}")
            if response.status_code == 200 and response.json()["status"] in wanted:
                body: dict[str, Any] = response.json()
                return body
            if process is not None and process.poll() is not None:
                pytest.fail(f"client exited early: {process.communicate()}")
            assert time.monotonic() < deadline, response.text
            time.sleep(0.05)


def test_sigterm_aborts_the_remote_trial(gateway: GatewayProcess, session: Any, session_id: str) -> None:
    environ, io_dir = session({"sleep_s": 300}, gateway.url)
    command = [str(CONSOLE_SCRIPT)] if CONSOLE_SCRIPT.exists() else MODULE
    request_id = stable_request_id(session_id, 1, invocation_id=str(io_dir))
    process = subprocess.Popen(
        command, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for_status(gateway.url, request_id, {"running"}, process)
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=SAFETY_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 128 + signal.SIGTERM
    assert stderr == "relax-gym-client: Managed session cancelled; remote trial abort requested\n"
    assert session_id not in stdout + stderr
    assert not (io_dir / "session_output.json").exists()
    final = wait_for_status(gateway.url, request_id, {"completed", "truncated", "aborted", "failed"})
    assert (final["status"], final["error"]) == ("aborted", {"code": "aborted"})


def test_client_imports_no_server_code() -> None:
    code = (
        "import sys, relax_gym_core.client, relax_gym_core.client.main\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('starlette', 'uvicorn')"
        " or m.startswith('relax_gym_core.gateway') or m.startswith('relax_gym_core.trials'))\n"
        "print(','.join(bad))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == ""


def test_a_gateway_with_an_api_token(session: Any) -> None:
    """`relax-gym serve` and `relax-gym-client` read the same RELAX_GYM_API_TOKEN; without it the client says
    what is missing, never the token."""
    token = "shared-api-token-0123456789"
    spec = {"echo": {"environment": "echo", "runtime": "echo", "max_concurrency": 2, "queue_capacity": 2}}
    with start_gateway(spec, env={"RELAX_GYM_API_TOKEN": token}) as guarded:
        environ, io_dir = session({"reward": 0.25}, guarded.url)
        refused = run_client(MODULE, environ)
        assert refused.returncode != 0
        assert "HTTP 401" in refused.stderr and "RELAX_GYM_API_TOKEN" in refused.stderr
        assert "Traceback" not in refused.stderr
        assert not (io_dir / "session_output.json").exists()
        accepted = run_client(MODULE, {**environ, "RELAX_GYM_API_TOKEN": token})
        assert (accepted.returncode, accepted.stderr) == (0, "")
        assert json.loads((io_dir / "session_output.json").read_text())["reward"] == 0.25
        for output in (refused.stdout, refused.stderr, accepted.stdout, *guarded.output):
            assert token not in output
