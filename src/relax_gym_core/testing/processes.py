"""Start real relax-gym processes for tests; stop exactly what was started, by PID."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from attrs import frozen

from relax_gym_core.errors import ConfigError
from relax_gym_core.gateway.server import LISTENING_LINE
from relax_gym_core.gym.processes import PYTHON_VAR, gym_python, stop_process
from relax_gym_core.gym.spawn import FORK_SERVER_VAR, shared_fork_server
from relax_gym_core.trials import MEMORY

_PREFIX = LISTENING_LINE.split("{url}")[0]
LOOPBACK_NETWORKS = "127.0.0.1/32,::1/128"  # tests only ever call back to this machine


def run_cli(
    *args: str,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 300.0,
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`relax-gym ARGS...` run to its end, as a user runs it (this interpreter's installation, text
    output captured, the exit code not checked), in `cwd` when given: for tests of a command's output and
    errors. `env` adds to this process's environment."""
    return subprocess.run(  # noqa: S603 - our own interpreter and module
        [sys.executable, "-m", "relax_gym_core.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, **sharing(args, env), **(env or {})},
        cwd=cwd,
        check=False,
    )


# The commands that start NeMo Gym servers (rollout through the `up` it starts without --gateway).
STARTS_SERVERS = frozenset({"up", "probe", "rollout", "reverify", "demo"})


def sharing(args: Sequence[str], env: Mapping[str, str] | None = None) -> dict[str, str]:
    """$RELAX_GYM_FORK_SERVER for `relax-gym ARGS` started by a test: this process's NeMo Gym fork server,
    shared, so the suite imports NeMo Gym once per test process, not once per command that starts servers.
    Not for a command that starts none (it would start a fork server for nothing), nor when the test chose
    the fork server or the NeMo Gym interpreter itself, nor without a NeMo Gym."""
    chosen = {**os.environ, **(env or {})}
    if not args or args[0] not in STARTS_SERVERS or FORK_SERVER_VAR in chosen or PYTHON_VAR in (env or {}):
        return {}
    try:
        return {FORK_SERVER_VAR: shared_fork_server(gym_python())}
    except ConfigError:  # no NeMo Gym environment here: the command says so itself
        return {}


@frozen
class GatewayProcess:
    url: str
    process: subprocess.Popen[str]
    output: list[str]  # every line the process printed (stdout and stderr), appended live

    @property
    def pid(self) -> int:
        return self.process.pid

    def server_url(self, name: str) -> str:
        """Where `relax-gym up` said its NeMo Gym server `name` listens (replica #0's, with replicas)."""
        prefix = f"NeMo Gym server {name} at "
        for line in self.output:
            if line.startswith(prefix):
                return line.removeprefix(prefix).split()[0]
        raise AssertionError(f"address of NeMo Gym server {name} not printed:\n" + "\n".join(self.output))


@contextlib.contextmanager
def start_gateway(
    environments: Mapping[str, Any],
    *,
    env: Mapping[str, str] | None = None,
    host: str = "127.0.0.1",
    startup_timeout_s: float = 60.0,
    extra_args: tuple[str, ...] = (),
    state_dir: str | os.PathLike[str] | None = MEMORY,
    port: int = 0,
) -> Iterator[GatewayProcess]:
    """Run `relax-gym serve --port 0` with these specs until the block exits (then SIGTERM, KILL).

    Trials stay in memory unless `state_dir` names a directory (tests of durability): no test shares a
    ledger, or the user's own, by accident. None gives no --state-dir (the command's default: set
    XDG_DATA_HOME in `env` to keep it away from the user's).
    """
    with tempfile.TemporaryDirectory(prefix="relax-gym-gw-") as tmp:
        spec_file = Path(tmp) / "environments.json"
        spec_file.write_text(json.dumps(environments))
        args = (
            *("serve", "--host", host, "--port", str(port), "--environments", str(spec_file)),
            *_state_dir_args(state_dir),
            *extra_args,
        )
        with _run_cli(args, env=env, startup_timeout_s=startup_timeout_s) as gateway:
            yield gateway


@contextlib.contextmanager
def start_up(
    environments: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    startup_timeout_s: float = 900.0,  # $RELAX_GYM_SERVER_STARTUP_TIMEOUT_S bounds the servers first
    extra_args: tuple[str, ...] = (),
    state_dir: str | os.PathLike[str] | None = MEMORY,
) -> Iterator[GatewayProcess]:
    """Run `relax-gym up ENV... --port 0` (real NeMo Gym servers + gateway) until the block exits."""
    args = ("up", *environments, "--port", "0", *_state_dir_args(state_dir), *extra_args)
    with _run_cli(args, env=env, startup_timeout_s=startup_timeout_s) as gateway:
        yield gateway


def _state_dir_args(state_dir: str | os.PathLike[str] | None) -> tuple[str, ...]:
    return () if state_dir is None else ("--state-dir", os.fspath(state_dir))


@contextlib.contextmanager
def _run_cli(
    args: Sequence[str], *, env: Mapping[str, str] | None, startup_timeout_s: float
) -> Iterator[GatewayProcess]:
    process = subprocess.Popen(  # noqa: S603 - our own interpreter and module
        [sys.executable, "-m", "relax_gym_core.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={
            **os.environ,
            **sharing(args, env),
            "NEMO_GYM_CALLBACK_ALLOWED_NETWORKS": LOOPBACK_NETWORKS,
            **(env or {}),
        },
    )
    output: list[str] = []
    ready = threading.Event()
    url: list[str] = []

    def reader() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            output.append(line.rstrip("\n"))
            if line.startswith(_PREFIX) and not url:
                url.append(line[len(_PREFIX) :].strip())
                ready.set()
        ready.set()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        if not ready.wait(startup_timeout_s) or not url:
            raise RuntimeError("relax-gym did not start:\n" + "\n".join(output))
        yield GatewayProcess(url[0], process, output)
    finally:
        stop_process(process, signal.SIGTERM, timeout_s=60)
        thread.join(timeout=5)
        if process.stdout is not None:
            process.stdout.close()
