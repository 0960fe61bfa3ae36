"""Starting NeMo Gym server processes: forked from a fork server that imported NeMo Gym once, or plainly.

`spawn_server` returns a `ServerProcess` (the part of subprocess.Popen that stopping and health checks
use). With the fork server (the default), a server costs its own start-up only, not the ~10 CPU-seconds of
importing NeMo Gym again; $RELAX_GYM_FORK_SERVER=0 starts each server as its own interpreter instead.
The fork server is one per interpreter for the life of this process; it stops its children when this
process closes its stdin or dies, so a killed command leaves no server behind.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

from relax_gym_core.errors import ConfigError

__all__ = ["FORK_SERVER_VAR", "ForkServer", "ServerProcess", "spawn_server"]

FORK_SERVER_VAR = "RELAX_GYM_FORK_SERVER"
LAUNCH = ("-m", "relax_gym_core.gym.launch")


class ServerProcess(Protocol):
    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | Any: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...


class ForkedProcess:
    """A server forked by the fork server: signalled through it (it knows whether the PID is still its
    child), its exit code reported by it."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self._server = server
        self.pid = pid

    @property
    def returncode(self) -> int | None:
        return self._server.exit_code(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        code = self._server.wait_exit(self.pid, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        self._server.signal(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The client side of relax_gym_core.gym.forkserver, running in the NeMo Gym environment."""

    def __init__(self, python: str) -> None:
        self._python = python
        self._lock = threading.Lock()
        self._spawn_lock = threading.Lock()  # one request awaiting its reply at a time
        self._changed = threading.Condition(self._lock)
        self._replies: list[dict[str, Any]] = []
        self._exits: dict[int, int] = {}
        self._process = subprocess.Popen(  # noqa: S603 - our interpreter, our module
            [python, "-m", "relax_gym_core.gym.forkserver"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            # Its own process group: a terminal's Ctrl-C reaches only the command, which stops servers.
            process_group=0,
        )
        self._stdin: IO[bytes] = self._process.stdin  # type: ignore[assignment]
        self._reader = threading.Thread(target=self._read, name="relax-gym-forkserver", daemon=True)
        self._reader.start()
        ready = self._next_reply(timeout_s=None)
        if "ready" not in ready:
            raise ConfigError(f"the NeMo Gym fork server ({python}) did not start: {ready.get('error')}")

    def _read(self) -> None:
        assert self._process.stdout is not None
        for raw in self._process.stdout:
            message = json.loads(raw)
            with self._changed:
                if "exit" in message:
                    self._exits[int(message["exit"])] = int(message["code"])
                else:
                    self._replies.append(message)
                self._changed.notify_all()
        with self._changed:
            self._replies.append({"error": "the fork server exited"})
            self._changed.notify_all()

    def _next_reply(self, timeout_s: float | None) -> dict[str, Any]:
        with self._changed:
            self._changed.wait_for(lambda: bool(self._replies), timeout_s)
            return self._replies.pop(0) if self._replies else {"error": "no answer"}

    def _send(self, message: Mapping[str, Any]) -> None:
        self._stdin.write(json.dumps(message).encode() + b"\n")
        self._stdin.flush()

    @property
    def running(self) -> bool:
        return self._process.poll() is None

    def spawn(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str, log: Path) -> ForkedProcess:
        request = {"op": "spawn", "argv": list(argv), "env": dict(env), "cwd": cwd, "log": str(log)}
        with self._spawn_lock:
            with self._lock:
                self._send(request)
            reply = self._next_reply(timeout_s=60.0)
        if "pid" not in reply:
            raise ConfigError(f"the NeMo Gym fork server could not start a server: {reply.get('error')}")
        return ForkedProcess(self, int(reply["pid"]))

    def exit_code(self, pid: int) -> int | None:
        with self._lock:
            if pid not in self._exits and not self.running:
                return -signal.SIGKILL  # the fork server is gone: its children die with it (PDEATHSIG)
            return self._exits.get(pid)

    def wait_exit(self, pid: int, timeout_s: float | None) -> int | None:
        with self._changed:
            self._changed.wait_for(lambda: pid in self._exits or not self.running, timeout_s)
        return self.exit_code(pid)

    def signal(self, pid: int, sig: int) -> None:
        with self._lock, contextlib.suppress(BrokenPipeError, ValueError):
            self._send({"op": "signal", "pid": pid, "signal": int(sig)})

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop it and every server it still runs (it stops them when its stdin closes)."""
        with self._lock, contextlib.suppress(BrokenPipeError, ValueError, OSError):
            self._stdin.close()
        try:
            self._process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


_servers: dict[str, ForkServer] = {}
_servers_lock = threading.Lock()


def _fork_server(python: str) -> ForkServer:
    with _servers_lock:
        server = _servers.get(python)
        if server is None or not server.running:
            server = _servers[python] = ForkServer(python)
        return server


@atexit.register
def _close_fork_servers() -> None:
    with _servers_lock:
        for server in _servers.values():
            server.close()
        _servers.clear()


def spawn_server(
    python: str, argv: Sequence[str], *, env: Mapping[str, str], cwd: str, log: Path
) -> ServerProcess:
    """Start `python -m relax_gym_core.gym.launch ARGV` in its own process group, its output in `log`."""
    if os.environ.get(FORK_SERVER_VAR, "1") != "0":
        return _fork_server(python).spawn(argv, env=env, cwd=cwd, log=log)
    with log.open("ab") as sink:
        return subprocess.Popen(  # noqa: S603 - our interpreter, our module
            [python, *LAUNCH, *argv],
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            process_group=0,
            env=dict(env),
            cwd=cwd,
        )
