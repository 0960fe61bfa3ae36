"""A fork server for NeMo Gym servers (runs INSIDE the NeMo Gym environment).

    python -m relax_gym_core.gym.forkserver

Importing NeMo Gym costs ~10 CPU-seconds per process (ray, wandb, pandas); an environment needs two or
more servers and a replica pool many more. This process imports it once and forks each server from that
state, so a server costs its own start-up only. Requests and replies are JSON lines:

    stdin   {"op": "spawn", "argv": [...], "env": {...}, "cwd": DIR, "log": FILE}
    stdout  {"pid": N} | {"error": "..."}
    stdin   {"op": "signal", "pid": N, "signal": S}        (only to a child not yet reaped: no PID reuse)
    stdout  {"exit": N, "code": C}                         (whenever a child ends; C < 0: killed by -C)

`argv` are the arguments of `relax_gym_core.gym.launch`. End of stdin (our parent closed it or died)
stops every child still running, then this process. Imports: standard library and NeMo Gym only.

Shared: on `{"op": "listen", "path": P}` from the parent it also accepts other commands at the Unix socket
P (mode 0600) and speaks the same lines with each; it greets each with `{"ready": PID, "python": ...}`.
A command's children are its own: their exits go to it, it may signal only them, and when its connection
closes (it ended, however) they are stopped as the parent's are at the end of stdin. So N `relax-gym up`
commands on one host import NeMo Gym once, not N times (the test suite runs them so).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import selectors
import signal
import socket
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

# What every server imports; a server's own module is imported in its child, after the fork.
PRELOAD = (
    "nemo_gym.server_utils",
    "nemo_gym.base_resources_server",
    "nemo_gym.base_responses_api_agent",
    "uvicorn",
    "fastapi",
)
STOP_GRACE_S = 10.0
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _preload() -> None:
    for name in PRELOAD:
        with contextlib.suppress(ImportError):  # a module missing here is imported (and reported) later
            importlib.import_module(name)


def _die_with(parent: int) -> None:
    """SIGKILL when the fork server dies (however it dies): its children never outlive it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it died before prctl took effect
        os._exit(128 + signal.SIGKILL)


def _child(request: dict[str, Any], inherited: tuple[int, ...], parent: int) -> None:
    """In the forked child: become the server (own process group, own environment, log as stdio)."""
    try:
        _die_with(parent)
        os.setpgid(0, 0)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in inherited:  # the fork server's own pipes and sockets are not the server's
            os.close(fd)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(devnull)
        sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
        sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        from relax_gym_core.gym import launch  # noqa: PLC0415 - after the environment is the server's

        launch.main(list(request["argv"]))
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if stop.code is not None and not isinstance(stop.code, int):
            print(stop.code, file=sys.stderr)  # noqa: T201 - as the interpreter says it for a message exit
    except KeyboardInterrupt:
        code = 128 + signal.SIGINT
    except BaseException:  # noqa: BLE001 - the child must never return into the fork server's loop
        traceback.print_exc()
        code = 1
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


class Client:
    """One connection: the parent's pipes (stdin/stdout), or a socket a command sharing this server opened.
    Each owns the children it asked for: their exits are told to it alone, and it may signal only them."""

    def __init__(self, read_fd: int, write: Callable[[bytes], object], sock: socket.socket | None = None):
        self.read_fd = read_fd
        self.write = write
        self.sock = sock
        self.children: set[int] = set()
        self.pending = b""
        self.closing = False  # its end is closed: its children are being stopped, then the socket closes

    def reply(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):  # a client that went away is stopped by its end of input
            self.write(json.dumps(message).encode() + b"\n")


class ForkServer:
    def __init__(self) -> None:
        self.wakeup = os.pipe()
        for fd in self.wakeup:
            os.set_blocking(fd, False)
        self.pid = os.getpid()
        self.selector = selectors.DefaultSelector()
        self.parent = Client(0, self._write_stdout)
        self.clients: dict[int, Client] = {0: self.parent}
        self.owners: dict[int, Client] = {}  # child PID -> the client that asked for it
        self.stopping: dict[int, float] = {}  # child PID -> when SIGINT gives way to SIGKILL
        self.listener: socket.socket | None = None
        self.socket_path: str | None = None

    @staticmethod
    def _write_stdout(data: bytes) -> None:
        os.write(1, data)

    def reap(self) -> None:
        while self.owners:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.stopping.pop(pid, None)
            owner = self.owners.pop(pid, None)
            if owner is not None:
                owner.children.discard(pid)
                owner.reply({"exit": pid, "code": os.waitstatus_to_exitcode(status)})
                self._close_if_done(owner)

    def spawn(self, client: Client, request: dict[str, Any]) -> None:
        # Threads of preloaded libraries (an allocator's, a metrics flusher's) do not survive a fork; the
        # servers never use them, and the warning about it would land in every server's log.
        inherited = (*self.wakeup, *(c.read_fd for c in self.clients.values() if c.sock is not None))
        if self.listener is not None:
            inherited += (self.listener.fileno(),)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            _child(request, inherited, self.pid)
        client.children.add(pid)
        self.owners[pid] = client
        client.reply({"pid": pid})

    def signal(self, client: Client, request: dict[str, Any]) -> None:
        pid = int(request["pid"])
        # Only a client's own children, never reaped ones: a reaped child's PID may be someone else's.
        if pid in client.children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, int(request["signal"]))

    def listen(self, client: Client, request: dict[str, Any]) -> None:
        """Accept commands that share this server at a Unix socket (only the parent may ask)."""
        if client is not self.parent or self.listener is not None:
            client.reply({"error": "listen: only the parent, and once"})
            return
        path = str(request["path"])
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # the socket is its user's alone: connecting to it starts processes
        try:
            listener.bind(path)
        finally:
            os.umask(old)
        listener.listen(16)
        listener.setblocking(False)
        self.listener, self.socket_path = listener, path
        self.selector.register(listener, selectors.EVENT_READ)
        client.reply({"listening": path})

    def accept(self) -> None:
        assert self.listener is not None
        with contextlib.suppress(BlockingIOError):
            sock, _ = self.listener.accept()
            sock.setblocking(True)
            client = Client(sock.fileno(), sock.sendall, sock)
            self.clients[client.read_fd] = client
            self.selector.register(client.read_fd, selectors.EVENT_READ)
            client.reply({"ready": self.pid, "python": sys.executable})

    def handle(self, client: Client, line: str) -> None:
        try:
            request = json.loads(line)
            op = request.get("op")
            if op == "spawn":
                self.spawn(client, request)
            elif op == "signal":
                self.signal(client, request)
            elif op == "listen":
                self.listen(client, request)
            else:
                client.reply({"error": f"unknown op {op!r}"})
        except Exception as error:  # noqa: BLE001 - a bad request is answered, never fatal
            client.reply({"error": f"{type(error).__name__}: {error}"})

    def read(self, client: Client) -> bool:
        """Handle what the client sent; False when its end closed."""
        try:
            chunk = os.read(client.read_fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            return False
        *lines, client.pending = (client.pending + chunk).split(b"\n")
        for line in lines:
            self.handle(client, line.decode())
        return True

    def hang_up(self, client: Client) -> None:
        """A sharing command closed its end (it ended, however): stop its children, then close."""
        self.selector.unregister(client.read_fd)
        client.closing = True
        deadline = time.monotonic() + STOP_GRACE_S
        for pid in client.children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT)
            self.stopping[pid] = deadline
        self._close_if_done(client)

    def _close_if_done(self, client: Client) -> None:
        if client.closing and not client.children and client.sock is not None:
            self.clients.pop(client.read_fd, None)
            client.sock.close()

    def kill_late(self) -> float | None:
        """SIGKILL children whose grace ran out (their exit is reaped as any other's); the time until the next
        one's does, None when no child is being stopped."""
        now = time.monotonic()
        for pid, deadline in list(self.stopping.items()):
            if deadline <= now:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                del self.stopping[pid]
        return max(0.0, min(self.stopping.values()) - now) if self.stopping else None

    def stop_children(self) -> None:
        for sig in (signal.SIGINT, signal.SIGKILL):
            for pid in list(self.owners):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + STOP_GRACE_S
            while self.owners and time.monotonic() < deadline:
                self.reap()
                if self.owners:
                    time.sleep(0.05)
        self.reap()

    def close(self) -> None:
        for client in list(self.clients.values()):
            if client.sock is not None:
                client.sock.close()
        if self.listener is not None:
            self.listener.close()
            with contextlib.suppress(OSError):
                os.unlink(str(self.socket_path))

    def run(self) -> None:
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd is written
        signal.set_wakeup_fd(self.wakeup[1])
        self.selector.register(0, selectors.EVENT_READ)
        self.selector.register(self.wakeup[0], selectors.EVENT_READ)
        self.parent.reply({"ready": os.getpid()})
        while True:
            for key, _ in self.selector.select(self.kill_late()):
                if key.fileobj is self.listener:
                    self.accept()
                elif key.fd == self.wakeup[0]:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wakeup[0], 512)
                    self.reap()
                elif key.fd == 0:
                    if not self.read(self.parent):  # the parent closed stdin or died: everything stops
                        self.stop_children()
                        self.close()
                        return
                elif (client := self.clients.get(key.fd)) is not None and not self.read(client):
                    self.hang_up(client)


def main() -> None:
    # The parent stops us by closing stdin; a terminal's Ctrl-C is the parent's to handle.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _preload()
    ForkServer().run()


if __name__ == "__main__":
    main()
