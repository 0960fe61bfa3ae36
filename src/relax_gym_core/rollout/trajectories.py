"""Trajectories read as trials end, the trials that end together in one request.

A rollout reads every trial's trajectory (for its trials.jsonl line and trajectories.jsonl.gz). One
request per trial cost the gateway and this process more CPU than the trajectories themselves
(bench/rollout.py), so a reader task, started with the rollout's trials, waits a moment after the first
trial asks, then asks for every trial that asked meanwhile (GatewayClient.trajectories: GET
/v1/trajectories), and so on while trials keep ending.
"""

from __future__ import annotations

from typing import Any

import anyio
from attrs import define, field

from relax_gym_core.client import GatewayClient
from relax_gym_core.errors import RelaxGymError

GATHER_S = 0.02  # how long the reader waits for more trials to ask; short beside a trial


@define
class _Asked:
    done: anyio.Event = field(factory=anyio.Event)
    document: dict[str, Any] | None = None


class TrajectoryReader:
    def __init__(self, client: GatewayClient, *, gather_s: float = GATHER_S) -> None:
        self._client = client
        self._gather_s = gather_s
        self._queued: dict[str, list[_Asked]] = {}
        self._wake = anyio.Event()

    async def read(self, request_id: str) -> dict[str, Any] | None:
        """The trial's trajectory; None when the gateway kept none or could not answer (the trial's line
        is written either way). Answered by serve(), which must be running."""
        asked = _Asked()
        self._queued.setdefault(request_id, []).append(asked)
        self._wake.set()
        await asked.done.wait()
        return asked.document

    async def serve(self) -> None:
        """Answer reads until cancelled (with the rollout's trials); a read left then gets None."""
        try:
            while True:
                await self._wake.wait()
                await anyio.sleep(self._gather_s)
                self._wake = anyio.Event()
                await self._ask()
        finally:
            self._answer(self._queued, {})

    async def _ask(self) -> None:
        batch, self._queued = self._queued, {}
        documents: dict[str, dict[str, Any] | None] = {}
        try:
            documents = await self._client.trajectories(list(batch))
        except RelaxGymError:
            pass  # none this time: those trials' lines are written without one
        finally:
            self._answer(batch, documents)

    @staticmethod
    def _answer(batch: dict[str, list[_Asked]], documents: dict[str, dict[str, Any] | None]) -> None:
        for request_id, askers in batch.items():
            for asked in askers:
                asked.document = documents.get(request_id)
                asked.done.set()
