"""NeMo Gym servers forked from the fork server: exit codes and logs reported, stopped by PID, a fallback."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from pathlib import Path

import httpx
import pytest

from relax_gym_core.errors import ConfigError
from relax_gym_core.gym.processes import GymServerProcess, gym_python, run_gym_servers, stop_process
from relax_gym_core.gym.spawn import FORK_SERVER_VAR, ForkServer, shared_fork_server, spawn_server
from relax_gym_core.plugin.host import make_plugin_manager
from relax_gym_core.plugin.servers import NemoGymServer
from relax_gym_core.testing.processes import run_cli, start_up

from ..replicas.support import parent_of

pytestmark = pytest.mark.e2e  # the NeMo Gym environment's interpreter

BROKEN = NemoGymServer(
    name="broken",
    kind="resources_servers",
    implementation="no_such_server",
    server_class="relax_gym_no_such_module.app:Server",
    config={},
)


@pytest.mark.parametrize("fork", ["1", "0"], ids=["forked", "own-interpreter"])
def test_a_server_that_cannot_start_is_named_with_its_exit_code_and_log(
    fork: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FORK_SERVER_VAR, fork)
    with (
        pytest.raises(ConfigError) as raised,
        run_gym_servers([BROKEN], gateway_host="127.0.0.1", gateway_port=9),
    ):
        pass
    message = str(raised.value)
    assert "NeMo Gym server 'broken' exited with code 1" in message
    assert "relax_gym_no_such_module" in message  # the server's own output, from its log
    # ... one line naming the class and why, not a traceback (a plugin's wrong server_class)
    assert (
        "server class relax_gym_no_such_module.app:Server: module relax_gym_no_such_module.app cannot be "
        "imported in the NeMo Gym environment (ModuleNotFoundError" in message
    )
    assert "Traceback" not in message


def test_a_forked_servers_exit_is_reported_once_and_it_is_never_signalled_after(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    process = spawn_server(
        gym_python(),
        ["--server-class", "relax_gym_no_such_module.app:Server"],
        env=dict(os.environ),
        cwd=str(tmp_path),
        log=log,
    )
    assert process.wait(timeout=120) == 1
    assert process.poll() == 1 and process.returncode == 1
    stop_process(process, signal.SIGINT)  # a reaped child is never signalled again: a no-op, no error
    assert "relax_gym_no_such_module" in log.read_text()


def test_a_server_started_with_sigint_blocked_still_stops_on_sigint(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ray worker starts a replica's servers from a thread that blocks SIGINT, and a signal mask outlives
    exec: unless the server unblocks it, every SIGINT stays pending and each stop waits for the SIGKILL."""
    monkeypatch.setenv(FORK_SERVER_VAR, "0")  # this thread's own Popen, as a Ray actor's is
    mcqa = make_plugin_manager().environments.get("mcqa").servers[0]
    servers: dict[str, GymServerProcess] = {}

    def launch() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # this thread only; it ends below
        assert signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, set())
        with run_gym_servers([mcqa], gateway_host="127.0.0.1", gateway_port=9) as started:
            servers.update(started)

    thread = threading.Thread(target=launch)
    thread.start()
    thread.join()
    assert list(servers) == [mcqa.name], "the server did not start"
    # It stopped on its SIGINT: it was not killed when stop_processes gave up waiting for it.
    assert servers[mcqa.name].process.returncode != -signal.SIGKILL


def test_a_server_module_that_imports_the_cores_dependencies_is_told_the_two_interpreter_rule() -> None:
    """A server module beside plugin code that imports relax-gym's own dependencies (cattrs, through the
    protocol) cannot run in the NeMo Gym environment: the launcher says why and what to do, not only the
    missing module (whose obvious fix, installing it there, is the wrong one)."""
    code = (
        "from relax_gym_core.gym.launch import server_class\n"
        "server_class('relax_gym_core.protocol.converter:Converter')\n"
    )
    done = subprocess.run(
        [gym_python(), "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 1
    message = done.stderr.strip()
    assert "\n" not in message and "Traceback" not in message
    assert (
        "(ModuleNotFoundError: No module named 'cattrs'): cattrs is a dependency of relax-gym's own"
        in message
    )
    assert "with the entry point at `<package>.plugin` and a package __init__ that imports nothing" in message


def test_commands_sharing_a_fork_server_each_keep_their_own_servers(tmp_path: Path) -> None:
    """`relax-gym up` given $RELAX_GYM_FORK_SERVER forks its servers from this process's fork server (the
    suite runs every command so): another command's connection cannot signal them, and they stop with
    the `up` that asked for them, not with the fork server."""
    python = gym_python()
    path = shared_fork_server(python)
    with start_up(["mcqa"], env={FORK_SERVER_VAR: path}) as gateway:
        pids = [int(pid) for pid in re.findall(r"\(pid (\d+)\)", "\n".join(gateway.output))]
        assert len(pids) == 2
        fork_server = {parent_of(pid) for pid in pids}
        assert len(fork_server) == 1 and fork_server != {gateway.pid}  # not `up`'s own: none was started
        other = ForkServer(python, socket_path=path)  # a third command's connection
        try:
            for pid in pids:
                other.signal(pid, signal.SIGKILL)  # not its own: ignored
            assert other.exit_code(pids[0]) is None
        finally:
            other.close()
        assert httpx.get(f"{gateway.url}/readyz", trust_env=False, timeout=30).json()["ready"] is True
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)
    assert Path(f"/proc/{next(iter(fork_server))}").exists()  # it serves this process on


def test_a_fork_server_that_is_not_there_is_one_clear_line(tmp_path: Path) -> None:
    nowhere = tmp_path / "socket"
    args = ("up", "mcqa", "--port", "0", "--callback-network", "127.0.0.1/32")
    done = run_cli(*args, env={FORK_SERVER_VAR: str(nowhere)}, timeout_s=120)
    assert done.returncode != 0
    assert f"{FORK_SERVER_VAR}={nowhere}: no fork server answers there" in done.stderr
    assert "Traceback" not in done.stderr
