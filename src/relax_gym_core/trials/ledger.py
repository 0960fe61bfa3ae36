"""LedgerStore: the durable TrialStore, on SQLite in WAL mode (stdlib sqlite3), with group commit.

The book records what changed (`changed`) and goes on; one flusher task takes everything changed so far
as one batch, encodes it on the loop (records are only ever mutated there), and commits it in one
transaction on a writer thread (synchronous=FULL: fsync'd at commit). Changes made while a batch is
being written form the next one, so the write path costs one fsync per batch, not per transition, and
batches grow with load. `unwritten(request_id)` hands out the future of the batch holding a record's last
change: the service awaits it before acknowledging, so nothing acknowledged is lost by a crash.

Memory holds only records whose cleanup is not settled, plus settled ones until their batch is written;
everything else is read back from the file on demand (polls of old trials), so memory follows the live
trials, not the trials ever seen. Retention runs in SQL: settled rows past the horizon (or beyond
max_retained, oldest first) are deleted and leave a tombstone (bounded, FIFO), as MemoryStore does.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Final

from attrs import frozen

from relax_gym_core.errors import ConfigError, StoreUnavailableError
from relax_gym_core.protocol import CleanupState
from relax_gym_core.trials.events import Clock
from relax_gym_core.trials.idfilter import IdFilter
from relax_gym_core.trials.ledger_rows import (
    MIGRATIONS,
    SCHEMA,
    SCHEMA_VERSION,
    SELECT_ONE,
    SELECT_UNSETTLED,
    SETTLED_AT,
    UPSERT,
    Row,
    decode,
    encode,
)
from relax_gym_core.trials.records import Trial

logger = logging.getLogger("relax_gym.ledger")

RETRY_MIN_S: Final = 0.05
RETRY_MAX_S: Final = 2.0
CLOSE_ATTEMPTS: Final = 3  # failed writes tolerated while closing before the rest is given up
BUSY_TIMEOUT_S: Final = 30.0  # how long a write waits for another holder of the file's lock


class LedgerWriteError(StoreUnavailableError):
    """A batch could not be written: the transitions in it were not acknowledged (the next batch retries)."""

    kind = "ledger_unavailable"


@frozen
class _Written:
    settled_rows: int  # settled rows in the file after this batch
    evicted: int
    oldest_settled: float | None  # wall clock, after this batch (when it evicted; else unknown)
    evicted_ran: bool = False


def _connect(path: str, *, reader: bool) -> sqlite3.Connection:
    try:
        connection = sqlite3.connect(
            path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_S
        )
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=FULL")  # durable at commit, not only across process death
        if reader:
            connection.execute("PRAGMA query_only=1")
    except sqlite3.DatabaseError as exc:
        raise ConfigError(f"{path}: cannot open the trial ledger ({exc})") from None
    return connection


class LedgerStore:
    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock,
        wall_clock: Clock = time.time,
        tombstone_capacity: int = 100_000,
        fingerprint_key: bytes | None = None,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self._offset = wall_clock() - clock()  # monotonic (memory) <-> wall clock (disk)
        self._key = fingerprint_key
        self._on_close = on_close
        self._tombstone_capacity = tombstone_capacity
        self._writer = _connect(self.path, reader=False)
        self._init_schema()
        self._reader = _connect(self.path, reader=True)
        # Unsettled records live here; settled ones only until their batch is written.
        self._cache: dict[str, Trial] = {}
        try:
            self._restored = [decode(row, self._offset) for row in self._reader.execute(SELECT_UNSETTLED)]
        except (ValueError, TypeError, KeyError, sqlite3.DatabaseError) as exc:
            # Start no gateway on a ledger it cannot read: its unfinished trials would go unrecovered.
            raise ConfigError(f"{self.path}: unreadable trial record ({type(exc).__name__})") from None
        for trial in self._restored:
            self._cache[trial.request_id] = trial
        self._known = self._id_filter()  # ids the file may hold: "certainly not" needs no lookup
        self._absent: str | None = None  # the last id get() found nowhere, for is_tombstoned()
        self._count = self._scalar("SELECT COUNT(*) FROM trials")
        # Loop-side view of the settled rows (for when to ask the writer to evict), and the writer's own.
        self._settled_rows = self._w_settled = self._scalar(
            "SELECT COUNT(*) FROM trials WHERE settled_at IS NOT NULL"
        )
        self._oldest: float | None = self._reader.execute(
            "SELECT MIN(settled_at) FROM trials WHERE settled_at IS NOT NULL"
        ).fetchone()[0]
        self._w_tombstones = self._scalar("SELECT COUNT(*) FROM tombstones")
        self._dirty: dict[str, Trial] = {}  # changed since the batch being written was taken
        self._writing: dict[str, Trial] = {}  # the batch being written
        self._next: asyncio.Future[None] | None = None  # resolves when the next batch is written
        self._current: asyncio.Future[None] | None = None  # resolves when `_writing` is written
        self._eviction: tuple[float, int] | None = None  # (wall-clock horizon, max_retained) asked for
        self._evicted = 0  # evicted by the writer, not yet reported to the book
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._problem: str | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="relax-gym-ledger")

    def _init_schema(self) -> None:
        try:
            for statement in SCHEMA:
                self._writer.execute(statement)
            self._writer.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema', ?)", (str(SCHEMA_VERSION),)
            )
            found = self._writer.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()[0]
            while found in MIGRATIONS:  # an older ledger: brought up to date, one version at a time
                migrated = str(int(found) + 1)
                self._writer.execute("BEGIN IMMEDIATE")
                self._writer.execute(MIGRATIONS[found])
                self._writer.execute("UPDATE meta SET value = ? WHERE key = 'schema'", (migrated,))
                self._writer.execute("COMMIT")
                found = migrated
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"{self.path}: not a usable trial ledger ({exc})") from None
        if found != str(SCHEMA_VERSION):
            raise ConfigError(f"{self.path}: ledger schema {found} is not {SCHEMA_VERSION}")

    def _id_filter(self) -> IdFilter:
        ids = self._reader.execute(
            "SELECT request_id FROM trials UNION ALL SELECT request_id FROM tombstones"
        )
        return IdFilter(row[0] for row in ids)

    def _scalar(self, sql: str) -> int:
        value: int = self._writer.execute(sql).fetchone()[0]
        return value

    # ---- TrialStore: what the book calls ----------------------------------------------------------

    def get(self, request_id: str) -> Trial | None:
        trial = self._cache.get(request_id)
        if trial is not None:
            return trial
        if request_id not in self._known:
            self._absent = request_id  # never recorded: neither a row nor a tombstone
            return None
        row = self._reader.execute(SELECT_ONE, (request_id,)).fetchone()
        return None if row is None else decode(row, self._offset)

    def add(self, trial: Trial) -> None:
        self._cache[trial.request_id] = trial
        self._count += 1
        if self._known.full:
            self._known = self._id_filter()  # what the file still holds; retention bounds it
        self._known.add(trial.request_id)
        self._absent = None

    def changed(self, trial: Trial) -> None:
        self._dirty[trial.request_id] = trial
        self._wake.set()

    def live(self) -> list[Trial]:
        return [trial for trial in self._cache.values() if trial.cleanup is CleanupState.PENDING]

    def restored(self) -> list[Trial]:
        restored, self._restored = self._restored, []
        return restored

    def evict(self, settled_before: float, max_retained: int) -> int:
        horizon = settled_before + self._offset
        if (self._oldest is not None and self._oldest <= horizon) or self._settled_rows > max_retained:
            self._eviction = (horizon, max_retained)
            self._wake.set()
        evicted, self._evicted = self._evicted, 0
        return evicted

    def is_tombstoned(self, request_id: str) -> bool:
        if request_id == self._absent or request_id not in self._known:
            return False
        found = self._reader.execute("SELECT 1 FROM tombstones WHERE request_id = ?", (request_id,))
        return found.fetchone() is not None

    def __len__(self) -> int:
        return self._count

    @property
    def fingerprint_key(self) -> bytes | None:
        return self._key

    # ---- TrialStore: what the service calls -------------------------------------------------------

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="relax-gym-ledger")

    def unwritten(self, request_id: str) -> Awaitable[None] | None:
        if request_id in self._dirty:
            if self._next is None:
                self._next = self._new_future()
            return asyncio.shield(self._next)  # one waiter cancelled must not cancel the others
        if request_id in self._writing:
            if self._current is None:
                self._current = self._new_future()
            return asyncio.shield(self._current)
        return None

    def _new_future(self) -> asyncio.Future[None]:
        if self._task is None:
            raise RuntimeError("the trial ledger has not been started")
        return asyncio.get_running_loop().create_future()

    def problem(self) -> str | None:
        return self._problem

    async def close(self) -> None:
        """Write what is left (a few attempts if writes fail), then close the file and release the lock."""
        if self._closing:
            return
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task
        else:
            self.flush_sync()
        self._executor.shutdown(wait=True)
        self._reader.close()
        self._writer.close()
        if self._on_close is not None:
            self._on_close()

    def flush_sync(self) -> None:
        """Write everything changed so far on the calling thread: for code that drives the book without an
        event loop (tests, tools). Never while the flusher runs."""
        if self._task is not None and not self._task.done():
            raise RuntimeError("flush_sync while the ledger's flusher is running")
        while self._dirty or self._eviction is not None:
            _, rows, eviction = self._take()
            self._done(rows, self._write(rows, eviction))

    # ---- the flusher -------------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        delay, failures = RETRY_MIN_S, 0
        while True:
            if not self._dirty and self._eviction is None:
                if self._closing:
                    return
                await self._wake.wait()
                self._wake.clear()
                continue
            batch, rows, eviction = self._take()
            try:
                written = await loop.run_in_executor(self._executor, self._write, rows, eviction)
            except Exception as exc:  # noqa: BLE001 - reported to waiters and readiness, then retried
                self._failed(batch, eviction, exc)
                written = None
            if written is not None:
                delay, failures = RETRY_MIN_S, 0
                self._done(rows, written)
                continue
            failures += 1
            if self._closing and failures >= CLOSE_ATTEMPTS:
                logger.error("trial ledger closed with %d trial change(s) not written", len(self._dirty))
                return
            await asyncio.sleep(delay)
            delay = min(2 * delay, RETRY_MAX_S)

    def _take(self) -> tuple[dict[str, Trial], list[Row], tuple[float, int] | None]:
        batch, self._dirty = self._dirty, {}
        self._writing = batch
        self._current, self._next = self._next, None
        eviction, self._eviction = self._eviction, None
        return batch, [encode(trial, self._offset) for trial in batch.values()], eviction

    def _done(self, rows: list[Row], written: _Written) -> None:
        self._problem = None
        for row in rows:  # what was written, not what the records have become since
            settled_at = row[SETTLED_AT]
            if settled_at is not None:
                self._oldest = settled_at if self._oldest is None else min(self._oldest, settled_at)
                if row[0] not in self._dirty:
                    self._cache.pop(row[0], None)  # answered from the file from now on
        self._settled_rows = written.settled_rows
        if written.evicted_ran:
            self._oldest = written.oldest_settled  # exact: what is left after this batch
            self._count -= written.evicted
            self._evicted += written.evicted
        self._writing = {}
        waiter, self._current = self._current, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _failed(self, batch: dict[str, Trial], eviction: tuple[float, int] | None, exc: Exception) -> None:
        # Nothing of the batch is known written: it goes back in front of what changed since (the same
        # record objects, so the newer state wins), and its waiters learn it was not acknowledged.
        self._dirty = {**batch, **self._dirty}
        if self._eviction is None:
            self._eviction = eviction
        self._writing = {}
        self._problem = f"trial ledger write failing ({type(exc).__name__})"
        logger.error("trial ledger %s: write failed (%s: %s); retrying", self.path, type(exc).__name__, exc)
        waiter, self._current = self._current, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(LedgerWriteError("the trial ledger could not be written"))
            waiter.exception()  # retrieved here: a waiter that went away must not log it again

    # ---- the writer thread -------------------------------------------------------------------------

    def _write(self, rows: list[Row], eviction: tuple[float, int] | None) -> _Written:
        connection = self._writer
        connection.execute("BEGIN IMMEDIATE")
        try:
            connection.executemany(UPSERT, rows)
            # A record settles once and is not written again after (nothing changes it), so counting
            # settled rows as they are written stays exact enough; eviction recounts when it matters.
            settled = self._w_settled + sum(1 for row in rows if row[SETTLED_AT] is not None)
            evicted, oldest = 0, None
            if eviction is not None:
                evicted, settled, oldest = self._evict(connection, settled, *eviction)
            connection.execute("COMMIT")
        except BaseException:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise
        self._w_settled = settled
        return _Written(
            settled_rows=settled, evicted=evicted, oldest_settled=oldest, evicted_ran=eviction is not None
        )

    def _evict(
        self, connection: sqlite3.Connection, settled: int, horizon: float, max_retained: int
    ) -> tuple[int, int, float | None]:
        """Delete expired settled rows (and the oldest beyond max_retained), tombstoning their ids.
        Returns (evicted, settled rows left, oldest settled_at left)."""
        ids = [
            row[0]
            for row in connection.execute(
                "SELECT request_id FROM trials WHERE settled_at IS NOT NULL AND settled_at <= ?", (horizon,)
            )
        ]
        if settled - len(ids) > max_retained:
            settled = connection.execute(
                "SELECT COUNT(*) FROM trials WHERE settled_at IS NOT NULL"
            ).fetchone()[0]
            excess = settled - len(ids) - max_retained
            if excess > 0:
                ids += [
                    row[0]
                    for row in connection.execute(
                        "SELECT request_id FROM trials WHERE settled_at > ? ORDER BY settled_at LIMIT ?",
                        (horizon, excess),
                    )
                ]
        if ids:
            now = time.time()
            connection.executemany("DELETE FROM trials WHERE request_id = ?", [(i,) for i in ids])
            connection.executemany(
                "INSERT OR REPLACE INTO tombstones (request_id, at) VALUES (?, ?)", [(i, now) for i in ids]
            )
            self._w_tombstones += len(ids)
            if self._w_tombstones > self._tombstone_capacity:
                connection.execute(
                    "DELETE FROM tombstones WHERE rowid IN "
                    "(SELECT rowid FROM tombstones ORDER BY rowid LIMIT ?)",
                    (self._w_tombstones - self._tombstone_capacity,),
                )
                self._w_tombstones = self._tombstone_capacity
        oldest = connection.execute(
            "SELECT MIN(settled_at) FROM trials WHERE settled_at IS NOT NULL"
        ).fetchone()[0]
        return len(ids), settled - len(ids), oldest
