"""Replicas as Ray actors on an existing cluster (a ReplicaLauncher), without importing Ray here.

Ray lives in the NeMo Gym environment: the launcher runs one long-lived `relax_gym_core.replicas.ray_host`
process there (a Ray driver) and talks to it in JSON lines over its stdin/stdout. Each replica is one
actor, placed by Ray (SPREAD, with the resources given per replica), that starts and owns the replica's
servers on its node's address. The host's actors are owned by it, so if the host dies Ray kills them,
and their servers die with them; closing the launcher stops every server and kills every actor.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import json
import logging
import math
import os
import subprocess
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from relax_gym_core.errors import ConfigError
from relax_gym_core.gym.config import merged_config
from relax_gym_core.gym.processes import gym_python, stop_process
from relax_gym_core.replicas.spec import ReplicaSpec

__all__ = ["DEFAULT_RESOURCES", "RayLauncher", "RayReplica"]

logger = logging.getLogger("relax_gym.replicas")

DEFAULT_RESOURCES: Mapping[str, float] = {"CPU": 1.0}  # what one replica claims unless told otherwise
CONNECT_TIMEOUT_S = 180.0  # the host imports Ray and joins the cluster: tens of seconds on a busy node
PLACEMENT_GRACE_S = 90.0  # the host's own grace (60 s) for placing an actor, plus a margin
STOP_TIMEOUT_S = 300.0  # the host stops a replica's servers (SIGINT, then SIGKILL) and waits for the actor


def _checked_resources(resources: Mapping[str, float] | None) -> dict[str, float]:
    chosen = dict(resources or DEFAULT_RESOURCES)
    for name, amount in chosen.items():
        if (
            not isinstance(name, str)
            or not name
            or isinstance(amount, bool)
            or not isinstance(amount, int | float)
            or not math.isfinite(amount)
            or amount < 0
        ):
            raise ConfigError(
                f"Ray replica resources: {name!r} must be a non-negative number (got {amount!r})"
            )
    return {name: float(amount) for name, amount in chosen.items()}


def _host_environ(address: str) -> dict[str, str]:
    environ = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    host = address.rpartition(":")[0].strip("[]") if "://" not in address else ""
    if host in ("127.0.0.1", "localhost", "::1"):
        # Ray replaces a loopback address by this machine's outward one before connecting (clusters
        # usually listen on every interface); a cluster bound to loopback is then out of reach. Ray's
        # switch for single-machine platforms keeps it on loopback.
        environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    return environ


class RayReplica:
    """One replica as a Ray actor and its servers (a ReplicaHandle)."""

    def __init__(self, launcher: RayLauncher, name: str, replica: int, info: Mapping[str, Any]) -> None:
        self._launcher = launcher
        self._name = name
        self._replica = replica
        self._urls: dict[str, str] = dict(info["urls"])
        self.node_id: str = info["node_id"]
        self.node_ip: str = info["node_ip"]
        self.actor_pid: int = info["pid"]  # a PID on that node: for operators (and tests on one machine)
        self.server_pids: tuple[int, ...] = tuple(info["server_pids"])
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self._name

    @property
    def urls(self) -> Mapping[str, str]:
        return dict(self._urls)

    @property
    def location(self) -> str:
        return self.node_id

    def alive(self) -> bool:
        """The actor answered its last ping with every server running; False for good once not.

        Cheap (the gateway's event loop calls it): the host pings every replica each probe interval and
        reports deaths; this only reads what it reported.
        """
        return self._launcher._alive(self._replica)

    def stop(self) -> None:
        with self._lock:  # idempotent: the host forgets the replica once stopped
            self._launcher._stop(self._replica, self._name)


class RayLauncher:
    """Starts replicas as Ray actors on the cluster at `address` (a ReplicaLauncher).

    `resources` is what one replica claims ({"CPU": 2}, {"relax_gym_replica": 1}, ...; default one CPU);
    a custom resource each node holds once makes the one-replica-per-node placement certain.
    Thread-safe: alive() and start() may be called from several threads while a start is under way.
    """

    def __init__(
        self,
        address: str,
        resources: Mapping[str, float] | None = None,
        *,
        python: str | None = None,
        ping_timeout_s: float = 10.0,
        probe_interval_s: float = 0.5,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
    ) -> None:
        if not address.strip():
            raise ConfigError("--ray: the Ray cluster address must not be empty (e.g. 10.0.0.1:6379)")
        self.address = address
        self.resources = _checked_resources(resources)
        self._ping_timeout_s = ping_timeout_s
        self._ids = itertools.count()
        self._pending: dict[int, concurrent.futures.Future[dict[str, Any]]] = {}
        self._lost: dict[int, str] = {}  # replica -> why, as the host reported it
        self._names: dict[int, str] = {}
        self._lock = threading.Lock()
        self._closed = False
        interpreter = python or gym_python()  # a ConfigError saying how to get one, before anything starts
        self._logs = tempfile.TemporaryDirectory(prefix="relax-gym-ray-")
        self._log = Path(self._logs.name) / "ray_host.log"
        self._ready: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
        with self._log.open("wb") as sink:
            self._process = subprocess.Popen(  # noqa: S603 - our interpreter, our module
                [
                    interpreter,
                    *("-m", "relax_gym_core.replicas.ray_host", "--address", address),
                    *("--resources", json.dumps(self.resources), "--ping-timeout", str(ping_timeout_s)),
                    *("--probe-interval", str(probe_interval_s)),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=sink,
                # Its own process group: a terminal's Ctrl-C reaches the command, which drains its trials
                # before closing the launcher (the replicas must outlive the drain).
                process_group=0,
                env=_host_environ(address),
            )
        self._reader = threading.Thread(target=self._read, name="ray-host-reader", daemon=True)
        self._reader.start()
        try:
            ready = self._ready.result(timeout=connect_timeout_s)
        except concurrent.futures.TimeoutError:
            tail = self._tail()
            self._kill()
            raise ConfigError(
                f"--ray {address}: could not join the Ray cluster within {connect_timeout_s:.0f} s{tail}"
            ) from None
        if "error" in ready:
            self._kill()
            raise ConfigError(f"--ray {address}: could not join the Ray cluster: {ready['error']}")
        self.nodes: tuple[str, ...] = tuple(ready["nodes"])

    def __enter__(self) -> RayLauncher:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # ---- the host's answers -----------------------------------------------------------------------

    def _read(self) -> None:
        stdout: IO[bytes] | None = self._process.stdout
        assert stdout is not None
        for line in stdout:
            try:
                answer = json.loads(line)
            except ValueError:
                continue  # not ours: the host sends only JSON lines on stdout
            if not self._ready.done():
                self._ready.set_result(answer)
                continue
            if answer.get("event") == "lost":
                with self._lock:
                    self._lost[int(answer["replica"])] = str(answer["reason"])
                    name = self._names.get(int(answer["replica"]), answer["replica"])
                logger.warning("Ray replica %s lost: %s", name, answer["reason"])
                continue
            with self._lock:
                future = self._pending.pop(answer.get("id"), None)
            if future is not None:
                future.set_result(answer)
        gone = {"error": f"the Ray host process exited (code {self._process.wait()}){self._tail()}"}
        if not self._ready.done():
            self._ready.set_result(gone)
        with self._lock:
            pending, self._pending = list(self._pending.values()), {}
        for future in pending:
            future.set_result(gone)

    def _tail(self, lines: int = 20) -> str:
        try:
            text = self._log.read_text(errors="replace")
        except OSError:
            return ""
        tail = "\n".join(text.splitlines()[-lines:])
        return f":\n{tail}" if tail else ""

    def _request(self, body: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
        future: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
        with self._lock:
            if self._process.poll() is not None:
                raise ConfigError(f"--ray {self.address}: the Ray host process is gone")
            request_id = next(self._ids)
            self._pending[request_id] = future
            stdin = self._process.stdin
            assert stdin is not None
            try:
                stdin.write((json.dumps({**body, "id": request_id}) + "\n").encode())
                stdin.flush()
            except OSError:
                self._pending.pop(request_id, None)
                raise ConfigError(f"--ray {self.address}: the Ray host process is gone") from None
        try:
            return future.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            with self._lock:
                self._pending.pop(request_id, None)
            raise ConfigError(
                f"--ray {self.address}: no answer to {body['op']} within {timeout_s:.0f} s"
            ) from None

    def _ask(self, body: Mapping[str, Any], what: str, timeout_s: float | None = None) -> dict[str, Any]:
        answer = self._request(body, timeout_s or self._ping_timeout_s + 30.0)
        if "error" in answer:
            raise ConfigError(f"--ray {self.address}: {what}: {answer['error']}")
        return answer

    # ---- ReplicaLauncher ----------------------------------------------------------------------------

    def _is_closed(self) -> bool:
        with self._lock:
            return self._closed

    def start(self, spec: ReplicaSpec, *, startup_timeout_s: float) -> RayReplica:
        if self._is_closed():
            raise ConfigError(f"replica {spec.name}: the launcher is closed")
        # Host and ports are the node's, chosen by the actor: placeholders here, filled in there.
        config = merged_config(
            spec.servers,
            host="0.0.0.0",  # noqa: S104 - a placeholder, replaced by the node's address
            ports={server.name: 0 for server in spec.servers},
            gateway_host=spec.gateway_host,
            gateway_port=spec.gateway_port,
            global_config=spec.global_config,
        )
        servers = [
            {
                "name": s.name,
                "kind": s.kind,
                "implementation": s.implementation,
                "server_class": s.server_class,
            }
            for s in spec.servers
        ]
        request = {"op": "start", "name": spec.name, "config": config, "servers": servers}
        answer = self._ask(
            {**request, "timeout_s": startup_timeout_s},
            f"replica {spec.name}",
            timeout_s=startup_timeout_s + PLACEMENT_GRACE_S,
        )
        replica = RayReplica(self, spec.name, int(answer["replica"]), answer)
        with self._lock:
            self._names[int(answer["replica"])] = spec.name
        if self._is_closed():  # closed while it started: nothing may outlive close()
            replica.stop()
            raise ConfigError(f"replica {spec.name}: the launcher was closed while it started")
        return replica

    def _alive(self, replica: int) -> bool:
        with self._lock:
            lost = replica in self._lost
        return not lost and self._process.poll() is None

    def _stop(self, replica: int, name: str) -> None:
        with self._lock:
            self._lost.setdefault(replica, "stopped")
        if self._process.poll() is not None:
            return  # the host is gone, and Ray killed its actors with it
        answer = self._ask(
            {"op": "stop", "replica": replica}, f"stop replica {name}", timeout_s=STOP_TIMEOUT_S
        )
        if answer["left"]:
            logger.error("replica %s: server processes %s did not stop", name, answer["left"])

    def close(self) -> None:
        """Stop every replica (servers, then actors), disconnect from the cluster and end the host."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            if self._process.poll() is None:
                answer = self._request({"op": "close"}, STOP_TIMEOUT_S)
                if answer.get("left"):
                    logger.error("Ray replicas: server processes %s did not stop", answer["left"])
        except ConfigError as error:
            logger.error("Ray replicas: %s", error)  # noqa: TRY400 - the message says it all
        finally:
            self._kill()

    def _kill(self) -> None:
        # The host exits after close; if it does not, SIGTERM ends the driver and Ray kills its actors.
        with contextlib.suppress(OSError):
            if self._process.stdin is not None:
                self._process.stdin.close()
        try:
            self._process.wait(timeout=60.0)
        except subprocess.TimeoutExpired:
            stop_process(self._process, timeout_s=60.0)
        self._reader.join(timeout=10)
        if self._process.stdout is not None:
            self._process.stdout.close()
        self._logs.cleanup()
