"""Runtimes: what actually runs a trial. echo (in-process), nemo_gym (an agent's POST /run) and the
built-in registry (builtin.py); the seam they implement (Runtime, RunHandle, RunResult...) is the plugin
API's, relax_gym_core.plugin.runs, re-exported here for the core. The replica pool is in
relax_gym_core.replicas."""

from relax_gym_core.plugin.runs import (
    CLEANUP_CONFIRMED,
    CLEANUP_FAILED,
    CLEANUP_PROBE_FAILED,
    CLEANUP_UNVERIFIED,
    CleanupResult,
    ModelRoute,
    RunContext,
    RunHandle,
    RunResult,
    Runtime,
)
from relax_gym_core.runtimes.echo import EchoRuntime

__all__ = [
    "CLEANUP_CONFIRMED",
    "CLEANUP_FAILED",
    "CLEANUP_PROBE_FAILED",
    "CLEANUP_UNVERIFIED",
    "CleanupResult",
    "EchoRuntime",
    "ModelRoute",
    "RunContext",
    "RunHandle",
    "RunResult",
    "Runtime",
]
