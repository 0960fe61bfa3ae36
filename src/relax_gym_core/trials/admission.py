"""Admission per registered (environment, config): its policy, the checks, the FIFO queue and the slots.

Only counters and a queue: the trial book decides when a trial moves between them. A trial is admitted
while queued + running < max_concurrency + queue_capacity. A slot (one of max_concurrency) is held from
start until cleanup is settled, so a remote sandbox still being torn down is never over-subscribed; a
trial that is only cleaning up holds its slot but no longer counts against the queue.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Protocol

from attrs import frozen

from relax_gym_core.errors import (
    DeadlineTooLongError,
    EnvironmentNotRegisteredError,
    PolicyMismatchError,
    QueueFullError,
)
from relax_gym_core.plugin.environment import (
    DEFAULT_INTERRUPT_POLICY,
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_MAX_DEADLINE_S,
    DEFAULT_QUEUE_CAPACITY,
)
from relax_gym_core.plugin.specs import EnvKey
from relax_gym_core.protocol import CreateTrialRequest, InterruptPolicy


class AdmissionLimits(Protocol):
    """Anything that carries an environment's admission limits (an EnvironmentDefinition, a spec)."""

    @property
    def interrupt_policy(self) -> InterruptPolicy: ...
    @property
    def max_deadline_s(self) -> float: ...
    @property
    def max_concurrency(self) -> int: ...
    @property
    def queue_capacity(self) -> int: ...


@frozen(kw_only=True)
class Admission:
    """Admission policy of one registered (environment, config); the defaults are the reference's."""

    max_concurrency: int = DEFAULT_MAX_CONCURRENCY
    queue_capacity: int = DEFAULT_QUEUE_CAPACITY
    max_deadline_s: float = DEFAULT_MAX_DEADLINE_S
    interrupt_policy: InterruptPolicy = DEFAULT_INTERRUPT_POLICY

    @classmethod
    def of(cls, limits: AdmissionLimits) -> Admission:
        return cls(
            max_concurrency=limits.max_concurrency,
            queue_capacity=limits.queue_capacity,
            max_deadline_s=limits.max_deadline_s,
            interrupt_policy=limits.interrupt_policy,
        )


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
