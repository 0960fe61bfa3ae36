"""The gateway a rollout starts for itself (when no --gateway URL is given), as `relax-gym up` does: the NeMo
Gym servers of the environments the data routes to, then the gateway in a background thread of this
process, with the policy's host added to the callback allowlist and an observer that gives each trial its
model-call count and phase timings. Everything started here is stopped here, by PID or by its thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette

from relax_gym_core.bridge import CallbackPolicy
from relax_gym_core.errors import ConfigError
from relax_gym_core.gateway import EnvironmentSpec, GatewaySettings, create_app
from relax_gym_core.gateway.server import listen, url_of
from relax_gym_core.gym.config import servers_of
from relax_gym_core.gym.processes import run_gym_servers
from relax_gym_core.observe import CallbackOutcome, Transition
from relax_gym_core.plugin.host import Hooks
from relax_gym_core.plugin.specs import specs_for
from relax_gym_core.protocol.types import split_http_url
from relax_gym_core.rollout.data import ECHO
from relax_gym_core.trials import MemoryStore

START_TIMEOUT_S = 60.0
# The loggers of the gateway's parts (the thin client's, relax_gym.client, stays on the terminal).
GATEWAY_LOGGERS = (
    "relax_gym.gateway",
    "relax_gym.trials",
    "relax_gym.bridge",
    "relax_gym.nemo_gym",
    "relax_gym.observe",
    "relax_gym.ledger",
    "uvicorn",
)
_PHASE_NAMES = {
    "queued": "queued_s",
    "running": "running_s",
    "cancelling": "cancelling_s",
    "terminal": "cleanup_s",
}


def _status(message: str) -> None:
    print(message, file=sys.stderr, flush=True)  # noqa: T201 - progress for the operator, not data


class TrialWatch:
    """An observer (relax_gym_core.observe) keeping, per trial, its bridged model calls and phase times.

    Called on the gateway's thread; read (and forgotten) by the rollout's loop when the trial is recorded.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: Counter[str] = Counter()
        self._phases: dict[str, dict[str, float]] = {}

    def transition(self, event: Transition) -> None:
        if event.previous is None:
            return
        with self._lock:
            phases = self._phases.setdefault(event.request_id, {})
            name = _PHASE_NAMES[event.previous.value]
            phases[name] = round(phases.get(name, 0.0) + event.phase_s, 6)

    def callback(self, outcome: CallbackOutcome) -> None:
        with self._lock:
            self._calls[outcome.request_id] += 1

    def take(self, request_id: str) -> tuple[int, dict[str, float]]:
        with self._lock:
            return self._calls.pop(request_id, 0), self._phases.pop(request_id, {})


class _GatewayThread:
    """The gateway app under uvicorn (uvloop) on `sock`, in a daemon thread: no signal handlers of its own,
    so Ctrl-C reaches the rollout, which aborts its trials through this gateway before stopping it."""

    def __init__(self, app: Starlette, sock: socket.socket) -> None:
        config = uvicorn.Config(
            app,
            log_level="warning",
            log_config=None,
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=30,
            proxy_headers=False,
            server_header=False,
        )
        self._server = uvicorn.Server(config)
        self._sock = sock
        self._thread = threading.Thread(target=self._run, name="relax-gym gateway", daemon=True)

    def _run(self) -> None:
        try:
            import uvloop  # noqa: PLC0415

            factory: Any = uvloop.new_event_loop
        except ImportError:  # pragma: no cover - uvloop is part of the gateway extra
            factory = None
        asyncio.run(self._server.serve(sockets=[self._sock]), loop_factory=factory)

    def start(self) -> None:
        self._thread.start()
        stop_at = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > stop_at:
                self.stop()
                raise ConfigError("the gateway did not start (see the log lines above)")
            time.sleep(0.01)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(START_TIMEOUT_S)


def allow_policy_host(policy: CallbackPolicy | None, base_url: str) -> CallbackPolicy:
    """The callback allowlist from the environment, plus the policy's own host (exactly that host)."""
    parts = split_http_url(base_url)
    host = (parts.hostname or "") if parts is not None else ""
    hosts: list[str] = []
    networks: list[str] = []
    try:
        networks.append(str(ipaddress.ip_network(host)))  # an address: its /32 or /128
    except ValueError:
        hosts.append(host)
    return CallbackPolicy.from_env(hosts=hosts, networks=networks)


def _echo_spec(concurrency: int) -> EnvironmentSpec:
    return EnvironmentSpec(
        config=ECHO, environment=ECHO, runtime=ECHO, max_concurrency=concurrency, queue_capacity=concurrency
    )


@contextlib.contextmanager
def own_gateway(
    hooks: Hooks,
    environments: Collection[str],
    *,
    policy_url: str,
    concurrency: int,
    watch: TrialWatch,
    host: str = "127.0.0.1",
    port: int = 0,
) -> Iterator[str]:
    """Start what `environments` need and a gateway in front of them; yields the gateway's URL."""
    if ":" in host:
        raise ConfigError(
            "the rollout's gateway binds an IPv4 address (NeMo Gym builds http://HOST:PORT URLs)"
        )
    definitions = [hooks.environments.get(name) for name in sorted(environments) if name != ECHO]
    callback = allow_policy_host(None, policy_url)
    sock = listen(host, port)
    try:
        servers = servers_of(definitions)
        gym: contextlib.AbstractContextManager[Any] = contextlib.nullcontext({})
        if servers:
            _status(f"starting NeMo Gym servers: {', '.join(s.name for s in servers)}")
            gym = run_gym_servers(servers, gateway_host=host, gateway_port=sock.getsockname()[1])
        with gym as running:
            urls = {name: server.url for name, server in running.items()}
            specs = specs_for(definitions, urls, max_concurrency=concurrency)
            if ECHO in environments:
                specs = (*specs, _echo_spec(concurrency))
            settings = GatewaySettings.from_env(specs, callback_policy=callback, public_url=url_of(sock))
            # Trials in memory: this gateway lives and dies with the command, whose own record is
            # trials.jsonl (and a durable state directory would be locked by any `relax-gym up` running).
            store = MemoryStore(tombstone_capacity=settings.tombstone_capacity)
            app = create_app(settings, hooks=hooks, observers=[watch], store=store)
            gateway = _GatewayThread(app, sock)
            gateway.start()
            try:
                yield url_of(sock)
            finally:
                gateway.stop()
    finally:
        sock.close()


@contextlib.contextmanager
def gateway_log(path: Path) -> Iterator[None]:
    """While the rollout runs, the in-process gateway logs to `path` instead of the terminal: a failing
    trial is a result in trials.jsonl, and its traceback is for whoever digs, not for the live view."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    saved = []
    for name in GATEWAY_LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, logger.propagate))
        logger.addHandler(handler)
        logger.propagate = False
    try:
        yield
    finally:
        for logger, propagate in saved:
            logger.removeHandler(handler)
            logger.propagate = propagate
        handler.close()
