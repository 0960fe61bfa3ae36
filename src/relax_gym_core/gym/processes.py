"""NeMo Gym servers as processes of the dedicated NeMo Gym environment: start, wait until ready, stop.

Every process is ours and is stopped by PID (SIGINT, then SIGKILL); nothing else is ever signalled.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import time
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from attrs import frozen

from relax_gym_core.errors import ConfigError
from relax_gym_core.gym.config import merged_config
from relax_gym_core.gym.installed import PYTHON_VAR
from relax_gym_core.gym.ports import answers_root, free_ports
from relax_gym_core.gym.release import (
    CAPTURE_DIR_KEY,
    OBSERVABILITY_KEY,
    nemo_gym_release,
    observability_config,
    observability_wanted,
)
from relax_gym_core.gym.spawn import ServerProcess, spawn_server
from relax_gym_core.gym.stop import stop_process, stop_processes
from relax_gym_core.plugin.servers import NemoGymServer

__all__ = [
    "DEFAULT_PYTHON",
    "PYTHON_VAR",
    "STARTUP_TIMEOUT_VAR",
    "GymServerProcess",
    "free_ports",
    "gym_python",
    "run_gym_servers",
    "startup_timeout",
    "stop_process",
    "stop_processes",
]

DEFAULT_PYTHON = Path(".gym/venv/bin/python")


def gym_python(environ: Mapping[str, str] = os.environ) -> str:
    """The interpreter of the NeMo Gym environment, or a ConfigError saying how to get one.

    $RELAX_GYM_NEMO_GYM_PYTHON when set (used or reported, never second-guessed), else .gym/venv/bin/python
    under the working directory or a parent of this checkout (an editable install run from elsewhere).
    """
    configured = environ.get(PYTHON_VAR)
    if configured:
        candidates = [Path(configured)]
    else:
        candidates = [base / DEFAULT_PYTHON for base in (Path.cwd(), *Path(__file__).resolve().parents)]
    found = next((path for path in candidates if path.is_file()), None)
    if found is None:
        raise ConfigError(
            f"NeMo Gym environment not found ({PYTHON_VAR}={configured or 'unset'}, tried {candidates[0]}): "
            f"run `make gym`, or `pip install nemo-gym==0.4.0` into an environment with relax-gym-core and "
            f"set {PYTHON_VAR} to its python"
        )
    return str(found.absolute())


STARTUP_TIMEOUT_VAR = "RELAX_GYM_SERVER_STARTUP_TIMEOUT_S"
DEFAULT_STARTUP_TIMEOUT_S = 300.0  # NeMo Gym servers import a lot (sympy, pandas): minutes on a busy host


def startup_timeout(environ: Mapping[str, str] = os.environ) -> float:
    """How long NeMo Gym servers may take to answer GET / ($RELAX_GYM_SERVER_STARTUP_TIMEOUT_S)."""
    raw = environ.get(STARTUP_TIMEOUT_VAR, "")
    if not raw:
        return DEFAULT_STARTUP_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{STARTUP_TIMEOUT_VAR} must be a positive number of seconds (got {raw!r})")
    return value


@frozen
class GymServerProcess:
    name: str
    url: str
    process: ServerProcess  # its own process group: a terminal's Ctrl-C reaches only the command
    log: Path

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _wait_ready(servers: list[GymServerProcess], timeout_s: float) -> None:
    pending = {server.name: server for server in servers}
    stop = time.monotonic() + timeout_s
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
    while True:
        for name, server in list(pending.items()):
            if server.process.poll() is not None:
                code = server.process.returncode
                raise ConfigError(f"NeMo Gym server {name!r} exited with code {code}:\n{server.tail()}")
            if answers_root(opener, server.url):
                del pending[name]
        if not pending:
            return
        if time.monotonic() > stop:
            names = ", ".join(sorted(pending))
            raise ConfigError(
                f"NeMo Gym server(s) {names} not ready after {timeout_s:.0f} s "
                f"(a busy host may need more: set {STARTUP_TIMEOUT_VAR})"
            )
        time.sleep(0.1)


@contextlib.contextmanager
def run_gym_servers(
    servers: Iterable[NemoGymServer],
    *,
    gateway_host: str,
    gateway_port: int,
    host: str = "127.0.0.1",
    python: str | None = None,
    ports: Mapping[str, int] | None = None,
    startup_timeout_s: float | None = None,
    global_config: Mapping[str, Any] | None = None,
) -> Iterator[dict[str, GymServerProcess]]:
    """Start the servers (their model server is the gateway at gateway_host:gateway_port) until exit.

    `global_config` adds top-level keys to NeMo Gym's global config (merged_config); by default, the
    observability keys when $RELAX_GYM_NEMO_GYM_OBSERVABILITY asks for them (every server set relax-gym
    starts: probe, rollout, the test fixtures), refused for a NeMo Gym without observability.
    """
    servers = list(servers)
    interpreter = python or gym_python()
    if global_config is None:
        wanted = observability_wanted(False)
        global_config = observability_config(nemo_gym_release(interpreter), interpreter) if wanted else {}
    chosen = dict(ports or {})
    missing = [server.name for server in servers if server.name not in chosen]
    chosen.update(zip(missing, free_ports(len(missing), host), strict=True))
    config = merged_config(
        servers,
        host=host,
        ports=chosen,
        gateway_host=gateway_host,
        gateway_port=gateway_port,
        global_config=global_config,
    )
    started: list[GymServerProcess] = []
    with tempfile.TemporaryDirectory(prefix="relax-gym-nemo-") as logs:
        if config.get(OBSERVABILITY_KEY) and not config.get(CAPTURE_DIR_KEY):
            # With observability NeMo Gym's model servers (an LLM judge's, here) must capture their calls:
            # into this server set's own directory, removed when it stops.
            config[CAPTURE_DIR_KEY] = str(Path(logs) / "model-calls")
        try:
            for server in servers:
                log = Path(logs) / f"{server.name}.log"
                process = spawn_server(
                    interpreter,
                    [
                        "--server-class",
                        server.server_class,
                        "--upstream",
                        f"{server.kind}.{server.implementation}",
                    ],
                    env={
                        **os.environ,
                        "NEMO_GYM_CONFIG_DICT": json.dumps(config),
                        "NEMO_GYM_CONFIG_PATH": server.name,
                        # NeMo Gym writes caches (hf, uv, outputs/) into the working directory.
                        "HF_HOME": str(Path(logs) / "hf"),
                    },
                    cwd=logs,
                    log=log,
                )
                started.append(
                    GymServerProcess(server.name, f"http://{host}:{chosen[server.name]}", process, log)
                )
            _wait_ready(started, startup_timeout_s or startup_timeout())
            yield {running.name: running for running in started}
        finally:
            stop_processes([running.process for running in started])
