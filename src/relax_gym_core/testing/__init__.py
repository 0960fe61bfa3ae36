"""Public test support: run a real gateway process, and (later) the plugin conformance kit."""

from relax_gym_core.testing.processes import GatewayProcess, start_gateway

__all__ = ["GatewayProcess", "start_gateway"]
