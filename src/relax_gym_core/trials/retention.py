"""Retention of settled terminal records in memory (MemoryStore): kept until settled before the horizon,
at most max_retained, then evicted oldest first, so memory stays flat however many trials have finished.
The ledger does the same in SQL (trials/ledger.py)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from relax_gym_core.protocol import CleanupState
from relax_gym_core.trials.records import Phase, Trial


class Retention:
    def __init__(self) -> None:
        self._settled: deque[tuple[float, str]] = deque()  # (settled_at, request_id) in settle order

    def settled(self, at: float, request_id: str) -> None:
        self._settled.append((at, request_id))

    def evict(
        self,
        get: Callable[[str], Trial | None],
        remove: Callable[[str], None],
        *,
        settled_before: float,
        max_retained: int,
    ) -> int:
        """Remove records settled at or before `settled_before`, or beyond max_retained. Returns how many."""
        settled = self._settled
        evicted = 0
        while settled and (settled[0][0] <= settled_before or len(settled) > max_retained):
            _, request_id = settled.popleft()
            trial = get(request_id)
            # The store is the source of truth: only a settled terminal record may go.
            if (
                trial is not None
                and trial.phase is Phase.TERMINAL
                and trial.cleanup is not CleanupState.PENDING
            ):
                remove(request_id)
                evicted += 1
        return evicted
