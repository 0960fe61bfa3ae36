"""TrialBook: the trial state machine. Synchronous and I/O-free; clock and store are arguments.

Every method runs to completion without awaiting, so on one event loop each transition is atomic and
"first terminal transition wins" holds without locks. The async TrialService drives runs and reports
back here; the Hypothesis state machine in tests drives this class directly with a fake clock.

Admission per (environment, config): a trial is admitted while queued + running < max_concurrency +
queue_capacity. A slot (one of max_concurrency) is held from start until cleanup is confirmed or given
up, so a remote sandbox that is still being torn down is never over-subscribed; a trial that is only
cleaning up holds its slot but no longer counts against the queue.
"""

from __future__ import annotations

import heapq
import itertools
import secrets
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from enum import Enum
from typing import Any

import attrs
from attrs import define, field

from relax_gym_core.errors import (
    CapabilityUnavailableError,
    DeadlineTooLongError,
    EnvironmentNotRegisteredError,
    PolicyMismatchError,
    QueueFullError,
    ServiceClosingError,
    TrialConflictError,
    TrialExpiredError,
    TrialNotFoundError,
)
from relax_gym_core.observe import Observers, Transition, TrialEvent
from relax_gym_core.protocol import (
    PROTOCOL_VERSION,
    CleanupState,
    CreateTrialRequest,
    TrialSnapshot,
    TrialStatus,
    unstructure,
)
from relax_gym_core.protocol.jsonutil import Fingerprinter
from relax_gym_core.runtimes.base import CleanupResult, RunResult
from relax_gym_core.trials.records import Admission, Cause, EnvKey, Phase, Trial
from relax_gym_core.trials.store import TrialStore

type Clock = Callable[[], float]
_TIMER_RETRIES = 3


class Cancel(Enum):
    """What begin_cancel did, so the caller knows whether a cleanup ladder must run."""

    IGNORED = "ignored"  # not active any more: first terminal transition already won
    FINISHED = "finished"  # never started: terminal at once, nothing to clean
    NEEDS_CLEANUP = "needs_cleanup"  # started: run the cleanup ladder, then finish_cleanup()


@define(slots=True)
class _EnvState:
    admission: Admission
    # (request_id, rollout_id) waiting for a slot, FIFO. Cancelled entries are skipped lazily; the rollout
    # id tells a stale entry from a new trial that reuses an evicted request_id.
    queue: deque[tuple[str, str]] = field(factory=deque)
    queued: int = 0  # active trials in the queue
    running: int = 0  # active trials holding a slot
    slots_held: int = 0  # running + finished/cancelling trials whose cleanup is not settled


def _random_rollout_id() -> str:
    # 128 random bits: possession of a live id lets a caller spend the session's token through the bridge.
    return f"{secrets.token_hex(16)}-0"


def _fingerprint_body(request: CreateTrialRequest) -> dict[str, Any]:
    # A refreshed token (same trial, new api_key) must replay, not conflict.
    body: dict[str, Any] = unstructure(request)
    body["model_endpoint"].pop("api_key", None)
    return body


class TrialBook:
    def __init__(
        self,
        *,
        clock: Clock,
        store: TrialStore,
        environments: Mapping[EnvKey, Admission],
        retention_s: float = 600.0,
        max_retained: int = 100_000,
        fingerprint_key: bytes | None = None,
        new_rollout_id: Callable[[], str] | None = None,
        retry_after_s: float = 1.0,
        observers: Observers | None = None,
    ) -> None:
        self._clock = clock
        self._observers = observers or Observers()
        self._store = store
        self._envs = {key: _EnvState(admission) for key, admission in environments.items()}
        self._retention_s = retention_s
        self._max_retained = max_retained
        self._fingerprint = Fingerprinter(fingerprint_key or secrets.token_bytes(32))
        self._new_rollout_id = new_rollout_id or _random_rollout_id
        self._retry_after_s = retry_after_s
        self._capabilities: dict[str, str] = {}  # rollout_id -> request_id, active trials only
        self._timers: list[tuple[float, int, str]] = []  # (due_at, seq, request_id): deadlines and leases
        self._seq = itertools.count()
        self._finished: deque[tuple[float, str]] = deque()  # (settled_at, request_id) in settle order
        self._timer_failures: dict[str, int] = {}
        self._closing = False
        self.created_total = 0
        self.active = 0
        self.evicted_total = 0

    # ---- queries ------------------------------------------------------------------------------------

    def now(self) -> float:
        return self._clock()

    @property
    def environments(self) -> Mapping[EnvKey, Admission]:
        return {key: state.admission for key, state in self._envs.items()}

    def get(self, request_id: str) -> Trial:
        trial = self._store.get(request_id)
        if trial is not None:
            return trial
        if self._store.is_tombstoned(request_id):
            raise TrialExpiredError(
                "trial expired: its terminal record was evicted after the retention period"
            )
        raise TrialNotFoundError("trial not found")

    def terminal_count(self) -> int:
        return len(self._store) - self.active

    def env_counts(self, key: EnvKey) -> tuple[int, int, int]:
        """(queued, running, slots_held) of one environment."""
        state = self._envs[key]
        return state.queued, state.running, state.slots_held

    def active_trials(self) -> list[Trial]:
        return [trial for trial in self._store if trial.phase is Phase.ACTIVE]

    @staticmethod
    def snapshot(trial: Trial) -> TrialSnapshot:
        return TrialSnapshot(
            protocol_version=PROTOCOL_VERSION,
            request_id=trial.request_id,
            status=trial.status,
            reward=trial.reward,
            metrics=trial.metrics or {},
            artifact_ref=trial.artifact_ref,
            error=trial.error,
            cleanup=trial.cleanup,
        )

    # ---- create / renew -----------------------------------------------------------------------------

    def admission_for(self, request: CreateTrialRequest) -> Admission:
        """Resolve and check the registered environment; raises the reference's 400 errors."""
        key = (request.environment.name, request.environment.config)
        state = self._envs.get(key)
        if state is None:
            raise EnvironmentNotRegisteredError("environment/config is not registered")
        if request.interrupt_policy != state.admission.interrupt_policy:
            raise PolicyMismatchError("interrupt_policy does not match the registered environment capability")
        if request.deadline_s > state.admission.max_deadline_s:
            raise DeadlineTooLongError("deadline_s exceeds the registered environment maximum")
        return state.admission

    def create(self, request: CreateTrialRequest) -> tuple[Trial, bool]:
        """Admit a new trial, or return the existing one for an identical replay. (trial, created)."""
        self.admission_for(request)
        fingerprint = self._fingerprint(_fingerprint_body(request))
        existing = self._store.get(request.request_id)
        if existing is not None:
            if not Fingerprinter.same(existing.fingerprint, fingerprint):
                raise TrialConflictError("request_id already exists with a different payload")
            if existing.phase is Phase.ACTIVE:
                existing.request = request  # a refreshed token is used from now on
            return existing, False
        if self._store.is_tombstoned(request.request_id):
            raise TrialConflictError("request_id belongs to a trial that has expired; use a new request_id")
        if self._closing:
            raise ServiceClosingError("gateway is shutting down")
        key = (request.environment.name, request.environment.config)
        state = self._envs[key]
        if state.queued + state.running >= state.admission.max_concurrency + state.admission.queue_capacity:
            raise QueueFullError("environment queue is full", retry_after_s=self._retry_after_s)
        now = self._clock()
        trial = Trial(
            request_id=request.request_id,
            env=key,
            rollout_id=self._new_rollout_id(),
            fingerprint=fingerprint,
            request=request,
            created_at=now,
            deadline_at=now + request.deadline_s,
            lease_expires_at=now + request.lease_s,
        )
        self._store.add(trial)
        self._capabilities[trial.rollout_id] = trial.request_id
        state.queue.append((trial.request_id, trial.rollout_id))
        state.queued += 1
        self._arm(trial.deadline_at, trial.request_id)
        self._arm(trial.lease_expires_at, trial.request_id)
        self.created_total += 1
        self.active += 1
        self._emit(TrialEvent.QUEUED, trial)
        return trial, True

    def renew(self, request_id: str) -> Cancel | None:
        """Extend the lease of an active trial; a no-op on any other trial (reference behaviour).

        A lease (or deadline) that already ran out is not revived: the trial is cancelled instead, and
        the Cancel is returned so the caller can run the cleanup.
        """
        trial = self.get(request_id)
        if trial.phase is not Phase.ACTIVE or trial.request is None:
            return None
        overdue = self.cancel_if_overdue(trial)
        if overdue is not None:
            return overdue
        trial.lease_expires_at = self._clock() + trial.request.lease_s
        self._arm(trial.lease_expires_at, request_id)
        return None

    # ---- starting -----------------------------------------------------------------------------------

    def drop_task(self, request_id: str) -> None:
        """Forget a running trial's task (its largest part) once the runtime has started with it."""
        trial = self._store.get(request_id)
        if trial is not None and trial.request is not None and trial.phase is Phase.ACTIVE:
            request = trial.request
            trial.request = attrs.evolve(request, environment=attrs.evolve(request.environment, task={}))

    def start_ready(self, keys: Iterable[EnvKey] | None = None) -> list[Trial]:
        """Move queued trials into free slots (FIFO) and return them; the caller starts their runs."""
        started: list[Trial] = []
        for key in self._envs if keys is None else keys:
            state = self._envs[key]
            while state.queue and state.slots_held < state.admission.max_concurrency:
                request_id, rollout_id = state.queue.popleft()
                trial = self._store.get(request_id)
                if trial is None or trial.rollout_id != rollout_id or trial.status is not TrialStatus.QUEUED:
                    continue
                trial.status = TrialStatus.RUNNING
                trial.holds_slot = True
                state.queued -= 1
                state.running += 1
                state.slots_held += 1
                started.append(trial)
                self._emit(TrialEvent.RUNNING, trial)
        return started

    # ---- finishing ----------------------------------------------------------------------------------

    def complete(self, request_id: str, result: RunResult) -> bool:
        """Record a run that finished on its own. False if something else already won."""
        trial = self._store.get(request_id)
        if trial is None or trial.phase is not Phase.ACTIVE or trial.status is not TrialStatus.RUNNING:
            return False
        trial.status = result.status
        trial.reward = result.reward
        trial.metrics = result.metrics
        trial.artifact_ref = result.artifact_ref
        trial.error = result.error
        self._to_terminal(trial)
        return True

    def begin_cancel(self, request_id: str, cause: Cause, *, detail: str | None = None) -> Cancel:
        trial = self._store.get(request_id)
        if trial is None or trial.phase is not Phase.ACTIVE:
            return Cancel.IGNORED
        trial.cause = cause
        trial.detail = detail
        self._capabilities.pop(trial.rollout_id, None)
        if trial.status is TrialStatus.QUEUED:
            self._envs[trial.env].queued -= 1  # its queue entry is skipped when reached
            trial.status = cause.target
            trial.error = {"code": cause.value}
            self._to_terminal(trial)
            self._settle(trial, CleanupState.CONFIRMED)
            return Cancel.FINISHED
        trial.phase = Phase.CANCELLING
        self._envs[trial.env].running -= 1
        self._emit(TrialEvent.CANCELLING, trial)
        return Cancel.NEEDS_CLEANUP

    def finish_cleanup(self, request_id: str, outcome: CleanupResult) -> bool:
        """Settle a trial's cleanup (after cancellation, or after a normal finish). Frees its slot."""
        trial = self._store.get(request_id)
        if trial is None or trial.cleanup is not CleanupState.PENDING or trial.phase is Phase.ACTIVE:
            return False
        code = outcome.error_code or "cleanup_unverified"
        state = (
            CleanupState.CONFIRMED
            if outcome.confirmed
            else CleanupState.UNVERIFIED
            if code == "cleanup_unverified"
            else CleanupState.FAILED
        )
        if trial.phase is Phase.CANCELLING:
            cause = trial.cause or Cause.ABORTED
            if outcome.confirmed:
                trial.status = cause.target
                trial.error = {"code": cause.value}
                if trial.detail is not None:
                    trial.error["kind"] = trial.detail
            else:
                trial.status = TrialStatus.FAILED
                trial.error = {"code": code, "type": "CleanupError", "cause": cause.value}
            self._to_terminal(trial)
        self._settle(trial, state)
        return True

    def _to_terminal(self, trial: Trial) -> None:
        if trial.phase is Phase.ACTIVE and trial.holds_slot:
            self._envs[trial.env].running -= 1
        trial.phase = Phase.TERMINAL
        trial.request = None  # the token and task go with it
        trial.finished_at = self._clock()
        self._capabilities.pop(trial.rollout_id, None)
        self.active -= 1
        self._emit(TrialEvent.TERMINAL, trial)

    def _settle(self, trial: Trial, state: CleanupState) -> None:
        trial.cleanup = state
        if trial.holds_slot:
            trial.holds_slot = False
            self._envs[trial.env].slots_held -= 1
        self._finished.append((self._clock(), trial.request_id))
        self._emit(TrialEvent.SETTLED, trial)

    def _emit(self, event: TrialEvent, trial: Trial) -> None:
        if not self._observers:
            return
        now = self._clock()
        previous, since = trial.last_event, trial.changed_at if trial.last_event else trial.created_at
        trial.last_event, trial.changed_at = event, now
        environment, config = trial.env
        self._observers.transition(
            Transition(
                event=event,
                request_id=trial.request_id,
                environment=environment,
                config=config,
                status=trial.status,
                cleanup=trial.cleanup,
                at=now,
                age_s=now - trial.created_at,
                previous=previous,
                phase_s=now - since,
            )
        )

    # ---- time ---------------------------------------------------------------------------------------

    def _arm(self, due_at: float, request_id: str) -> None:
        heapq.heappush(self._timers, (due_at, next(self._seq), request_id))

    def next_due(self) -> float | None:
        return self._timers[0][0] if self._timers else None

    def expire_due(self) -> tuple[list[tuple[Trial, Cancel]], list[tuple[str, Exception]]]:
        """Begin cancellation of every trial past its deadline (checked first) or lease.

        Cost is proportional to the timers that fell due, never to the number of trials. A record that
        raises is reported in the second list and retried a few times, then dropped: one bad record
        must not wedge the janitor forever.
        """
        now = self._clock()
        fired: list[tuple[Trial, Cancel]] = []
        errors: list[tuple[str, Exception]] = []
        retry: list[str] = []
        while self._timers and self._timers[0][0] <= now:
            _, _, request_id = heapq.heappop(self._timers)
            try:
                trial = self._store.get(request_id)
                if self._timer_failures:
                    self._timer_failures.pop(request_id, None)  # the record reads fine again
                if trial is None or trial.phase is not Phase.ACTIVE:
                    continue  # stale timer
                cause = self.overdue_cause(trial, now)
                if cause is not None:
                    fired.append((trial, self.begin_cancel(request_id, cause)))
            except Exception as exc:  # noqa: BLE001 - reported to the janitor, which logs and recovers
                errors.append((request_id, exc))
                attempts = self._timer_failures.get(request_id, 0) + 1
                self._timer_failures[request_id] = attempts  # counted per id, across its timers
                if attempts < _TIMER_RETRIES and request_id not in retry:
                    retry.append(request_id)
        for request_id in retry:
            self._arm(now + 1.0, request_id)
        return fired, errors

    @staticmethod
    def overdue_cause(trial: Trial, now: float) -> Cause | None:
        if now >= trial.deadline_at:
            return Cause.DEADLINE_EXCEEDED
        if now >= trial.lease_expires_at:
            return Cause.LEASE_EXPIRED
        return None

    def evict_expired(self) -> int:
        """Forget settled terminal records older than the retention period, or beyond max_retained
        (oldest first), so memory stays flat however many trials have finished. Returns how many."""
        horizon = self._clock() - self._retention_s
        evicted = 0
        while self._finished and (
            self._finished[0][0] <= horizon or len(self._finished) > self._max_retained
        ):
            _, request_id = self._finished.popleft()
            trial = self._store.get(request_id)
            if (
                trial is not None
                and trial.phase is Phase.TERMINAL
                and trial.cleanup is not CleanupState.PENDING
            ):
                self._store.remove(request_id)
                evicted += 1
        self.evicted_total += evicted
        return evicted

    # ---- capabilities -------------------------------------------------------------------------------

    def capability(self, rollout_id: str) -> Trial:
        """The active trial behind a rollout capability, or CapabilityUnavailableError."""
        request_id = self._capabilities.get(rollout_id)
        trial = self._store.get(request_id) if request_id is not None else None
        if trial is None or trial.phase is not Phase.ACTIVE:
            raise CapabilityUnavailableError("callback capability is unavailable")
        return trial

    def cancel_if_overdue(self, trial: Trial) -> Cancel | None:
        """Begin cancelling a trial found past its deadline or lease (e.g. by a late callback)."""
        cause = self.overdue_cause(trial, self._clock())
        return None if cause is None else self.begin_cancel(trial.request_id, cause)

    def has_capability(self, rollout_id: str) -> bool:
        return rollout_id in self._capabilities

    # ---- shutdown -----------------------------------------------------------------------------------

    def close(self) -> list[tuple[Trial, Cancel]]:
        """Refuse new trials and begin cancelling every active one (cause service_shutdown)."""
        self._closing = True
        return [
            (trial, self.begin_cancel(trial.request_id, Cause.SERVICE_SHUTDOWN))
            for trial in self.active_trials()
        ]

    @property
    def closing(self) -> bool:
        return self._closing
