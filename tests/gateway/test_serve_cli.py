"""`relax-gym serve` as a real process: startup errors are one clear line, and the real server answers."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from relax_gym_core.gateway.server import bind
from relax_gym_core.testing.web import start_gateway


def serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("NEMO_GYM_")}
    environ["NEMO_GYM_CALLBACK_ALLOWED_NETWORKS"] = "127.0.0.1/32"
    return subprocess.run(
        [sys.executable, "-m", "relax_gym_core.cli", "serve", "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**environ, **(env or {})},
        check=False,
    )


@pytest.mark.parametrize(
    ("specs", "needle"),
    [
        (
            {"echo": {"environment": "echo", "runtime": "echo", "max_concurency": 2}},
            "unknown key 'max_concurency'",
        ),
        (
            {"echo": {"environment": "echo", "runtime": "echo", "max_concurrency": 0}},
            "max_concurrency must be",
        ),
        ({"echo": {"environment": "echo", "runtime": "warp"}}, "runtime 'warp' is not available"),
        ({"x": {"environment": "x", "agent_url": "ftp://h"}}, "agent_url must be an absolute http(s) URL"),
        ({}, "non-empty JSON object"),
    ],
)
def test_bad_environment_file_is_a_clear_startup_error(tmp_path: Path, specs: object, needle: str) -> None:
    spec_file = tmp_path / "envs.json"
    spec_file.write_text(json.dumps(specs))
    result = serve("--environments", str(spec_file))
    assert result.returncode != 0
    assert needle in result.stderr
    assert str(spec_file) in result.stderr or "runtime" in needle
    assert "Traceback" not in result.stderr


def test_environment_variable_source_is_named() -> None:
    result = serve(env={"NEMO_GYM_GATEWAY_ENVIRONMENTS_JSON": "{oops"})
    assert result.returncode != 0
    assert "NEMO_GYM_GATEWAY_ENVIRONMENTS_JSON: not valid JSON" in result.stderr
    missing = serve()
    assert missing.returncode != 0
    assert "NEMO_GYM_GATEWAY_ENVIRONMENTS_JSON is not set" in missing.stderr
    assert "Traceback" not in missing.stderr + result.stderr


@pytest.mark.parametrize(
    ("networks", "needle"),
    [
        ("", "At least one exact callback hostname or CIDR network must be configured"),
        ("0.0.0.0/0", "default-route"),
        ("10.0.0.1/8", "not a strict CIDR network"),
    ],
)
def test_callback_allowlist_is_required_and_strict(tmp_path: Path, networks: str, needle: str) -> None:
    spec_file = tmp_path / "envs.json"
    spec_file.write_text(json.dumps({"echo": {"environment": "echo", "runtime": "echo"}}))
    result = serve("--environments", str(spec_file), env={"NEMO_GYM_CALLBACK_ALLOWED_NETWORKS": networks})
    assert result.returncode != 0
    assert needle in result.stderr
    assert "Traceback" not in result.stderr


def test_real_server_on_port_zero_and_ipv6() -> None:
    echo = {"echo": {"environment": "echo", "runtime": "echo"}}
    with start_gateway(echo) as gateway:
        assert gateway.url.startswith("http://127.0.0.1:")
        assert httpx.get(f"{gateway.url}/readyz").json()["ready"] is True
    with start_gateway(echo, host="::1") as gateway:
        assert gateway.url.startswith("http://[::1]:")
        assert httpx.get(f"{gateway.url}/healthz").status_code == 200


def test_served_socket_is_tcp_with_nodelay() -> None:
    # Without IPPROTO_TCP asyncio leaves Nagle on for accepted connections: +40 ms per answer.
    sock = bind("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        sock.close()


def test_a_port_in_use_leaves_no_socket_behind() -> None:
    held = bind("127.0.0.1", 0)
    port = held.getsockname()[1]
    before = set(os.listdir("/proc/self/fd"))
    try:
        with pytest.raises(OSError):
            bind("127.0.0.1", port)
        assert set(os.listdir("/proc/self/fd")) == before  # the failed socket was closed, not leaked
    finally:
        held.close()


@pytest.mark.parametrize(("inherited", "expected"), [("", 130), ("trap '' INT; ", 130), ("", 143)])
def test_a_signal_ends_serve_with_its_exit_status_even_when_sigint_was_ignored_at_start(
    tmp_path: Path, inherited: str, expected: int
) -> None:
    """A background job of a script (`relax-gym up ... &`) starts with SIGINT ignored: uvicorn still stops
    on it, but its re-raise of the signal did nothing and the gateway ended with 0."""
    spec_file = tmp_path / "envs.json"
    spec_file.write_text(json.dumps({"echo": {"environment": "echo", "runtime": "echo"}}))
    environ = {k: v for k, v in os.environ.items() if not k.startswith("NEMO_GYM_")}
    command = f"{inherited}exec {sys.executable} -m relax_gym_core.cli serve --port 0 --state-dir :memory: "
    with subprocess.Popen(  # a shell line of our own: `trap` sets what the job inherits
        ["/bin/sh", "-c", command + f"--environments {spec_file}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**environ, "NEMO_GYM_CALLBACK_ALLOWED_NETWORKS": "127.0.0.1/32"},
    ) as process:
        try:
            assert process.stdout is not None
            for line in process.stdout:
                if line.startswith("relax-gym gateway listening on"):
                    break
            process.send_signal(signal.SIGINT if expected == 130 else signal.SIGTERM)
            assert process.wait(timeout=60) == expected
        finally:
            if process.poll() is None:
                process.kill()
