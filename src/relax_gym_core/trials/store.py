"""Where trial records live: a narrow interface, so the in-memory store, the SQLite ledger
(trials/ledger.py) or a networked one can sit under the trial book without it noticing.

The book (synchronous, I/O-free) calls the first group and only ever *records* what changed; a durable
store writes those changes in batches on its own time. The service calls the second group: it starts and
stops the store, and waits for `unwritten(request_id)` before acknowledging a transition to anyone (the
202 of a create or an abort, a poll), so nothing acknowledged is lost by a crash.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Iterable
from typing import Protocol

from relax_gym_core.protocol import CleanupState
from relax_gym_core.trials.records import Trial
from relax_gym_core.trials.retention import Retention


class TrialStore(Protocol):
    # ---- what the book calls (synchronous) ----

    def get(self, request_id: str) -> Trial | None:
        """The record, live or finished; None if unknown or evicted."""
        ...

    def add(self, trial: Trial) -> None:
        """A new trial (followed by changed())."""
        ...

    def changed(self, trial: Trial) -> None:
        """A transition changed this record. A durable store writes it before unwritten() resolves."""
        ...

    def live(self) -> Iterable[Trial]:
        """Every record whose cleanup is not settled (active, cancelling, or terminal with cleanup
        pending)."""
        ...

    def restored(self) -> list[Trial]:
        """The unsettled records a previous process left behind (read when the store was opened; the
        book's recover() takes them once, at start)."""
        ...

    def evict(self, settled_before: float, max_retained: int) -> int:
        """Forget settled records settled at or before `settled_before` (book clock), and the oldest beyond
        max_retained, leaving tombstones so their ids read as expired. Returns how many went (a store
        that evicts in the background may report them on a later call)."""
        ...

    def is_tombstoned(self, request_id: str) -> bool: ...

    def __len__(self) -> int: ...

    @property
    def fingerprint_key(self) -> bytes | None:
        """The key recorded replay fingerprints are made with, when they must outlive this process."""
        ...

    # ---- what the service calls ----

    async def start(self) -> None: ...

    async def close(self) -> None:
        """Write everything changed so far, then release the store."""
        ...

    def unwritten(self, request_id: str) -> Awaitable[None] | None:
        """What to await before this trial's state so far may be acknowledged; None when it already may."""
        ...

    def problem(self) -> str | None:
        """Why the store cannot write right now (for readiness), or None."""
        ...


class MemoryStore:
    """Records in a dict; tombstones of evicted ids in a bounded FIFO (memory stays flat). Nothing
    survives the process: `--state-dir :memory:`."""

    def __init__(self, *, tombstone_capacity: int = 100_000) -> None:
        self._trials: dict[str, Trial] = {}
        self._tombstones: OrderedDict[str, None] = OrderedDict()
        self._tombstone_capacity = tombstone_capacity
        self._retention = Retention()

    def get(self, request_id: str) -> Trial | None:
        return self._trials.get(request_id)

    def add(self, trial: Trial) -> None:
        self._trials[trial.request_id] = trial
        self._tombstones.pop(trial.request_id, None)

    def changed(self, trial: Trial) -> None:
        # A record settles exactly once (the book's _settle), and nothing changes it afterwards.
        if trial.cleanup is not CleanupState.PENDING and trial.settled_at is not None:
            self._retention.settled(trial.settled_at, trial.request_id)

    def live(self) -> list[Trial]:
        return [trial for trial in self._trials.values() if trial.cleanup is CleanupState.PENDING]

    def restored(self) -> list[Trial]:
        return []

    def evict(self, settled_before: float, max_retained: int) -> int:
        return self._retention.evict(
            self._trials.get, self.remove, settled_before=settled_before, max_retained=max_retained
        )

    def remove(self, request_id: str) -> None:
        """Forget an evicted record, leaving a tombstone so its id reads as expired, not unknown."""
        if self._trials.pop(request_id, None) is None:
            return
        self._tombstones[request_id] = None
        if len(self._tombstones) > self._tombstone_capacity:
            self._tombstones.popitem(last=False)

    def is_tombstoned(self, request_id: str) -> bool:
        return request_id in self._tombstones

    def __len__(self) -> int:
        return len(self._trials)

    @property
    def fingerprint_key(self) -> bytes | None:
        return None  # records die with the process: a per-process key will do

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def unwritten(self, request_id: str) -> Awaitable[None] | None:
        return None

    def problem(self) -> str | None:
        return None
