"""Runtimes: what actually runs a trial (behind the run-adapter seam)."""

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
