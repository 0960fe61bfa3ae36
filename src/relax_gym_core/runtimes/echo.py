"""The built-in in-process `echo` environment: tests, benchmarks and the demo use it.

task.metadata.echo: {"sleep_s": 0, "reward": 1.0, "fail": false, "model": {...}}. With "model":
{"api": "chat" | "responses" | "messages", "calls": N, "stream": false} each run also makes N model calls
through the gateway's bridge (so bridge overhead can be measured end to end). Its cleanup is always
confirmed: nothing outside this process is ever allocated.
"""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING, Any

from relax_gym_core.errors import RunError
from relax_gym_core.plugin.runs import (
    CLEANUP_CONFIRMED,
    UNRECORDED,
    CleanupResult,
    RunContext,
    RunHandle,
    RunResult,
)

if TYPE_CHECKING:
    import httpx

_RESOURCES = {"chat": "chat/completions", "responses": "responses", "messages": "messages"}


def _echo_options(context: RunContext) -> dict[str, Any]:
    metadata = context.request.environment.task.get("metadata")
    options = metadata.get("echo") if isinstance(metadata, dict) else None
    return options if isinstance(options, dict) else {}


def _model_request(api: str, messages: list[Any], stream: bool) -> dict[str, Any]:
    if api == "responses":
        return {"model": "echo", "input": messages, "stream": stream}
    if api == "messages":
        return {"model": "echo", "max_tokens": 64, "messages": messages, "stream": stream}
    return {"model": "echo", "messages": messages, "stream": stream}


class _NothingToRelease:
    """An echo run allocates nothing outside the gateway: every cleanup step is confirmed at once."""

    placement = None  # in this process: nowhere to choose

    async def abort(self) -> CleanupResult:
        return CLEANUP_CONFIRMED

    async def force_cleanup(self) -> CleanupResult:
        return CLEANUP_CONFIRMED

    async def probe_cleanup(self) -> CleanupResult:
        return CLEANUP_CONFIRMED


class EchoHandle(_NothingToRelease):
    __slots__ = (
        "_calls",
        "_client",
        "_fail",
        "_messages",
        "_model",
        "_reward",
        "_sleep_s",
        "_trajectory",
        "_url",
    )

    def __init__(self, context: RunContext, client: httpx.AsyncClient | None) -> None:
        options = _echo_options(context)
        sleep_s = options.get("sleep_s", 0)
        finite = isinstance(sleep_s, (int, float)) and math.isfinite(sleep_s)
        self._sleep_s = float(sleep_s) if finite else 0.0
        self._reward = options.get("reward", 1.0)
        self._fail = options.get("fail") is True
        model = options.get("model")
        self._model: dict[str, Any] | None = model if isinstance(model, dict) else None
        self._calls = 0
        self._client = client
        self._url = context.model_base_url
        messages = context.request.environment.task.get("messages") if self._model is not None else None
        self._messages = messages if isinstance(messages, list) else []  # only runs that call a model keep it
        self._trajectory = context.trajectory
        if context.trajectory is not UNRECORDED:  # the writer process encodes it
            self._trajectory.run_request(context.request.environment.task)

    async def _call_model(self) -> None:
        assert self._model is not None
        api = self._model.get("api", "chat")
        if api not in _RESOURCES:
            raise RunError(f"task.metadata.echo.model.api must be one of {', '.join(_RESOURCES)}")
        if self._url is None or self._client is None:
            raise RunError("echo model calls need the gateway's public URL (relax-gym serve sets it)")
        body = _model_request(api, self._messages, self._model.get("stream") is True)
        for _ in range(int(self._model.get("calls", 1))):
            response = await self._client.post(f"{self._url}/v1/{_RESOURCES[api]}", json=body)
            if response.status_code >= 400:
                raise RunError(f"echo model call failed with HTTP {response.status_code}")
            self._calls += 1

    async def wait(self) -> RunResult:
        if self._model is not None:
            await self._call_model()
        if self._sleep_s > 0:
            await asyncio.sleep(self._sleep_s)
        if self._fail:
            raise RunError("echo environment asked to fail (task.metadata.echo.fail)")
        metrics: dict[str, Any] = {"echo": True}
        if self._model is not None:
            metrics["model_calls"] = self._calls
        if self._trajectory is not UNRECORDED:
            self._trajectory.run_answer({"reward": self._reward, "metrics": metrics})
        return RunResult(reward=self._reward, metrics=metrics)


class EchoRestored(_NothingToRelease):
    """A run of an earlier process: an echo run allocates nothing outside it, so its cleanup is proven."""

    async def wait(self) -> RunResult:
        raise RunError("a restored echo run has nothing to wait for")


class EchoRuntime:
    """Runtime for every environment spec with "runtime": "echo"."""

    def __init__(self) -> None:
        self._client: httpx.AsyncClient | None = None

    async def start(self, context: RunContext) -> RunHandle:
        client = None
        if context.model_base_url is not None and isinstance(_echo_options(context).get("model"), dict):
            if self._client is None:  # made lazily: only runs that call a model need it (or httpx)
                import httpx  # noqa: PLC0415

                # No client timeout: the trial's deadline bounds the run.
                self._client = httpx.AsyncClient(trust_env=False, timeout=None)  # noqa: S113
            client = self._client
        return EchoHandle(context, client)

    def handle_for(self, rollout_id: str, placement: str | None = None) -> RunHandle:
        return EchoRestored()

    async def ready(self) -> bool:
        return True

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
