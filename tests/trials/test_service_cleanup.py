"""After a run finishes on its own, TrialService must ask the runtime to prove its resources are gone
(probe, else force cleanup and probe again) and record the verdict it got: only a confirmation counts.

The runtime here is a test double of the run-adapter seam; the unit under test is the service."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from relax_gym_core.plugin.runs import (
    CLEANUP_CONFIRMED,
    CLEANUP_FAILED,
    CLEANUP_PROBE_FAILED,
    CLEANUP_UNVERIFIED,
    CleanupResult,
    RunContext,
    RunResult,
)
from relax_gym_core.protocol import CleanupState, TrialStatus
from relax_gym_core.trials import Admission, MemoryStore, TrialBook, TrialService

from .test_book import ENV, FakeClock, make_request

pytestmark = pytest.mark.anyio

type Step = CleanupResult | Exception


class FinishingHandle:
    """A run that finishes at once; each cleanup step answers the next scripted outcome."""

    placement: str | None = None  # no replicas

    def __init__(self, runtime: FinishingRuntime) -> None:
        self.runtime = runtime

    async def wait(self) -> RunResult:
        return RunResult(reward=0.75)

    def _answer(self, step: str) -> CleanupResult:
        self.runtime.calls.append(step)
        outcome = self.runtime.outcomes[step].pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def abort(self) -> CleanupResult:
        return self._answer("abort")

    async def force_cleanup(self) -> CleanupResult:
        return self._answer("force_cleanup")

    async def probe_cleanup(self) -> CleanupResult:
        return self._answer("probe_cleanup")


class FinishingRuntime:
    def __init__(self, *, probe: list[Step], force: list[Step] | None = None) -> None:
        self.outcomes: dict[str, list[Step]] = {"probe_cleanup": probe, "force_cleanup": force or []}
        self.calls: list[str] = []

    async def start(self, context: RunContext) -> FinishingHandle:
        return FinishingHandle(self)

    def handle_for(self, rollout_id: str, placement: str | None = None) -> FinishingHandle:
        del rollout_id, placement
        return FinishingHandle(self)

    async def ready(self) -> bool:
        return True

    async def close(self) -> None:
        return None


async def settle(runtime: FinishingRuntime) -> tuple[Any, TrialBook]:
    book = TrialBook(
        clock=FakeClock(),
        store=MemoryStore(),
        environments={ENV: Admission(max_concurrency=1, queue_capacity=1, max_deadline_s=1e6)},
    )
    service = TrialService(book, {ENV: runtime}, cleanup_grace_s=5.0, scan_interval_s=3600.0)
    await service.start()
    try:
        service.create(make_request("r"))
        await until(lambda: book.get("r").cleanup is not CleanupState.PENDING)
        return book.snapshot(book.get("r")), book
    finally:
        await service.close()


async def until(predicate: Callable[[], bool]) -> None:
    for _ in range(10_000):  # a safety bound only: each turn lets the supervisor take one step
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("the trial's cleanup never settled")


async def test_a_confirming_probe_settles_confirmed_with_one_call() -> None:
    runtime = FinishingRuntime(probe=[CLEANUP_CONFIRMED])
    snapshot, book = await settle(runtime)
    assert (snapshot.status, snapshot.reward, snapshot.cleanup) == (
        TrialStatus.COMPLETED,
        0.75,
        CleanupState.CONFIRMED,
    )
    assert runtime.calls == ["probe_cleanup"]  # a normal finish never aborts
    assert book.env_counts(ENV) == (0, 0, 0)


async def test_force_cleanup_that_confirms_settles_confirmed() -> None:
    runtime = FinishingRuntime(probe=[CLEANUP_UNVERIFIED], force=[CLEANUP_CONFIRMED])
    snapshot, _ = await settle(runtime)
    assert snapshot.cleanup is CleanupState.CONFIRMED
    assert runtime.calls == ["probe_cleanup", "force_cleanup"]


async def test_nothing_confirming_settles_unverified_and_keeps_the_result() -> None:
    runtime = FinishingRuntime(probe=[CLEANUP_UNVERIFIED, CLEANUP_UNVERIFIED], force=[CLEANUP_UNVERIFIED])
    snapshot, book = await settle(runtime)
    assert (snapshot.status, snapshot.reward, snapshot.error) == (TrialStatus.COMPLETED, 0.75, None)
    assert snapshot.cleanup is CleanupState.UNVERIFIED
    assert runtime.calls == ["probe_cleanup", "force_cleanup", "probe_cleanup"]
    assert book.env_counts(ENV) == (0, 0, 0)  # the slot is given up all the same


@pytest.mark.parametrize(
    "last_probe",
    [CLEANUP_FAILED, CLEANUP_PROBE_FAILED, RuntimeError("probe endpoint down")],
    ids=["failed", "probe_failed", "raises"],
)
async def test_a_failing_last_probe_settles_failed(last_probe: Step) -> None:
    runtime = FinishingRuntime(probe=[CLEANUP_UNVERIFIED, last_probe], force=[CLEANUP_FAILED])
    snapshot, _ = await settle(runtime)
    assert snapshot.status is TrialStatus.COMPLETED
    assert snapshot.cleanup is CleanupState.FAILED
    assert runtime.calls == ["probe_cleanup", "force_cleanup", "probe_cleanup"]
