"""`relax-gym serve`: the gateway for an environments file, with every installed plugin loaded.

`serve` and `up` build their app the same way (serve_gateway below), so a plugin's environment named in
an environments file gets its plugin's run bodies, result mapping and runtime under either command.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

from relax_gym_core.bridge import CallbackPolicy
from relax_gym_core.environments import Hooks, make_plugin_manager
from relax_gym_core.errors import ConfigError
from relax_gym_core.gateway import EnvironmentSpec, GatewaySettings, create_app, load_environments
from relax_gym_core.gateway.server import bind, run, url_of


def listen(host: str, port: int) -> socket.socket:
    try:
        return bind(host, port)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def serve_gateway(
    sock: socket.socket,
    specs: tuple[EnvironmentSpec, ...],
    hooks: Hooks,
    policy: CallbackPolicy,
    *,
    log_level: str = "warning",
) -> None:
    """Build the gateway for `specs` with the installed plugins (`hooks`) and serve it on `sock`."""
    settings = GatewaySettings.from_env(specs, callback_policy=policy, public_url=url_of(sock))
    run(create_app(settings, hooks=hooks), sock, log_level=log_level)


def serve(
    *,
    environments: str | None,
    host: str,
    port: int,
    callback_hosts: Sequence[str] = (),
    callback_networks: Sequence[str] = (),
    log_level: str = "warning",
) -> None:
    specs = load_environments(environments)
    policy = CallbackPolicy.from_env(hosts=callback_hosts, networks=callback_networks)
    hooks = make_plugin_manager()  # the installed plugins, exactly as `relax-gym up` loads them
    sock = listen(host, port)
    try:
        serve_gateway(sock, specs, hooks, policy, log_level=log_level)
    finally:
        sock.close()
