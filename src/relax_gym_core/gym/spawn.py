"""Starting NeMo Gym server processes: forked from a fork server that imported NeMo Gym once, or plainly.

`spawn_server` returns a `ServerProcess` (the part of subprocess.Popen that stopping and health checks
use). With the fork server (the default), a server costs its own start-up only, not the ~10 CPU-seconds of
importing NeMo Gym again; $RELAX_GYM_FORK_SERVER=0 starts each server as its own interpreter instead.
The fork server is one per interpreter for the life of this process; it stops its children when this
process closes its stdin or dies, so a killed command leaves no server behind.

$RELAX_GYM_FORK_SERVER=/path/to/socket shares another command's instead (`shared_fork_server` gives the
path): our servers are still ours alone, and stopped when we end, however we end.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

from relax_gym_core.errors import ConfigError

__all__ = ["FORK_SERVER_VAR", "ForkServer", "ServerProcess", "shared_fork_server", "spawn_server"]

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
    """The client side of relax_gym_core.gym.forkserver, running in the NeMo Gym environment: our own child
    (its stdin and stdout our pipes), or one another command shares with us at a Unix socket."""

    def __init__(self, python: str, *, socket_path: str | None = None) -> None:
        self._python = python
        self._lock = threading.Lock()
        self._spawn_lock = threading.Lock()  # one request awaiting its reply at a time
        self._share_lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._replies: list[dict[str, Any]] = []
        self._exits: dict[int, int] = {}
        self._ended = threading.Event()  # its output ended: it exited, or closed our connection
        self._process: subprocess.Popen[bytes] | None = None
        self._socket: socket.socket | None = None
        self._listening: str | None = socket_path  # where other commands may share it
        self._socket_dir: str | None = None  # the private directory of the socket we asked it to open
        if socket_path is None:
            self._process = subprocess.Popen(  # noqa: S603 - our interpreter, our module
                [python, "-m", "relax_gym_core.gym.forkserver"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                # Its own process group: a terminal's Ctrl-C reaches only the command, which stops servers.
                process_group=0,
            )
            output: IO[bytes] = self._process.stdout  # type: ignore[assignment]
        else:
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                self._socket.connect(socket_path)
            except OSError as error:
                self._socket.close()
                raise ConfigError(
                    f"{FORK_SERVER_VAR}={socket_path}: no fork server answers there ({error.strerror})"
                ) from None
            output = self._socket.makefile("rb")
        self._reader = threading.Thread(target=self._read, args=(output,), name="relax-gym-forkserver")
        self._reader.daemon = True
        self._reader.start()
        ready = self._next_reply(timeout_s=None)
        if "ready" not in ready:
            raise ConfigError(f"the NeMo Gym fork server ({python}) did not start: {ready.get('error')}")
        theirs = ready.get("python", python)
        if os.path.abspath(theirs) != os.path.abspath(python):
            self.close()
            raise ConfigError(
                f"{FORK_SERVER_VAR}={socket_path}: that fork server runs {theirs}, "
                f"not this NeMo Gym's {python}"
            )

    def _read(self, output: IO[bytes]) -> None:
        with contextlib.suppress(OSError, ValueError):
            for raw in output:
                message = json.loads(raw)
                with self._changed:
                    if "exit" in message:
                        self._exits[int(message["exit"])] = int(message["code"])
                    else:
                        self._replies.append(message)
                    self._changed.notify_all()
        with self._changed:
            self._ended.set()
            self._replies.append({"error": "the fork server exited"})
            self._changed.notify_all()

    def _next_reply(self, timeout_s: float | None) -> dict[str, Any]:
        with self._changed:
            self._changed.wait_for(lambda: bool(self._replies), timeout_s)
            return self._replies.pop(0) if self._replies else {"error": "no answer"}

    def _send(self, message: Mapping[str, Any]) -> None:
        data = json.dumps(message).encode() + b"\n"
        if self._socket is not None:
            self._socket.sendall(data)
        else:
            assert self._process is not None and self._process.stdin is not None
            self._process.stdin.write(data)
            self._process.stdin.flush()

    def _request(self, message: Mapping[str, Any]) -> dict[str, Any]:
        with self._spawn_lock:
            with self._lock:
                self._send(message)
            return self._next_reply(timeout_s=60.0)

    @property
    def running(self) -> bool:
        if self._process is not None:
            return self._process.poll() is None
        return not self._ended.is_set()

    def spawn(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str, log: Path) -> ForkedProcess:
        reply = self._request(
            {"op": "spawn", "argv": list(argv), "env": dict(env), "cwd": cwd, "log": str(log)}
        )
        if "pid" not in reply:
            raise ConfigError(f"the NeMo Gym fork server could not start a server: {reply.get('error')}")
        return ForkedProcess(self, int(reply["pid"]))

    def share(self) -> str:
        """The Unix socket at which other commands may share this fork server (it opens one if need be)."""
        with self._share_lock:
            if self._listening is None:
                self._socket_dir = tempfile.mkdtemp(prefix="relax-gym-fork-")  # 0700: ours alone
                reply = self._request({"op": "listen", "path": str(Path(self._socket_dir) / "socket")})
                if "listening" not in reply:
                    raise ConfigError(f"the NeMo Gym fork server cannot be shared: {reply.get('error')}")
                self._listening = str(reply["listening"])
            return self._listening

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
        with self._lock, contextlib.suppress(BrokenPipeError, ValueError, OSError):
            self._send({"op": "signal", "pid": pid, "signal": int(sig)})

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop every server it runs for us: our end closed, it stops them (and, if ours, itself)."""
        if self._socket is not None:
            with contextlib.suppress(OSError):
                self._socket.shutdown(socket.SHUT_WR)
            self._ended.wait(timeout_s)  # it closes our connection once our servers have exited
            self._socket.close()
            return
        assert self._process is not None
        with self._lock, contextlib.suppress(BrokenPipeError, ValueError, OSError):
            self._process.stdin.close()  # type: ignore[union-attr]
        try:
            self._process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)


_servers: dict[str, ForkServer] = {}
_servers_lock = threading.Lock()


def _fork_server(python: str) -> ForkServer:
    with _servers_lock:
        server = _servers.get(python)
        if server is None or not server.running:
            setting = os.environ.get(FORK_SERVER_VAR, "")
            server = _servers[python] = ForkServer(
                python, socket_path=setting if os.path.isabs(setting) else None
            )
        return server


def shared_fork_server(python: str) -> str:
    """The Unix socket at which this process's fork server for `python` (started if need be) serves other
    commands: give it to them as $RELAX_GYM_FORK_SERVER and they import NeMo Gym no more."""
    return _fork_server(python).share()


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
