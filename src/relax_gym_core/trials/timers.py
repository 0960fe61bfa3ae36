"""Deadlines and leases: one min-heap of due times, so a janitor scan costs what fell due, never what is
merely alive. Entries are not removed one by one: a timer of a trial that stopped being active, or a lease
that was renewed, is stale and skipped when it falls due; the heap is rebuilt without the timers of
inactive trials once they outnumber the rest, so memory follows the active trials, not the trials seen."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

from relax_gym_core.trials.records import Cause, Trial

RETRIES = 3  # attempts per request id before a record whose check raises is dropped
RETRY_DELAY_S = 1.0
MIN_COMPACT = 1024  # below this many entries a rebuild is not worth it


def overdue_cause(trial: Trial, now: float) -> Cause | None:
    """Why a trial must be cancelled now, if it must; the deadline is checked first."""
    if now >= trial.deadline_at:
        return Cause.DEADLINE_EXCEEDED
    if now >= trial.lease_expires_at:
        return Cause.LEASE_EXPIRED
    return None


class Timers:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, str]] = []  # (due_at, seq, request_id)
        self._seq = itertools.count()  # ties keep arming order and never compare request ids
        self._failures: dict[str, int] = {}  # request_id -> failed attempts, while it keeps failing
        self._armed: set[str] = set()  # ids whose timers still matter: trials that are active
        self._compact_at = MIN_COMPACT

    def __len__(self) -> int:
        return len(self._heap)

    def arm(self, due_at: float, request_id: str) -> None:
        heapq.heappush(self._heap, (due_at, next(self._seq), request_id))
        self._armed.add(request_id)
        if len(self._heap) >= self._compact_at:
            self._compact()

    def disarm(self, request_id: str) -> None:
        """The trial stopped being active: its timers are stale from now on."""
        self._armed.discard(request_id)

    def _compact(self) -> None:
        armed = self._armed
        self._heap = [entry for entry in self._heap if entry[2] in armed]
        heapq.heapify(self._heap)
        # Renewed leases of active trials survive a rebuild: waiting for the heap to double again keeps
        # the cost amortised O(1) per arm whatever the mix.
        self._compact_at = max(MIN_COMPACT, 2 * len(self._heap))

    def next_due(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def expire(self, now: float, fire: Callable[[str], None]) -> list[tuple[str, Exception]]:
        """Call fire(request_id) for every timer of an active trial due by now; return the (request_id,
        error) it raised.

        A failing id is re-armed a little later, up to RETRIES attempts counted per id (not per timer),
        then dropped: one bad record must not wedge the janitor forever.
        """
        heap = self._heap
        errors: list[tuple[str, Exception]] = []
        retry: list[str] = []
        while heap and heap[0][0] <= now:
            _, _, request_id = heapq.heappop(heap)
            if request_id not in self._armed:
                continue  # its trial is no longer active: nothing to look up
            try:
                fire(request_id)
            except Exception as exc:  # noqa: BLE001 - reported to the janitor, which logs and recovers
                errors.append((request_id, exc))
                attempts = self._failures.get(request_id, 0) + 1
                self._failures[request_id] = attempts
                if attempts < RETRIES and request_id not in retry:
                    retry.append(request_id)
                continue
            if self._failures:
                self._failures.pop(request_id, None)  # the record reads fine again
        for request_id in retry:
            self.arm(now + RETRY_DELAY_S, request_id)
        return errors
