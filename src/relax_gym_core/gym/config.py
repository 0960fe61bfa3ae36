"""The merged NeMo Gym config for the servers of some environments, as `gym env start` would build it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from relax_gym_core.plugin.environment import EnvironmentDefinition
from relax_gym_core.plugin.host import startable
from relax_gym_core.plugin.servers import POLICY_MODEL, NemoGymServer


def servers_of(definitions: Iterable[EnvironmentDefinition]) -> list[NemoGymServer]:
    """Every server the environments need, once (environments may share a resources server); a
    ConfigError first if one of them cannot start here (EnvironmentDefinition.unavailable)."""
    definitions = list(definitions)
    startable(definitions)
    seen: dict[str, NemoGymServer] = {}
    for definition in definitions:
        for server in definition.servers:
            if server.name in seen and seen[server.name] != server:
                raise ValueError(f"two environments define server {server.name!r} differently")
            seen[server.name] = server
    return list(seen.values())


def merged_config(
    servers: Iterable[NemoGymServer],
    *,
    host: str,
    ports: Mapping[str, int],
    gateway_host: str,
    gateway_port: int,
    global_config: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Three-level instance entries, plus a policy_model entry whose host/port is our gateway.

    The agents find each other, their resources servers and the policy model by these names; the head
    server is named (NeMo Gym validates it) but never started. `global_config` adds top-level keys of
    NeMo Gym's global config, such as ``observability_enabled``.
    """
    config: dict[str, Any] = {
        **(global_config or {}),
        "head_server": {"host": host, "port": 1},
        "dry_run": False,
        POLICY_MODEL: {
            "responses_api_models": {
                "relax_gym_gateway": {"entrypoint": "app.py", "host": gateway_host, "port": gateway_port}
            }
        },
    }
    for server in servers:
        instance = {"entrypoint": "app.py", "host": host, "port": ports[server.name], **server.config}
        config[server.name] = {server.kind: {server.implementation: instance}}
    return config
