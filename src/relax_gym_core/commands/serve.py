"""`relax-gym serve`: the gateway for an environments file, with every installed plugin loaded.

`serve` and `up` build their app the same way (serve_gateway below), so a plugin's environment named in
an environments file gets its plugin's run bodies, result mapping and runtime under either command.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterable, Sequence

from relax_gym_core.bridge import CallbackPolicy
from relax_gym_core.gateway import EnvironmentSpec, GatewaySettings, create_app, load_environments
from relax_gym_core.gateway.server import listen, run, url_of
from relax_gym_core.plugin.host import Hooks, make_plugin_manager
from relax_gym_core.trials import TrialStore, open_store, resolve_state_dir


def open_state(state_dir: str | None, environments: Iterable[str]) -> tuple[str, TrialStore]:
    """The state directory (--state-dir, $RELAX_GYM_STATE_DIR, else the user's data directory for this
    set of environments) and its store, locked: a directory another gateway holds is refused here,
    before anything starts."""
    where = resolve_state_dir(state_dir, environments)
    return where, open_store(where, clock=time.monotonic)  # the clock create_app's book keeps


def close_state(store: TrialStore) -> None:
    """Release the store if the gateway did not (it closes it at the end of its lifespan)."""
    asyncio.run(store.close())


def serve_gateway(
    sock: socket.socket,
    specs: tuple[EnvironmentSpec, ...],
    hooks: Hooks,
    policy: CallbackPolicy,
    *,
    state: tuple[str, TrialStore],
    log_level: str = "warning",
) -> None:
    """Build the gateway for `specs` with the installed plugins (`hooks`) and serve it on `sock`."""
    state_dir, store = state
    settings = GatewaySettings.from_env(
        specs, callback_policy=policy, public_url=url_of(sock), state_dir=state_dir
    )
    run(create_app(settings, hooks=hooks, store=store), sock, log_level=log_level, limits=settings.limits)


def serve(
    *,
    environments: str | None,
    host: str,
    port: int,
    callback_hosts: Sequence[str] = (),
    callback_networks: Sequence[str] = (),
    log_level: str = "warning",
    state_dir: str | None = None,
) -> None:
    specs = load_environments(environments)
    policy = CallbackPolicy.from_env(hosts=callback_hosts, networks=callback_networks)
    hooks = make_plugin_manager()  # the installed plugins, exactly as `relax-gym up` loads them
    sock = listen(host, port)
    try:
        state = open_state(state_dir, [spec.environment for spec in specs])
        try:
            serve_gateway(sock, specs, hooks, policy, state=state, log_level=log_level)
        finally:
            close_state(state[1])
    finally:
        sock.close()
