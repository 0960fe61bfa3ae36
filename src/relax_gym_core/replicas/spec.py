"""Replicas: independent copies of an environment's NeMo Gym servers, and the launchers that start them.

A replica is one wired set of servers (each agent talks to its own resources server) at addresses of its own.
The gateway's runtime spreads trials over the healthy replicas of an environment; where a replica's
processes live is the launcher's business: local processes (`LocalLauncher`) or Ray actors on a cluster
(`RayLauncher`, which drives Ray from a process of the NeMo Gym environment: the core never imports Ray).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from attrs import field, frozen

from relax_gym_core.plugin.servers import NemoGymServer

__all__ = ["ReplicaHandle", "ReplicaLauncher", "ReplicaSpec"]


@frozen(kw_only=True)
class ReplicaSpec:
    """What to start: the servers of one replica, and where their model server (our gateway) listens."""

    name: str  # unique per launcher, e.g. "workplace_assistant#0"
    servers: tuple[NemoGymServer, ...]
    gateway_host: str
    gateway_port: int
    # Top-level keys of NeMo Gym's global config for these servers (e.g. observability_enabled: true).
    global_config: Mapping[str, Any] = field(factory=dict)


class ReplicaHandle(Protocol):
    """One started replica. `alive()` is cheap and never raises; `stop()` is idempotent and blocks until
    every process of the replica is gone (or reports what it could not stop)."""

    @property
    def name(self) -> str: ...

    @property
    def urls(self) -> Mapping[str, str]:
        """Server name -> base URL (http://host:port) the gateway reaches it at."""
        ...

    @property
    def location(self) -> str:
        """Where it runs, for operators: "local" or the Ray node id."""
        ...

    def alive(self) -> bool: ...

    def stop(self) -> None: ...


class ReplicaLauncher(Protocol):
    """Starts replicas (blocking until their servers answer, ConfigError naming the server otherwise)."""

    def start(self, spec: ReplicaSpec, *, startup_timeout_s: float) -> ReplicaHandle: ...

    def close(self) -> None:
        """Stop every replica this launcher started and release the launcher (Ray: disconnect)."""
        ...


def replica_names(environment: str, count: int) -> Sequence[str]:
    return [f"{environment}#{index}" for index in range(count)]
