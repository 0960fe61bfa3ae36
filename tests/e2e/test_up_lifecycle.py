"""`relax-gym up` stops every NeMo Gym server it started (by PID); unknown environments are a clear error."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from relax_gym_core.gym.processes import gym_python
from relax_gym_core.gym.release import nemo_gym_release, observability_wanted
from relax_gym_core.gym.spawn import FORK_SERVER_VAR
from relax_gym_core.testing.web import GatewayProcess, start_up

from ..replicas.support import parent_of

pytest.importorskip("relax_gym_workplace")

pytestmark = pytest.mark.e2e  # the real CLI
SAFETY_S = 120.0  # a bound for a hung test, not a timing assertion


def alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "State:\tZ" not in status  # a zombie has exited


OWN = pytest.mark.nemo_gym(env={FORK_SERVER_VAR: "1"})  # `up` starts its own fork server, as users run it


@pytest.mark.slow  # each test stops an `up` of its own (started early, while other tests run)
@pytest.mark.nemo_gym("workplace_assistant")
@pytest.mark.parametrize(
    ("stop", "fork_server"),
    [
        (signal.SIGINT, "shared"),
        pytest.param(signal.SIGTERM, "own", marks=OWN),
        pytest.param(signal.SIGKILL, "own", marks=OWN),
        (signal.SIGKILL, "shared"),
    ],
    ids=["ctrl-c", "sigterm", "kill-9", "kill-9-sharing"],
)
def test_up_serves_and_stops_everything_it_started(
    stop: signal.Signals, fork_server: str, relax_gym_fresh_up: GatewayProcess
) -> None:
    gateway = relax_gym_fresh_up
    pids = [int(pid) for pid in re.findall(r"\(pid (\d+)\)", "\n".join(gateway.output))]
    assert len(pids) == 2  # the resources server and the agent
    assert all(alive(pid) for pid in pids)
    assert all(os.getpgid(pid) == pid for pid in pids)  # each its own group: Ctrl-C reaches only `up`
    # Forked by `up`'s own fork server, or by this test process's, which `up` shares (the suite's way:
    # NeMo Gym imported once per test process).
    fork_servers = {parent_of(pid) for pid in pids}
    assert len(fork_servers) == 1
    (fork_server_pid,) = fork_servers
    assert "relax_gym_core.gym.forkserver" in Path(f"/proc/{fork_server_pid}/cmdline").read_text()
    assert parent_of(fork_server_pid) == (gateway.pid if fork_server == "own" else os.getpid())
    ready = httpx.get(f"{gateway.url}/readyz", trust_env=False, timeout=30).json()
    assert ready["ready"] is True  # readiness includes the servers' own liveness
    gateway.process.send_signal(stop)
    assert gateway.process.wait(timeout=120) != 0
    if stop == signal.SIGKILL:  # no clean-up code ran: the fork server sees `up` gone and stops them
        deadline = time.monotonic() + SAFETY_S
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
    assert not any(alive(pid) for pid in pids)
    if fork_server == "shared":  # ... and only them: the fork server serves this process and others on
        assert alive(fork_server_pid)


def test_unknown_environment_is_a_clear_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "relax_gym_core.cli", "up", "no_such_env", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "NEMO_GYM_CALLBACK_ALLOWED_NETWORKS": "127.0.0.1/32"},
    )
    assert result.returncode != 0
    assert "no installed plugin provides environment 'no_such_env'" in result.stderr
    assert "workplace_assistant" in result.stderr  # says what is installed
    assert "Traceback" not in result.stderr


@pytest.mark.slow  # an `up` of its own
def test_default_state_directories_let_one_gateway_per_recipe_run_side_by_side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RELAX_GYM_STATE_DIR", raising=False)  # the suite's own default (tests/conftest.py)
    env = {"XDG_DATA_HOME": str(tmp_path)}
    root = tmp_path / "relax-gym"
    # A workplace_assistant gateway with the default directory, and a calendar one beside it: no flag.
    with (
        start_up(["workplace_assistant"], env=env, state_dir=None),
        start_up(["calendar"], env=env, state_dir=None) as calendar,
    ):
        assert sorted(path.name for path in root.iterdir()) == ["calendar", "workplace_assistant"]
        # /readyz says which NeMo Gym the servers run.
        ready = httpx.get(f"{calendar.url}/readyz", trust_env=False, timeout=30).json()
        release = nemo_gym_release(gym_python())
        assert ready["nemo_gym"] == {
            **release.to_json(),
            "observability_enabled": observability_wanted(False),
        }
        assert ready["gym_commit"] == (release.commit or os.environ.get("NEMO_GYM_COMMIT") or "unknown")
        again = subprocess.run(
            [
                sys.executable,
                "-m",
                "relax_gym_core.cli",
                "up",
                "calendar",
                "--port",
                "0",
                "--callback-network",
                "127.0.0.1/32",
            ],
            capture_output=True,
            text=True,
            timeout=SAFETY_S,
            env={**os.environ, **env},
            check=False,
        )
    # The same recipe twice is a real clash: refused in one line before any server starts.
    assert again.returncode == 2
    assert f"state directory {root / 'calendar'} is in use by another relax-gym gateway" in again.stderr
    assert "starting NeMo Gym servers" not in again.stderr and "Traceback" not in again.stderr
