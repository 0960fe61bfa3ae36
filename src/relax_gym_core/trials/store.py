"""Where trial records live. A narrow interface so a durable ledger can replace the in-memory one."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Protocol

from relax_gym_core.trials.records import Trial


class TrialStore(Protocol):
    def get(self, request_id: str) -> Trial | None: ...

    def add(self, trial: Trial) -> None: ...

    def remove(self, request_id: str) -> None:
        """Forget an evicted record, leaving a tombstone so its id reads as expired, not unknown."""
        ...

    def is_tombstoned(self, request_id: str) -> bool: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Trial]: ...


class MemoryStore:
    """Records in a dict; tombstones of evicted ids in a bounded FIFO (memory stays flat)."""

    def __init__(self, *, tombstone_capacity: int = 100_000) -> None:
        self._trials: dict[str, Trial] = {}
        self._tombstones: OrderedDict[str, None] = OrderedDict()
        self._tombstone_capacity = tombstone_capacity

    def get(self, request_id: str) -> Trial | None:
        return self._trials.get(request_id)

    def add(self, trial: Trial) -> None:
        self._trials[trial.request_id] = trial
        self._tombstones.pop(trial.request_id, None)

    def remove(self, request_id: str) -> None:
        if self._trials.pop(request_id, None) is None:
            return
        self._tombstones[request_id] = None
        if len(self._tombstones) > self._tombstone_capacity:
            self._tombstones.popitem(last=False)

    def is_tombstoned(self, request_id: str) -> bool:
        return request_id in self._tombstones

    def __len__(self) -> int:
        return len(self._trials)

    def __iter__(self) -> Iterator[Trial]:
        return iter(list(self._trials.values()))
