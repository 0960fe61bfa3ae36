"""The built-in in-process `echo` environment: tests, benchmarks and the demo use it.

task.metadata.echo: {"sleep_s": 0, "reward": 1.0, "fail": false}. Its cleanup is always confirmed:
nothing outside this process is ever allocated.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from relax_gym_core.runtimes.base import CLEANUP_CONFIRMED, CleanupResult, RunContext, RunHandle, RunResult


class EchoError(RuntimeError):
    """Raised by an echo run asked to fail (task.metadata.echo.fail)."""


def _echo_options(context: RunContext) -> dict[str, Any]:
    metadata = context.request.environment.task.get("metadata")
    options = metadata.get("echo") if isinstance(metadata, dict) else None
    return options if isinstance(options, dict) else {}


class EchoHandle:
    __slots__ = ("_fail", "_reward", "_sleep_s")

    def __init__(self, context: RunContext) -> None:
        options = _echo_options(context)
        sleep_s = options.get("sleep_s", 0)
        self._sleep_s = (
            float(sleep_s) if isinstance(sleep_s, (int, float)) and math.isfinite(sleep_s) else 0.0
        )
        self._reward = options.get("reward", 1.0)
        self._fail = options.get("fail") is True

    async def wait(self) -> RunResult:
        if self._sleep_s > 0:
            await asyncio.sleep(self._sleep_s)
        if self._fail:
            raise EchoError("echo environment asked to fail (task.metadata.echo.fail)")
        return RunResult(reward=self._reward, metrics={"echo": True})

    async def abort(self) -> CleanupResult:
        return CLEANUP_CONFIRMED

    async def force_cleanup(self) -> CleanupResult:
        return CLEANUP_CONFIRMED

    async def probe_cleanup(self) -> CleanupResult:
        return CLEANUP_CONFIRMED


class EchoRuntime:
    """Runtime for every environment spec with "runtime": "echo"."""

    async def start(self, context: RunContext) -> RunHandle:
        return EchoHandle(context)

    async def ready(self) -> bool:
        return True

    async def close(self) -> None:
        return None
