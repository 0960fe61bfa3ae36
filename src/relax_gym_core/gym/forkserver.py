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
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import selectors
import signal
import sys
import time
import traceback
import warnings
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


def _child(request: dict[str, Any], wakeup: tuple[int, int], parent: int) -> None:
    """In the forked child: become the server (own process group, own environment, log as stdio)."""
    try:
        _die_with(parent)
        os.setpgid(0, 0)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in wakeup:
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


class ForkServer:
    def __init__(self) -> None:
        self.children: set[int] = set()
        self.wakeup = os.pipe()
        for fd in self.wakeup:
            os.set_blocking(fd, False)
        self.out = sys.stdout
        self.pid = os.getpid()

    def reply(self, message: dict[str, Any]) -> None:
        self.out.write(json.dumps(message) + "\n")
        self.out.flush()

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.children.discard(pid)
            self.reply({"exit": pid, "code": os.waitstatus_to_exitcode(status)})

    def spawn(self, request: dict[str, Any]) -> None:
        # Threads of preloaded libraries (an allocator's, a metrics flusher's) do not survive a fork; the
        # servers never use them, and the warning about it would land in every server's log.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            _child(request, self.wakeup, self.pid)
        self.children.add(pid)
        self.reply({"pid": pid})

    def signal(self, request: dict[str, Any]) -> None:
        pid = int(request["pid"])
        if pid in self.children:  # reaped children are never signalled: their PID may be someone else's
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, int(request["signal"]))

    def handle(self, line: str) -> None:
        try:
            request = json.loads(line)
            op = request.get("op")
            if op == "spawn":
                self.spawn(request)
            elif op == "signal":
                self.signal(request)
            else:
                self.reply({"error": f"unknown op {op!r}"})
        except Exception as error:  # noqa: BLE001 - a bad request is answered, never fatal
            self.reply({"error": f"{type(error).__name__}: {error}"})

    def stop_children(self) -> None:
        for sig in (signal.SIGINT, signal.SIGKILL):
            for pid in list(self.children):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + STOP_GRACE_S
            while self.children and time.monotonic() < deadline:
                self.reap()
                if self.children:
                    time.sleep(0.05)
        self.reap()

    def run(self) -> None:
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd is written
        signal.set_wakeup_fd(self.wakeup[1])
        selector = selectors.DefaultSelector()
        selector.register(0, selectors.EVENT_READ)
        selector.register(self.wakeup[0], selectors.EVENT_READ)
        self.reply({"ready": os.getpid()})
        pending = b""
        while True:
            for key, _ in selector.select():
                if key.fd == 0:
                    chunk = os.read(0, 65536)
                    if not chunk:
                        self.stop_children()
                        return
                    *lines, pending = (pending + chunk).split(b"\n")
                    for line in lines:
                        self.handle(line.decode())
                else:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wakeup[0], 512)
                    self.reap()


def main() -> None:
    # The parent stops us by closing stdin; a terminal's Ctrl-C is the parent's to handle.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _preload()
    ForkServer().run()


if __name__ == "__main__":
    main()
