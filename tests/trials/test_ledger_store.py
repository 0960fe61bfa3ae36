"""The SQLite ledger under the trial service: a transition is on disk before it is acknowledged (and a run
starts only once its `running` is), finished trials leave memory for the file, retention and tombstones
work in SQL, no secret is ever written, and a state directory belongs to one gateway."""

from __future__ import annotations

import asyncio
import gc
import itertools
import os
import sqlite3
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from relax_gym_core.errors import ConfigError, TrialConflictError
from relax_gym_core.plugin.runs import CLEANUP_CONFIRMED, RunContext, RunHandle, RunResult
from relax_gym_core.protocol import CleanupState, TrialStatus
from relax_gym_core.runtimes import EchoRuntime
from relax_gym_core.trials import (
    Admission,
    Cause,
    LedgerStore,
    MemoryStore,
    TrialBook,
    TrialService,
    open_store,
)

from .test_book import ENV, FakeClock, make_request


def row_of(path: Path, request_id: str) -> tuple[str, str] | None:
    """(phase, status) as another reader of the file sees it now."""
    with sqlite3.connect(path) as other:
        row = other.execute("SELECT phase, status FROM trials WHERE request_id = ?", (request_id,)).fetchone()
    return None if row is None else (row[0], row[1])


class WitnessRuntime(EchoRuntime):
    """Echo runs, but each start first reads what the ledger file says about its trial."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.seen: dict[str, tuple[str, str] | None] = {}

    async def start(self, context: RunContext) -> RunHandle:
        request_id = context.request.request_id
        self.seen[request_id] = row_of(self.path, request_id)
        return await super().start(context)


def book_on(store: Any, *, clock: Any = time.monotonic, concurrency: int = 4) -> TrialBook:
    return TrialBook(
        clock=clock,
        store=store,
        environments={ENV: Admission(max_concurrency=concurrency, queue_capacity=64, max_deadline_s=1e6)},
    )


@pytest.mark.anyio
async def test_create_is_on_disk_before_it_is_acknowledged_and_runs_start_after_running_is(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.sqlite3"
    store = LedgerStore(path, clock=time.monotonic)
    runtime = WitnessRuntime(path)
    service = TrialService(book_on(store), {ENV: runtime}, scan_interval_s=3600)
    await service.start()
    try:
        ids = [f"t{i}" for i in range(12)]
        for request_id in ids:
            service.create(make_request(request_id))
            assert row_of(path, request_id) is None  # recorded in memory, not yet written
        for request_id in ids:
            await service.written(request_id)  # what the 202 waits for
            assert row_of(path, request_id) is not None
        while any(service.get(rid).cleanup is CleanupState.PENDING for rid in ids):  # noqa: ASYNC110
            await asyncio.sleep(0.005)  # the service offers no "settled" event to wait on
        for request_id in ids:
            await service.written(request_id)
            assert row_of(path, request_id) == ("terminal", "completed")
    finally:
        await service.close()
    # Write-ahead: no run started before the file said it was running.
    assert runtime.seen == dict.fromkeys(ids, ("active", "running"))


def finish(book: TrialBook, request_id: str) -> None:
    book.create(make_request(request_id))
    book.start_ready()
    book.complete(request_id, RunResult(reward=1.0, metrics={"m": 1}))
    book.finish_cleanup(request_id, CLEANUP_CONFIRMED)


def test_finished_trials_leave_memory_and_are_answered_from_the_file(tmp_path: Path) -> None:
    store = LedgerStore(tmp_path / "ledger.sqlite3", clock=time.monotonic)
    book = book_on(store, concurrency=1)
    names = (f"done-{i}" for i in itertools.count())

    def run(count: int) -> None:
        for index in range(count):
            finish(book, next(names))
            if index % 250 == 249:
                store.flush_sync()
        store.flush_sync()

    run(1_000)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        run(4_000)
        gc.collect()
        per_trial = (tracemalloc.get_traced_memory()[0] - before) / 4_000
    finally:
        tracemalloc.stop()
    # An in-memory record costs ~900 B here; a finished trial in the ledger costs memory nothing.
    assert per_trial < 64, per_trial
    assert len(store) == 5_000
    old = book.get("done-0")  # read back from the file
    assert (old.status, old.reward, old.cleanup) == (TrialStatus.COMPLETED, 1.0, CleanupState.CONFIRMED)
    replay, created = book.create(make_request("done-0"))
    assert not created and replay.status is TrialStatus.COMPLETED  # a replay is answered, never re-run


def test_retention_and_tombstones_run_in_the_file(tmp_path: Path) -> None:
    clock = FakeClock()
    store = LedgerStore(tmp_path / "ledger.sqlite3", clock=clock, tombstone_capacity=3)
    book = TrialBook(
        clock=clock,
        store=store,
        environments={ENV: Admission(max_concurrency=1, queue_capacity=8, max_deadline_s=1e6)},
        retention_s=10.0,
        max_retained=4,
    )
    for index in range(6):
        finish(book, f"r{index}")
        clock.advance(1.0)
    store.flush_sync()
    book.evict_expired()  # beyond max_retained: the two oldest go
    store.flush_sync()
    assert [book.store.get(f"r{i}") is None for i in range(6)] == [True, True, False, False, False, False]
    assert book.evict_expired() == 2  # reported once the writer did it
    clock.advance(7.0)  # r2 and r3 settled 10 s or more ago now
    book.evict_expired()
    store.flush_sync()
    assert [book.store.get(f"r{i}") is None for i in range(6)] == [True, True, True, True, False, False]
    # Tombstones are bounded (3 here), oldest first: r0's went, r1..r3 still read as expired.
    assert [store.is_tombstoned(f"r{i}") for i in range(6)] == [False, True, True, True, False, False]
    with pytest.raises(TrialConflictError):
        book.create(make_request("r2"))
    assert len(store) == 2


def test_no_session_token_api_key_or_header_value_is_ever_written(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "state"), clock=time.monotonic)
    book = book_on(store, concurrency=2)
    secrets_seen: list[str] = []
    rollout_ids: list[str] = []
    for index, path in enumerate(["queued", "running", "cancelling", "completed", "settled"]):
        # Each secret its own value: one that happened to equal another would hide which one leaked.
        key = f"sk-never-on-disk-{index:04d}-{os.urandom(8).hex()}"
        session = f"session-token-{index:04d}-{os.urandom(8).hex()}"
        header = f"header-value-{index:04d}-{os.urandom(8).hex()}"
        request = make_request(f"s-{path}", api_key=key, session_id=session, headers={"X-Extra": header})
        trial, _ = book.create(request)
        secrets_seen += [key, session, header]
        rollout_ids.append(trial.rollout_id)
        if path != "queued":
            book.start_ready()
        if path == "cancelling":
            book.begin_cancel(trial.request_id, Cause.ABORTED)
        if path in ("completed", "settled"):
            book.complete(trial.request_id, RunResult(reward=0.5))
        if path == "settled":
            book.finish_cleanup(trial.request_id, CLEANUP_CONFIRMED)
        book.start_ready()
    assert isinstance(store, LedgerStore)
    store.flush_sync()
    files = sorted(p for p in (tmp_path / "state").iterdir() if p.is_file())
    assert {p.name for p in files} >= {"ledger.sqlite3", "fingerprint.key", "lock"}
    for path in files:
        data = path.read_bytes()
        assert [s for s in secrets_seen if s.encode() in data] == [], path.name
    # The rollout ids are recorded (cleanup after a restart is addressed by them); they are a bridge key
    # only while their trial is live in this process (trials/rollouts.py).
    with sqlite3.connect(tmp_path / "state" / "ledger.sqlite3") as db:
        recorded = {row[0] for row in db.execute("SELECT rollout_id FROM trials")}
    assert recorded == set(rollout_ids)


def test_a_state_directory_belongs_to_one_gateway_and_keeps_its_fingerprint_key(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = open_store(str(state), clock=time.monotonic)
    with pytest.raises(ConfigError, match=rf"state directory {state} is in use .* \(pid {os.getpid()}\)"):
        open_store(str(state), clock=time.monotonic)
    key = first.fingerprint_key
    assert key is not None and len(key) == 32
    assert (state / "fingerprint.key").stat().st_mode & 0o777 == 0o600
    assert state.stat().st_mode & 0o777 == 0o700
    asyncio.run(first.close())
    (state / "fingerprint.key").chmod(0o644)
    second = open_store(str(state), clock=time.monotonic)  # the lock went with the first store
    assert second.fingerprint_key == key  # replays after a restart compare with recorded fingerprints
    assert (state / "fingerprint.key").stat().st_mode & 0o777 == 0o600
    asyncio.run(second.close())
    assert isinstance(open_store(":memory:", clock=time.monotonic), MemoryStore)


@pytest.mark.anyio
async def test_a_restart_ends_trials_of_an_environment_no_longer_configured_as_unverified(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.sqlite3"
    before = LedgerStore(path, clock=time.monotonic)
    book = book_on(before)
    book.create(make_request("orphan"))
    book.start_ready()
    await before.close()  # a process that ran it is gone; its configuration changed meanwhile

    after = LedgerStore(path, clock=time.monotonic)
    other = ("elsewhere", "default")
    book = TrialBook(clock=time.monotonic, store=after, environments={other: Admission()})
    service = TrialService(book, {other: EchoRuntime()}, scan_interval_s=3600)
    await service.start()
    try:
        while service.get("orphan").cleanup is CleanupState.PENDING:  # noqa: ASYNC110
            await asyncio.sleep(0.005)  # no runtime can address it: recorded, never dropped
        snapshot = service.get("orphan")
    finally:
        await service.close()
    assert (snapshot.status, snapshot.error, snapshot.cleanup) == (
        TrialStatus.ABORTED,
        {"code": "service_restart"},
        CleanupState.UNVERIFIED,
    )
