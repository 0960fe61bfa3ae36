"""The gateway: Starlette app factory, configuration, error table, uvicorn server."""

from relax_gym_core.gateway.app import Gateway, create_app
from relax_gym_core.gateway.config import GatewaySettings, load_environments
from relax_gym_core.plugin.specs import EnvironmentSpec, parse_environments

__all__ = [
    "EnvironmentSpec",
    "Gateway",
    "GatewaySettings",
    "create_app",
    "load_environments",
    "parse_environments",
]
