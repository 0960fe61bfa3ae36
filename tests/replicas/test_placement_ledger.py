"""The replica a run was placed on is recorded in the trial ledger; a restarted gateway sends the cleanup
of a recovered rollout to that replica, or, when that replica went with the earlier process, records the
cleanup `unverified` at once. Ledgers written before placements existed (schema 1) still open.

The pool's runtimes here are echo runtimes that remember which rollouts they were asked to clean up; the
replicas are in-process handles (the real-process pool is tests/replicas/test_local_replicas_e2e.py).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from relax_gym_core.plugin.runs import RunHandle
from relax_gym_core.protocol import CleanupState, CreateTrialRequest, TrialStatus, parse_create_request
from relax_gym_core.replicas.pool import ReplicaPool, StartedReplica
from relax_gym_core.runtimes import EchoRuntime
from relax_gym_core.trials import Admission, LedgerStore, RecoveryPolicy, TrialBook, TrialService

ENV = ("echo", "default")


class Replica:
    """An in-process replica handle (nothing to stop)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.urls: Mapping[str, str] = {}

    def alive(self) -> bool:
        return True

    def stop(self) -> None:
        return None


class Remembering(EchoRuntime):
    def __init__(self) -> None:
        super().__init__()
        self.cleaned: list[str] = []

    def handle_for(self, rollout_id: str) -> RunHandle:
        self.cleaned.append(rollout_id)
        return super().handle_for(rollout_id)


def request(request_id: str) -> CreateTrialRequest:
    body = f"""{{"protocol_version": "relax-nemo-gym/v1", "request_id": "{request_id}",
        "session": {{"session_id": "s-{request_id}", "group_id": "g", "rollout_mode": "train"}},
        "environment": {{"name": "echo", "config": "default",
                         "task": {{"messages": [], "metadata": {{"echo": {{"sleep_s": 3600}}}}}}}},
        "model_endpoint": {{"base_url": "http://127.0.0.1:9/v1", "api_key": "sk-x", "model": "m"}},
        "interrupt_policy": "protected", "deadline_s": 7200, "lease_s": 7200}}"""
    return parse_create_request(body)


def pool_of(runtimes: Mapping[str, Remembering], incarnation: str | None = None) -> ReplicaPool:
    replicas = [StartedReplica(Replica(name), {ENV: runtime}) for name, runtime in runtimes.items()]
    return ReplicaPool(replicas, probe_interval_s=3600, incarnation=incarnation)


def service_on(store: LedgerStore, pool: ReplicaPool) -> TrialService:
    book = TrialBook(
        clock=time.monotonic,
        store=store,
        environments={ENV: Admission(max_concurrency=4, max_deadline_s=1e6)},
    )
    # Recovery would retry for an hour: a verdict reached here was reached at once.
    return TrialService(
        book, {ENV: pool.runtime_for(ENV)}, scan_interval_s=3600, recovery=RecoveryPolicy(give_up_s=3600)
    )


async def run_and_crash(path: Path) -> tuple[dict[str, str], str]:
    """Two trials placed on two replicas, then the process 'dies' (its ledger is all that is left)."""
    store = LedgerStore(path, clock=time.monotonic)
    pool = pool_of({"echo#0": Remembering(), "echo#1": Remembering()})
    service = service_on(store, pool)
    before = asyncio.all_tasks()
    await service.start()
    placements: dict[str, str] = {}
    for request_id in ("a", "b"):
        service.create(request(request_id))
    for _ in range(10_000):  # a bound, not a timing: placements are recorded as the runs start
        if len(placements) == 2:
            break
        for request_id in ("a", "b"):
            trial = service.book.get(request_id)
            if trial.placement is not None:
                placements[request_id] = trial.placement
        await asyncio.sleep(0.001)
    assert len(placements) == 2, "the service recorded no placement"
    for request_id in placements:
        await service.written(request_id)
    await store.close()  # what a crash leaves: the file
    mine = asyncio.all_tasks() - before
    for task in mine:
        task.cancel()  # the dead process's runs and janitor: nothing of it may act on the restarted one
    await asyncio.gather(*mine, return_exceptions=True)
    return placements, pool.incarnation


async def recover(path: Path, pool: ReplicaPool) -> dict[str, tuple[TrialStatus, CleanupState]]:
    store = LedgerStore(path, clock=time.monotonic)
    service = service_on(store, pool)
    await service.start()
    try:
        while any(service.get(r).cleanup is CleanupState.PENDING for r in ("a", "b")):  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        return {r: (service.get(r).status, service.get(r).cleanup) for r in ("a", "b")}
    finally:
        await service.close()


@pytest.mark.anyio
async def test_a_restarted_gateway_cleans_up_on_the_replica_that_ran_the_rollout(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    placements, incarnation = await run_and_crash(path)
    assert sorted(p.split("@")[0] for p in placements.values()) == ["echo#0", "echo#1"]  # spread

    # The replicas outlived the gateway (same incarnation), listed in another order this time.
    survivors = {"echo#1": Remembering(), "echo#0": Remembering()}
    outcome = await recover(path, pool_of(survivors, incarnation))
    assert outcome == dict.fromkeys(("a", "b"), (TrialStatus.ABORTED, CleanupState.CONFIRMED))
    with sqlite3.connect(path) as ledger:
        rollouts = dict(ledger.execute("SELECT request_id, rollout_id FROM trials").fetchall())
    for request_id, placement in placements.items():
        ran, other = ("echo#0", "echo#1") if placement.startswith("echo#0@") else ("echo#1", "echo#0")
        assert rollouts[request_id] in survivors[ran].cleaned
        assert rollouts[request_id] not in survivors[other].cleaned


@pytest.mark.anyio
async def test_a_rollout_whose_replica_went_with_the_old_process_is_unverified_at_once(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.sqlite3"
    await run_and_crash(path)
    fresh = {"echo#0": Remembering(), "echo#1": Remembering()}  # same names, new processes
    outcome = await recover(path, pool_of(fresh))
    assert outcome == dict.fromkeys(("a", "b"), (TrialStatus.ABORTED, CleanupState.UNVERIFIED))
    assert fresh["echo#0"].cleaned == fresh["echo#1"].cleaned == []  # a new replica proves nothing


@pytest.mark.anyio
async def test_a_ledger_from_before_placements_opens_and_recovers(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    await run_and_crash(path)
    with sqlite3.connect(path) as old:  # what schema 1 wrote: no placement column
        old.execute("ALTER TABLE trials DROP COLUMN placement")
        old.execute("UPDATE meta SET value = '1' WHERE key = 'schema'")
    pool = pool_of({"echo#0": Remembering(), "echo#1": Remembering()})
    outcome = await recover(path, pool)
    # No placement recorded: cleanup goes to every replica, confirmed when all of them confirm.
    assert outcome == dict.fromkeys(("a", "b"), (TrialStatus.ABORTED, CleanupState.CONFIRMED))
    with sqlite3.connect(path) as ledger:
        assert ledger.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() == ("2",)
        assert ledger.execute("SELECT COUNT(*) FROM trials WHERE placement IS NULL").fetchone() == (2,)
