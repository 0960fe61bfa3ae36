"""NeMo Gym servers forked from the fork server: exit codes and logs reported, stopped by PID, a fallback."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from relax_gym_core.errors import ConfigError
from relax_gym_core.gym.processes import GymServerProcess, gym_python, run_gym_servers, stop_process
from relax_gym_core.gym.spawn import FORK_SERVER_VAR, spawn_server
from relax_gym_core.plugin.host import make_plugin_manager
from relax_gym_core.plugin.servers import NemoGymServer

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
