"""`relax-gym up ENV...`: the real NeMo Gym servers of the named environments, plus the gateway.

Servers start directly in the dedicated NeMo Gym environment (no Ray: fast and small, the embedded
default); their policy_model is this gateway, so every model call of every trial comes back through
the bridge. Ctrl-C (or SIGTERM) stops the gateway gracefully (live trials are aborted and cleaned up
while the servers are still there), then stops every server we started, by PID.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

from relax_gym_core.bridge import CallbackPolicy
from relax_gym_core.commands.serve import close_state, listen, open_state, serve_gateway
from relax_gym_core.environments import EnvironmentDefinition, Hooks, make_plugin_manager
from relax_gym_core.errors import ConfigError
from relax_gym_core.gateway import EnvironmentSpec
from relax_gym_core.gym.config import servers_of
from relax_gym_core.gym.processes import GymServerProcess, run_gym_servers


def _status(message: str) -> None:
    print(message, file=sys.stderr, flush=True)  # noqa: T201 - progress for the operator, not data


def environment_specs(
    definitions: Sequence[EnvironmentDefinition],
    hooks: Hooks,
    servers: Mapping[str, GymServerProcess],
    *,
    max_concurrency: int | None = None,
) -> tuple[EnvironmentSpec, ...]:
    """Gateway specs for every registered config, pointing at the servers just started."""
    specs = []
    for definition in definitions:
        contract = hooks.cleanup_contract(definition.name)
        cleanup = contract.resolve(servers[contract.server].url if contract.server else None)
        behind_agent = definition.runtime == "nemo_gym"
        readiness = definition.readiness or tuple(server.name for server in definition.servers)
        for config in definition.configs:
            specs.append(
                EnvironmentSpec(
                    config=config,
                    environment=definition.name,
                    runtime=definition.runtime,
                    agent_name=definition.agent if behind_agent else None,
                    agent_url=servers[definition.agent].url if behind_agent else None,
                    interrupt_policy=definition.interrupt_policy,
                    max_concurrency=max_concurrency or definition.max_concurrency,
                    queue_capacity=definition.queue_capacity,
                    max_deadline_s=definition.max_deadline_s,
                    readiness_urls=tuple(servers[name].url + "/" for name in readiness),
                    cleanup=cleanup,
                )
            )
    return tuple(specs)


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
) -> None:
    if ":" in host:
        raise ConfigError("relax-gym up binds an IPv4 address (NeMo Gym builds http://HOST:PORT URLs)")
    hooks = make_plugin_manager()
    definitions = [hooks.environments.get(name) for name in environments]
    policy = CallbackPolicy.from_env(hosts=callback_hosts, networks=callback_networks)
    sock = listen(host, port)
    state = open_state(state_dir)  # a state directory in use stops us before any server starts
    gateway_host = "127.0.0.1" if host == "0.0.0.0" else host  # noqa: S104 - comparing, not binding
    servers = servers_of(definitions)
    _status(f"starting NeMo Gym servers: {', '.join(s.name for s in servers)}")
    try:
        with run_gym_servers(
            servers, gateway_host=gateway_host, gateway_port=sock.getsockname()[1]
        ) as running:
            for server in running.values():
                _status(f"NeMo Gym server {server.name} at {server.url} (pid {server.process.pid})")
            specs = environment_specs(definitions, hooks, running, max_concurrency=max_concurrency)
            serve_gateway(sock, specs, hooks, policy, state=state, log_level=log_level)
    finally:
        close_state(state[1])
