"""`relax-gym up ENV...`: the real NeMo Gym servers of the named environments, plus the gateway.

Servers start directly in the dedicated NeMo Gym environment (no Ray: fast and small, the embedded
default); their policy_model is this gateway, so every model call of every trial comes back through
the bridge. `--replicas N` starts N independent copies of the servers (replicas) and the gateway spreads
trials over them (runtimes/pool.py); `--ray ADDRESS` places the replicas on a Ray cluster instead of this
machine. Ctrl-C (or SIGTERM) stops the gateway gracefully (live trials are aborted and cleaned up while
the servers are still there), then stops every replica we started.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import importlib.util
import ipaddress
import itertools
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from relax_gym_core.bridge import CallbackPolicy
from relax_gym_core.commands.serve import close_state, open_state
from relax_gym_core.errors import ConfigError
from relax_gym_core.gateway import GatewaySettings, create_app
from relax_gym_core.gateway.config import ReplicaSettings
from relax_gym_core.gateway.server import listen, run, url_of
from relax_gym_core.gym.config import servers_of
from relax_gym_core.gym.processes import gym_python, startup_timeout
from relax_gym_core.gym.release import (
    NemoGymRelease,
    nemo_gym_release,
    observability_config,
    observability_wanted,
)
from relax_gym_core.plugin.host import make_plugin_manager
from relax_gym_core.plugin.registry import RuntimeFactory
from relax_gym_core.plugin.specs import specs_for
from relax_gym_core.replicas.local import LocalLauncher
from relax_gym_core.replicas.pool import ReplicaPool, StartedReplica
from relax_gym_core.replicas.spec import ReplicaHandle, ReplicaLauncher, ReplicaSpec
from relax_gym_core.runtimes import Runtime, builtin

RAY_LAUNCHER = "relax_gym_core.replicas.ray"


def _status(message: str) -> None:
    print(message, file=sys.stderr, flush=True)  # noqa: T201 - progress for the operator, not data


def replica_resources(raw: str | None) -> dict[str, float]:
    """--replica-resources: a JSON object of Ray resource name -> positive amount, e.g. {"CPU": 2}."""
    if raw is None:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        raise ConfigError(
            f'--replica-resources must be a JSON object such as {{"CPU": 2}} (got {raw!r})'
        ) from None
    if not isinstance(value, dict) or not value:
        raise ConfigError(
            f'--replica-resources must be a non-empty JSON object such as {{"CPU": 2}} (got {raw!r})'
        )
    resources: dict[str, float] = {}
    for name, amount in value.items():
        if (
            isinstance(amount, bool)
            or not isinstance(amount, int | float)
            or not math.isfinite(amount)
            or amount <= 0
        ):
            raise ConfigError(f"--replica-resources: {name!r} must be a positive number (got {amount!r})")
        resources[name] = float(amount)
    return resources


def make_launcher(ray: str | None, resources: Mapping[str, float]) -> ReplicaLauncher:
    """Local processes, or Ray actors on the cluster at `ray` (the launcher imported only then)."""
    if ray is None:
        return LocalLauncher()
    if importlib.util.find_spec(RAY_LAUNCHER) is None:
        raise ConfigError(f"--ray: this installation has no Ray launcher ({RAY_LAUNCHER} is missing)")
    module = importlib.import_module(RAY_LAUNCHER)
    launcher: ReplicaLauncher = module.RayLauncher(address=ray, resources=dict(resources))
    return launcher


def _announce(handle: ReplicaHandle) -> None:
    pids: Mapping[str, int] = getattr(handle, "pids", {})
    for name, url in handle.urls.items():
        where = f"pid {pids[name]}" if name in pids else f"on {handle.location}"
        _status(f"NeMo Gym server {name} at {url} ({where}) [replica {handle.name}]")


def start_replicas(
    launcher: ReplicaLauncher, specs: Sequence[ReplicaSpec], *, startup_timeout_s: float
) -> list[ReplicaHandle]:
    """Start the replicas side by side; if one fails, the others are stopped and its error raised."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(specs))) as pool:
        futures = [pool.submit(launcher.start, spec, startup_timeout_s=startup_timeout_s) for spec in specs]
        concurrent.futures.wait(futures)
    for future in futures:
        error = future.exception()
        if error is not None:
            raise error
    return [future.result() for future in futures]


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_cluster_reach(ray: str, host: str) -> None:
    """Replicas on other nodes call the gateway at --host: a cluster beyond this machine needs an address
    they can reach (0.0.0.0 binds every address, but is not one to call)."""
    cluster_host = ray.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    if cluster_host in {"", "auto"} or _is_loopback(cluster_host):
        return
    if host == "0.0.0.0" or _is_loopback(host):  # noqa: S104 - comparing, not binding
        raise ConfigError(
            f"--ray {ray}: the replicas' agents call the gateway at --host, which is {host!r}; give --host "
            f"this machine's address on the cluster network (see docs/ray.md)"
        )


def check_options(*, host: str, replicas: int, ray: str | None, resources: str | None) -> Mapping[str, float]:
    """Refuse bad options before anything starts; the resources each Ray replica claims."""
    if ":" in host:
        raise ConfigError("relax-gym up binds an IPv4 address (NeMo Gym builds http://HOST:PORT URLs)")
    if replicas < 1:
        raise ConfigError(f"--replicas must be at least 1 (got {replicas})")
    per_replica = replica_resources(resources)
    if per_replica and ray is None:
        raise ConfigError("--replica-resources applies to Ray replicas only: give --ray ADDRESS too")
    if ray is not None:
        check_cluster_reach(ray, host)
    return per_replica


def nemo_gym_of(observability: bool) -> tuple[NemoGymRelease, dict[str, Any]]:
    """The NeMo Gym the servers will run, said once, and the global config keys `up` adds for it."""
    python = gym_python()
    release = nemo_gym_release(python)
    global_config = observability_config(release, python) if observability else {}
    declared = os.environ.get("NEMO_GYM_COMMIT")
    if declared and release.commit and not release.commit.startswith(declared):
        _status(f"warning: NEMO_GYM_COMMIT is {declared}, the NeMo Gym environment is at {release.commit}")
    _status(f"{release.describe()}{', observability on' if global_config else ''}")
    return release, global_config


def up(
    environments: Sequence[str],
    *,
    host: str = "127.0.0.1",
    port: int = 28100,
    callback_hosts: Sequence[str] = (),
    callback_networks: Sequence[str] = (),
    max_concurrency: int | None = None,
    log_level: str = "warning",
    state_dir: str | None = None,
    replicas: int = 1,
    ray: str | None = None,
    resources: str | None = None,
    observability: bool = False,
) -> None:
    per_replica = check_options(host=host, replicas=replicas, ray=ray, resources=resources)
    replica_settings = ReplicaSettings.from_env()
    hooks = make_plugin_manager()
    definitions = [hooks.environments.get(name) for name in environments]
    factories = builtin.runtime_factories(hooks)
    for definition in definitions:
        if definition.runtime not in factories:
            raise ConfigError(
                f"environment {definition.name!r}: runtime {definition.runtime!r} is not available "
                f"(available: {', '.join(sorted(factories))})"
            )
    policy = CallbackPolicy.from_env(hosts=callback_hosts, networks=callback_networks)
    release, global_config = nemo_gym_of(observability_wanted(observability))
    timeout_s = startup_timeout()
    sock = listen(host, port)
    state = open_state(state_dir, environments)  # a state directory in use stops us before any server
    gateway_host = "127.0.0.1" if host == "0.0.0.0" else host  # noqa: S104 - comparing, not binding
    servers = tuple(servers_of(definitions))
    numbers = itertools.count()
    label = "+".join(environments)

    def spec(name: str) -> ReplicaSpec:
        return ReplicaSpec(
            name=name,
            servers=servers,
            gateway_host=gateway_host,
            gateway_port=sock.getsockname()[1],
            global_config=global_config,
        )

    def runtimes_of(handle: ReplicaHandle) -> StartedReplica:
        logs = getattr(handle, "logs", None)  # local replicas' server output (a Ray replica's is remote)
        specs = specs_for(definitions, handle.urls, max_concurrency=max_concurrency, logs=logs)
        by_name = {definition.name: definition for definition in definitions}
        runtimes: dict[tuple[str, str], Runtime] = {
            s.key: factories[s.runtime](s, by_name[s.environment]) for s in specs
        }
        return StartedReplica(handle, runtimes)

    def replacement(name: str) -> StartedReplica:
        handle = launcher.start(spec(name), startup_timeout_s=timeout_s)
        _announce(handle)
        return runtimes_of(handle)

    _status(f"starting NeMo Gym servers: {', '.join(s.name for s in servers)} ({replicas} replica(s))")
    launcher = make_launcher(ray, per_replica)
    try:
        handles = start_replicas(
            launcher, [spec(f"{label}#{next(numbers)}") for _ in range(replicas)], startup_timeout_s=timeout_s
        )
        for handle in handles:
            _announce(handle)
        started = [runtimes_of(handle) for handle in handles]
        pool = ReplicaPool(
            started,
            start_replica=replacement,
            names=lambda: f"{label}#{next(numbers)}",
            probe_interval_s=replica_settings.probe_interval_s,
            restart_delay_s=replica_settings.restart_delay_s,
            max_restart_attempts=replica_settings.restart_attempts,
            unresponsive_s=replica_settings.unresponsive_s,
        )
        # The gateway's specs (admission, /readyz fingerprint) are the first replica's; every run goes
        # through the pool, whatever runtime its environment names.
        specs = specs_for(
            definitions,
            handles[0].urls,
            max_concurrency=max_concurrency,
        )
        pooled: RuntimeFactory = lambda s, _environment: pool.runtime_for(s.key)  # noqa: E731
        state_where, store = state
        settings = GatewaySettings.from_env(
            specs,
            callback_policy=policy,
            public_url=url_of(sock),
            state_dir=state_where,
            nemo_gym={**release.to_json(), "observability_enabled": bool(global_config)},
        )
        app = create_app(
            settings, hooks=hooks, store=store, runtime_factories={d.runtime: pooled for d in definitions}
        )
        run(app, sock, log_level=log_level, limits=settings.limits)
    finally:
        try:
            launcher.close()  # every replica, replacements included
        finally:
            close_state(state[1])
