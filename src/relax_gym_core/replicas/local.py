"""Replicas as local processes: each one `run_gym_servers` of its own (own ports, own working directory).

Thread-safe: the gateway starts replacements from a worker thread while `relax-gym up` may be closing the
launcher. A replica started after `close()` is stopped at once and refused, so nothing outlives close.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping

from relax_gym_core.errors import ConfigError
from relax_gym_core.gym.processes import GymServerProcess, run_gym_servers
from relax_gym_core.replicas.spec import ReplicaSpec

__all__ = ["LocalLauncher", "LocalReplica"]


class LocalReplica:
    """One replica's server processes on this machine (a ReplicaHandle)."""

    def __init__(
        self, name: str, servers: Mapping[str, GymServerProcess], stack: contextlib.ExitStack
    ) -> None:
        self._name = name
        self._servers = dict(servers)
        self._stack = stack
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self._name

    @property
    def urls(self) -> Mapping[str, str]:
        return {name: server.url for name, server in self._servers.items()}

    @property
    def location(self) -> str:
        return "local"

    @property
    def logs(self) -> Mapping[str, str]:
        """Server name -> the file its output goes to (kept while the replica runs)."""
        return {name: str(server.log) for name, server in self._servers.items()}

    @property
    def pids(self) -> Mapping[str, int]:
        """Server name -> PID, for operators (and tests) that must address one process."""
        return {name: server.process.pid for name, server in self._servers.items()}

    def alive(self) -> bool:
        try:
            return all(server.process.poll() is None for server in self._servers.values())
        except Exception:  # noqa: BLE001 - alive() never raises: a process we cannot ask about is not alive
            return False

    def exited(self) -> bool:
        """Every process of the replica has exited (so the state they held in memory is gone)."""
        try:
            return all(server.process.poll() is not None for server in self._servers.values())
        except Exception:  # noqa: BLE001
            return False

    def stop(self) -> None:
        with self._lock:  # idempotent; a second caller waits for the first to finish
            self._stack.close()


class LocalLauncher:
    """Starts replicas as processes of the NeMo Gym environment on this machine (a ReplicaLauncher)."""

    def __init__(self, *, host: str = "127.0.0.1", python: str | None = None) -> None:
        self._host = host
        self._python = python
        self._lock = threading.Lock()
        self._started: list[LocalReplica] = []
        self._closed = False

    def start(self, spec: ReplicaSpec, *, startup_timeout_s: float) -> LocalReplica:
        with self._lock:
            if self._closed:
                raise ConfigError(f"replica {spec.name}: the launcher is closed")
        stack = contextlib.ExitStack()
        try:
            running = stack.enter_context(
                run_gym_servers(
                    spec.servers,
                    gateway_host=spec.gateway_host,
                    gateway_port=spec.gateway_port,
                    host=self._host,
                    python=self._python,
                    startup_timeout_s=startup_timeout_s,
                    global_config=spec.global_config,
                )
            )
        except ConfigError as exc:
            stack.close()
            raise ConfigError(f"replica {spec.name}: {exc}") from None
        except BaseException:
            stack.close()
            raise
        replica = LocalReplica(spec.name, running, stack)
        if not self._keep(replica):
            replica.stop()
            raise ConfigError(f"replica {spec.name}: the launcher was closed while it started")
        return replica

    def _keep(self, replica: LocalReplica) -> bool:
        """Record a started replica for close(), unless close() has run meanwhile."""
        with self._lock:
            if not self._closed:
                self._started.append(replica)
            return not self._closed

    def close(self) -> None:
        with self._lock:
            self._closed = True
            replicas, self._started = self._started, []
        errors: list[BaseException] = []
        for replica in reversed(replicas):  # every one is stopped, even if one fails to
            try:
                replica.stop()
            except Exception as exc:  # noqa: BLE001 - re-raised below once all are stopped
                errors.append(exc)
        if errors:
            raise errors[0]
