"""The NeMo Gym run adapter: one trial = one POST <agent>/run, cleanup by rollout id.

- Each /run is its own call with no cookies kept (NeMo Gym session cookies must never leak between
  trials) and no timeout: the trial's deadline is the only bound (the service cancels the call).
- The trial's rollout id rides in the body twice: as _ng_task_index/_ng_rollout_index (the plugin's run
  body; NeMo Gym >= 0.5 agents with observability on prefix their model calls with
  /ng-rollout/<task>-<rollout>), and as the model-call tag (RunContext.model.metadata) in
  responses_create_params.metadata, which NeMo Gym 0.4.0's simple_agent resends unchanged on every model
  call (it does not prefix); the bridge strips the tag before going upstream.
- Abort closes the /run call, then runs the environment's cleanup contract and probes it. After a run that
  ended on its own, a /run answer that states the rollout released (relax_gym_core.ingym.mark_released)
  is the probe's answer: one request fewer per trial (~1 ms of the environment server's CPU).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import aiohttp

from relax_gym_core.errors import AgentRunError, ConfigError
from relax_gym_core.ingym import released_in
from relax_gym_core.plugin import EnvironmentDefinition
from relax_gym_core.plugin.runs import (
    CLEANUP_CONFIRMED,
    CLEANUP_FAILED,
    CLEANUP_PROBE_FAILED,
    CLEANUP_UNVERIFIED,
    CleanupResult,
    RunContext,
    RunHandle,
    RunResult,
    Trajectory,
)
from relax_gym_core.plugin.specs import EnvironmentSpec
from relax_gym_core.protocol import jsonutil
from relax_gym_core.protocol.text import REDACTED, safe_text

logger = logging.getLogger("relax_gym.nemo_gym")
TAIL_LINES = 30  # of each server's log, quoted when a run fails
ANSWER_CHARS = 2000  # of a failed /run's answer, quoted likewise
TAIL_BYTES = 64 * 1024  # read from the end of a log: a long-running server's log is large


def log_tail(path: str, lines: int) -> str:
    """The last `lines` lines of a server's log ("" when it cannot be read)."""
    try:
        with open(path, "rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - TAIL_BYTES))
            text = log.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class NemoGymRun:
    """One /run call, or (call None) a run of an earlier gateway process, known by its rollout id only."""

    placement = None  # one agent: nowhere to choose

    def __init__(self, runtime: NemoGymRuntime, call: asyncio.Future[Any] | None, rollout_id: str) -> None:
        self._runtime = runtime
        self._call = call
        self._rollout_id = rollout_id

    async def wait(self) -> RunResult:
        if self._call is None:
            raise AgentRunError("a run of an earlier gateway process cannot be waited for")
        body = await self._call
        return self._runtime.environment.map_result(body)

    async def _post(self, template: str | None) -> CleanupResult | None:
        """POST a cleanup endpoint; None when it was accepted (proof still needs the probe)."""
        if template is None:
            return CLEANUP_UNVERIFIED
        url = template.format(rollout_id=self._rollout_id)
        async with self._runtime.session.post(url, json={}) as response:
            await response.read()
            return None if response.status < 400 else CLEANUP_FAILED

    async def abort(self) -> CleanupResult:
        if self._call is not None:
            self._call.cancel()  # closes the connection; the agent's next model call then gets 410
            await asyncio.gather(self._call, return_exceptions=True)
        if self._runtime.cleanup.stateless:
            return CLEANUP_CONFIRMED
        failed = await self._post(self._runtime.cleanup.abort_url)
        return failed or await self.probe_cleanup()

    async def force_cleanup(self) -> CleanupResult:
        if self._runtime.cleanup.stateless:
            return CLEANUP_CONFIRMED
        failed = await self._post(self._runtime.cleanup.force_cleanup_url)
        return failed or await self.probe_cleanup()

    def _answer_released(self) -> bool:
        """The run's own /run answer states its rollout released (ingym.released_in): the environment said
        so as the run ended, after releasing it; a probe now would only say it again."""
        call = self._call
        if call is None or not call.done() or call.cancelled() or call.exception() is not None:
            return False
        return released_in(call.result()) == self._rollout_id

    async def probe_cleanup(self) -> CleanupResult:
        cleanup = self._runtime.cleanup
        if cleanup.stateless or self._answer_released():
            return CLEANUP_CONFIRMED
        if cleanup.cleanup_probe_url is None:
            return CLEANUP_UNVERIFIED
        try:
            async with self._runtime.session.get(
                cleanup.cleanup_probe_url.format(rollout_id=self._rollout_id)
            ) as response:
                payload = await response.json(content_type=None) if response.status < 400 else None
        except (aiohttp.ClientError, ValueError):
            return CLEANUP_PROBE_FAILED
        if not isinstance(payload, dict):
            return CLEANUP_PROBE_FAILED
        return CLEANUP_CONFIRMED if payload.get("clean") is True else CLEANUP_UNVERIFIED


class NemoGymRuntime:
    """Runs trials of one registered (environment, config) on a NeMo Gym agent."""

    def __init__(self, spec: EnvironmentSpec, environment: EnvironmentDefinition) -> None:
        if spec.agent_url is None:
            raise ConfigError(f"environment config {spec.config!r}: the nemo_gym runtime needs an agent_url")
        self.environment = environment  # its methods shape each run's body and result: looked up once
        self.cleanup = spec.cleanup
        self._run_url = f"{spec.agent_url.rstrip('/')}/run"
        self._readiness_urls = spec.readiness_urls
        self._server_logs = spec.server_logs
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:  # bound to the running loop, so made on first use
            self._session = aiohttp.ClientSession(
                cookie_jar=aiohttp.DummyCookieJar(),  # refuse every cookie: no session sharing across trials
                trust_env=False,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
                connector=aiohttp.TCPConnector(limit=0),
            )
        return self._session

    def run_body(self, context: RunContext) -> dict[str, Any]:
        request = context.request
        body = self.environment.build_run_body(
            request.environment.task, request.generation, context.rollout_id
        )
        params = body.setdefault("responses_create_params", {})
        metadata = params.get("metadata")
        params["metadata"] = {**(metadata if isinstance(metadata, dict) else {}), **context.model.metadata}
        return body

    async def start(self, context: RunContext) -> RunHandle:
        body = jsonutil.dumps(self.run_body(context))  # encoded once: sent, and kept as it went
        context.trajectory.run_request(body)
        call = asyncio.ensure_future(self._post_run(body, context.trajectory, context.rollout_id))
        return NemoGymRun(self, call, context.rollout_id)

    def handle_for(self, rollout_id: str, placement: str | None = None) -> RunHandle:
        return NemoGymRun(self, None, rollout_id)  # the cleanup contract's URLs, with this rollout id

    async def _post_run(self, body: bytes, trajectory: Trajectory, rollout_id: str) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        async with self.session.post(self._run_url, data=body, headers=headers) as response:
            raw = await response.read()
            if response.status >= 400:
                self._say_why(response.status, raw, rollout_id)
                # The body is not quoted: agents echo requests, and the request carries the rollout id.
                raise AgentRunError(f"NeMo Gym agent /run answered HTTP {response.status}")
        try:
            payload = jsonutil.loads_as_json(raw)  # orjson where it reads as json does: ~4x faster
        except ValueError:
            raise AgentRunError("NeMo Gym agent returned a non-JSON response") from None
        if not isinstance(payload, dict):
            raise AgentRunError("NeMo Gym agent response must be a JSON object")
        trajectory.run_answer(raw)
        return payload

    def _say_why(self, status: int, answer: bytes, rollout_id: str) -> None:
        """A failed /run's cause is in the agent's answer (NeMo Gym's "Hit an exception ... calling an inner
        server: ...") and in what its servers logged (their tracebacks): both into the gateway's log (not the
        trial's error), bounded, the rollout id (a live bridge key) masked."""
        said = safe_text(answer.decode("utf-8", errors="replace"), limit=ANSWER_CHARS, secrets=(rollout_id,))
        logger.warning("NeMo Gym agent /run answered HTTP %d: %s", status, said or "(no body)")
        for path in self._server_logs:
            tail = log_tail(path, TAIL_LINES).replace(rollout_id, REDACTED)
            if tail:
                logger.warning("the last lines of %s:\n%s", path, tail)

    async def ready(self) -> bool:
        if not self._readiness_urls:
            return True

        async def check(url: str) -> bool:
            try:
                async with self.session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as response:
                    return response.status < 300
            except (aiohttp.ClientError, TimeoutError):
                return False

        return all(await asyncio.gather(*(check(url) for url in self._readiness_urls)))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
