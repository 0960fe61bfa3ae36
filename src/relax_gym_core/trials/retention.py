"""Retention of settled terminal records: kept for retention_s, at most max_retained, then evicted oldest
first, so memory stays flat however many trials have finished. The store tombstones evicted ids."""

from __future__ import annotations

from collections import deque

from relax_gym_core.protocol import CleanupState
from relax_gym_core.trials.records import Phase
from relax_gym_core.trials.store import TrialStore


class Retention:
    def __init__(self, *, retention_s: float, max_retained: int) -> None:
        self._retention_s = retention_s
        self._max_retained = max_retained
        self._settled: deque[tuple[float, str]] = deque()  # (settled_at, request_id) in settle order
        self.evicted_total = 0

    def settled(self, at: float, request_id: str) -> None:
        self._settled.append((at, request_id))

    def evict(self, store: TrialStore, now: float) -> int:
        """Remove records settled before now - retention_s, or beyond max_retained. Returns how many."""
        horizon = now - self._retention_s
        settled = self._settled
        evicted = 0
        while settled and (settled[0][0] <= horizon or len(settled) > self._max_retained):
            _, request_id = settled.popleft()
            trial = store.get(request_id)
            # The store is the source of truth: only a settled terminal record may go.
            if (
                trial is not None
                and trial.phase is Phase.TERMINAL
                and trial.cleanup is not CleanupState.PENDING
            ):
                store.remove(request_id)
                evicted += 1
        self.evicted_total += evicted
        return evicted
