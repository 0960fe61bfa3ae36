"""Admission per registered (environment, config): the policy checks, the FIFO queue and the slot counts.

Only counters and a queue: the trial book decides when a trial moves between them. A trial is admitted
while queued + running < max_concurrency + queue_capacity. A slot (one of max_concurrency) is held from
start until cleanup is settled, so a remote sandbox still being torn down is never over-subscribed; a
trial that is only cleaning up holds its slot but no longer counts against the queue.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from relax_gym_core.errors import (
    DeadlineTooLongError,
    EnvironmentNotRegisteredError,
    PolicyMismatchError,
    QueueFullError,
)
from relax_gym_core.plugin.environment import Admission, EnvKey
from relax_gym_core.protocol import CreateTrialRequest


class EnvLine:
    """The queue and counters of one (environment, config)."""

    __slots__ = ("admission", "key", "queue", "queued", "running", "slots_held")

    def __init__(self, key: EnvKey, admission: Admission) -> None:
        self.key = key
        self.admission = admission
        # (request_id, rollout_id) waiting for a slot, FIFO. Cancelled entries are skipped lazily; the
        # rollout id tells a stale entry from a new trial that reuses an evicted request_id.
        self.queue: deque[tuple[str, str]] = deque()
        self.queued = 0  # active trials in the queue
        self.running = 0  # active trials holding a slot
        self.slots_held = 0  # running + finished/cancelling trials whose cleanup is not settled

    @property
    def full(self) -> bool:
        return self.queued + self.running >= self.admission.max_concurrency + self.admission.queue_capacity

    def enqueue(self, request_id: str, rollout_id: str) -> None:
        self.queue.append((request_id, rollout_id))
        self.queued += 1

    def next_waiting(self) -> tuple[str, str] | None:
        """Pop the oldest queue entry if a slot is free. The entry may be stale: the caller checks it."""
        if self.queue and self.slots_held < self.admission.max_concurrency:
            return self.queue.popleft()
        return None

    def take_slot(self) -> None:
        self.queued -= 1
        self.running += 1
        self.slots_held += 1

    def leave_queue(self) -> None:
        self.queued -= 1  # its queue entry stays and is skipped when reached

    def stop_running(self) -> None:
        self.running -= 1  # the slot stays held until cleanup is settled

    def free_slot(self) -> None:
        self.slots_held -= 1

    def hold_slot(self) -> None:
        self.slots_held += 1  # a recovered trial: its environment may still hold the run's resources


class Admissions(dict[EnvKey, EnvLine]):
    """The line of every registered (environment, config), by key (a dict: lookups are on the hot path)."""

    def __init__(self, environments: Mapping[EnvKey, Admission], *, retry_after_s: float) -> None:
        super().__init__((key, EnvLine(key, admission)) for key, admission in environments.items())
        self._retry_after_s = retry_after_s
        # A request naming no config names its environment's (the client's default, reference §5.2): an
        # environment registered under one config of another name (mcqa's mcqa-v1) is found by its name.
        configs: dict[str, list[EnvKey]] = {}
        for key in self:
            configs.setdefault(key[0], []).append(key)
        self._only: dict[str, EnvLine] = {
            name: self[keys[0]]
            for name, keys in configs.items()
            if len(keys) == 1 and (name, name) not in self
        }

    @property
    def policies(self) -> Mapping[EnvKey, Admission]:
        return {key: line.admission for key, line in self.items()}

    def resolve(self, request: CreateTrialRequest) -> EnvLine:
        """The line of a request's registered environment; raises the reference's 400 errors."""
        name, config = request.environment.name, request.environment.config
        line = self.get((name, config)) or (self._only.get(name) if config == name else None)
        if line is None:
            raise EnvironmentNotRegisteredError("environment/config is not registered")
        if request.interrupt_policy != line.admission.interrupt_policy:
            raise PolicyMismatchError("interrupt_policy does not match the registered environment capability")
        if request.deadline_s > line.admission.max_deadline_s:
            raise DeadlineTooLongError("deadline_s exceeds the registered environment maximum")
        return line

    def check_room(self, line: EnvLine) -> None:
        """The 429: the line has no room for one more active trial."""
        if line.full:
            raise QueueFullError("environment queue is full", retry_after_s=self._retry_after_s)
