"""What a user gets wrong, and what `relax-gym rollout` says: one line naming what and where, exit 2, no
traceback, and --out left exactly as it was (not even created) — checked before any trial starts."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from pathlib import Path

import pytest

from relax_gym_core.cli import main
from relax_gym_core.errors import ConfigError
from relax_gym_core.gym.processes import free_ports
from relax_gym_core.plugin.host import make_plugin_manager
from relax_gym_core.rollout.engine import check_gateway
from relax_gym_core.testing.web import GatewayProcess, ScriptedPolicy

from .conftest import echo_row, relax_gym, write_rows

pytestmark = pytest.mark.e2e  # real gateway and policy servers


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run `relax-gym rollout ...` in this process; the one line it printed on refusing."""
    assert main(["rollout", *argv]) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    lines = [line for line in captured.err.splitlines() if line.startswith("relax-gym: error:")]
    assert len(lines) == 1, captured.err
    return lines[0]


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return write_rows(tmp_path / "data.jsonl", [echo_row("a", reward=1.0), echo_row("b", reward=0.0)])


def test_unknown_environment_lists_the_installed_ones(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    line = refused(capsys, "no_such_env", "--data", str(data), "--policy", "oracle", "--out", str(out))
    installed = sorted(definition.name for definition in make_plugin_manager().environments)
    assert "'no_such_env'" in line
    assert all(name in line for name in installed) and "echo" in line
    assert not out.exists()


def test_a_bad_data_line_is_named_by_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text('{"input": [], "metadata": {}}\n\n{"input": [], "metadata": {}\n')
    out = tmp_path / "out"
    line = refused(capsys, "echo", "--data", str(data), "--policy", "oracle", "--out", str(out))
    assert f"{data}:3" in line
    data.write_text('{"input": [], "metadata": {}}\n{"messages": []}\n')
    line = refused(capsys, "echo", "--data", str(data), "--policy", "oracle", "--out", str(out))
    assert f"{data}:2: not a Relax row" in line
    assert not out.exists()


def test_an_unreachable_policy_is_found_before_any_trial(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (port,) = free_ports(1)
    out = tmp_path / "out"
    url = f"http://127.0.0.1:{port}/v1"
    line = refused(capsys, "echo", "--data", str(data), "--policy", url, "--out", str(out))
    assert f"cannot reach the policy at {url}" in line
    assert not out.exists()


def test_a_server_that_is_no_model_api_is_refused(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    with ScriptedPolicy() as server:  # its root is no API: only /agentic_api is
        url = server.url
        line = refused(capsys, "echo", "--data", str(data), "--policy", url, "--out", str(out))
    assert f"{url} is not an OpenAI- or Anthropic-compatible API" in line
    assert "/v1/models answered HTTP 404" in line
    assert not out.exists()


def test_a_port_in_use_is_named(tmp_path: Path, data: Path, policy: ScriptedPolicy) -> None:
    out = tmp_path / "out"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = relax_gym(
            "rollout", "echo", "--data", str(data), "--policy", policy.base_url, "--port", str(port),
            "--out", str(out),
        )  # fmt: skip
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(f"relax-gym: error: cannot listen on 127.0.0.1:{port}")
    )
    assert "Traceback" not in result.stderr
    assert not out.exists()


def test_a_missing_nemo_gym_environment_says_how_to_create_it(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    policy: ScriptedPolicy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("relax_gym_workplace")
    monkeypatch.setenv("RELAX_GYM_NEMO_GYM_PYTHON", str(tmp_path / "no-such-python"))
    data = write_rows(
        tmp_path / "data.jsonl", [{"input": [{"role": "user", "content": "hi"}], "metadata": {}}]
    )
    out = tmp_path / "out"
    line = refused(
        capsys, "workplace_assistant", "--data", str(data), "--policy", policy.base_url, "--out", str(out)
    )
    assert "NeMo Gym environment not found" in line and "make gym" in line
    assert not out.exists()


def test_an_out_holding_another_data_run_is_refused_and_left_alone(
    tmp_path: Path,
    data: Path,
    capsys: pytest.CaptureFixture[str],
    policy: ScriptedPolicy,
    echo_gateway: GatewayProcess,
) -> None:
    out = tmp_path / "out"
    common = ("--policy", policy.base_url, "--out", str(out), "--gateway", echo_gateway.url)
    assert main(["rollout", "echo", "--data", str(data), *common]) == 0
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    other = write_rows(tmp_path / "other.jsonl", [echo_row("c", reward=0.5), echo_row("b", reward=0.0)])
    line = refused(capsys, "echo", "--data", str(other), *common)
    assert f"--out {out} holds a run of different data: line 1 of {other}" in line
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before


def test_an_environment_the_gateway_does_not_serve_leaves_nothing_behind(
    tmp_path: Path,
    data: Path,
    capsys: pytest.CaptureFixture[str],
    policy: ScriptedPolicy,
    echo_gateway: GatewayProcess,
) -> None:
    out = tmp_path / "out"
    line = refused(
        capsys, "elsewhere", "--data", str(data), "--policy", policy.base_url, "--out", str(out),
        "--gateway", echo_gateway.url,
    )  # fmt: skip
    assert "elsewhere" in line and "nothing was run" in line
    assert not out.exists()


class _Readiness(http.server.BaseHTTPRequestHandler):
    """GET /readyz: 503 (with the gateway's reasons) for the first `not_ready` asks, then 200."""

    asked = 0
    not_ready = 0

    def do_GET(self) -> None:
        type(self).asked += 1
        ready = type(self).asked > type(self).not_ready
        body = json.dumps(
            {"ready": ready, "reasons": [] if ready else ["an environment runtime is not ready"]}
        )
        self.send_response(200 if ready else 503)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *_args: object) -> None:
        pass


@pytest.mark.parametrize("not_ready", [2, 10_000], ids=["ready-after-two", "never-ready"])
def test_a_gateway_not_ready_yet_is_waited_for_then_named(not_ready: int) -> None:
    handler = type("Readiness", (_Readiness,), {"asked": 0, "not_ready": not_ready})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        if not_ready == 2:  # a loaded host's servers missed two probes: the rollout goes on
            assert check_gateway(url, ready_wait_s=60) == url
            assert handler.asked == 3
        else:
            with pytest.raises(ConfigError, match="is not ready: an environment runtime is not ready"):
                check_gateway(url, ready_wait_s=1)
            assert handler.asked >= 2  # asked again before giving up
    finally:
        server.shutdown()
        server.server_close()
