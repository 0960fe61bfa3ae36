"""TrialBook: the trial state machine. Synchronous and I/O-free; clock and store are arguments.

Every method runs to completion without awaiting, so on one event loop each transition is atomic and
"first terminal transition wins" holds without locks. The async TrialService drives runs and reports
back here; the Hypothesis state machine in tests drives this class directly with a fake clock.

The transitions, as phase / status (a call in any other state changes nothing):

    create          (new id)             -> ACTIVE / queued             rollout id live, timers armed
    start_ready     ACTIVE / queued      -> ACTIVE / running            takes a slot, FIFO per environment
    complete        ACTIVE / running     -> TERMINAL / run's status     cleanup pending, slot still held
    begin_cancel    ACTIVE / queued      -> TERMINAL / cause.target     settled at once: nothing to clean
    begin_cancel    ACTIVE / running     -> CANCELLING / running        the caller runs the cleanup ladder
    finish_cleanup  CANCELLING           -> TERMINAL / cause.target     (failed unless confirmed); settled
    finish_cleanup  TERMINAL, pending    -> TERMINAL, settled           status and result kept
    close           every ACTIVE         -> begin_cancel(service_shutdown); new creates refused
    recover         (unsettled in store) -> TERMINAL / aborted, cause service_restart, once at start:
                    queued ones settled at once, the others' cleanup pending (run by rollout id)

Leaving ACTIVE ends the rollout id's life as a bridge key; reaching TERMINAL drops the request (token and
task); settling frees the slot and starts the retention clock. renew, expire_due and cancel_if_overdue
only ever reach TERMINAL through begin_cancel.

Every transition tells the store (store.changed) and then the observers; a durable store writes the
record before the service acknowledges the transition (see trials/store.py). Retention (eviction of
settled records) belongs to the store, which knows where its records live.

What is not the state machine lives in collaborators: admission (queues, slots, the 400 and 429
checks), timers (deadline/lease heap), rollouts (ids, and the live ones), idempotency (replay
fingerprints) and events (observers).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from enum import Enum

import attrs

from relax_gym_core.errors import (
    RolloutUnavailableError,
    ServiceClosingError,
    TrialConflictError,
    TrialExpiredError,
    TrialNotFoundError,
)
from relax_gym_core.observe import Observers, TrialEvent
from relax_gym_core.plugin.runs import CleanupResult, RunResult
from relax_gym_core.plugin.specs import EnvKey
from relax_gym_core.protocol import (
    PROTOCOL_VERSION,
    CleanupState,
    CreateTrialRequest,
    TrialSnapshot,
    TrialStatus,
)
from relax_gym_core.trials.admission import Admission, Admissions
from relax_gym_core.trials.events import Clock, transition_emitter
from relax_gym_core.trials.idempotency import ReplayGuard
from relax_gym_core.trials.records import Cause, Phase, Trial
from relax_gym_core.trials.rollouts import LiveRollouts, random_rollout_id
from relax_gym_core.trials.store import TrialStore
from relax_gym_core.trials.timers import Timers, overdue_cause

logger = logging.getLogger("relax_gym.trials")


class Cancel(Enum):
    """What begin_cancel did, so the caller knows whether a cleanup ladder must run."""

    IGNORED = "ignored"  # not active any more: first terminal transition already won
    FINISHED = "finished"  # never started: terminal at once, nothing to clean
    NEEDS_CLEANUP = "needs_cleanup"  # started: run the cleanup ladder, then finish_cleanup()


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
        on_terminal: Callable[[str, TrialStatus], None] | None = None,
    ) -> None:
        self._clock = clock
        self._store = store
        self._admissions = Admissions(environments, retry_after_s=retry_after_s)
        self._timers = Timers()
        self._new_rollout_id = new_rollout_id or random_rollout_id
        self._live = LiveRollouts()
        # Recorded fingerprints are compared after a restart only if the key outlives the process.
        self._replays = ReplayGuard(fingerprint_key or store.fingerprint_key)
        self._retention_s = retention_s
        self._max_retained = max_retained
        self._emit = transition_emitter(clock, observers)
        # One listener told of each trial's end and nothing else (the trajectory store), called before the
        # observers: building an observer event for every transition costs more than what it does.
        self._on_terminal = on_terminal
        self._closing = False
        self.created_total = 0
        self.evicted_total = 0
        self.active = 0

    # ---- queries ------------------------------------------------------------------------------------

    def now(self) -> float:
        return self._clock()

    @property
    def environments(self) -> Mapping[EnvKey, Admission]:
        return self._admissions.policies

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def store(self) -> TrialStore:
        return self._store

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
        line = self._admissions[key]
        return line.queued, line.running, line.slots_held

    def active_trials(self) -> list[Trial]:
        return [trial for trial in self._store.live() if trial.phase is Phase.ACTIVE]

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

    def live(self, rollout_id: str) -> Trial:
        """The active trial a model call's rollout id names, or RolloutUnavailableError."""
        request_id = self._live.lookup(rollout_id)
        trial = self._store.get(request_id) if request_id is not None else None
        if trial is None or trial.phase is not Phase.ACTIVE:
            raise RolloutUnavailableError("callback capability is unavailable")
        return trial

    def is_live(self, rollout_id: str) -> bool:
        return rollout_id in self._live

    # ---- create -------------------------------------------------------------------------------------

    def admission_for(self, request: CreateTrialRequest) -> Admission:
        """Resolve and check the registered environment; raises the reference's 400 errors."""
        return self._admissions.resolve(request).admission

    def create(self, request: CreateTrialRequest) -> tuple[Trial, bool]:
        """Admit a new trial, or return the existing one for an identical replay. (trial, created)."""
        line = self._admissions.resolve(request)
        fingerprint = self._replays.fingerprint(request)
        existing = self._store.get(request.request_id)
        if existing is not None:
            self._replays.check_replay(existing.fingerprint, fingerprint)
            if existing.phase is Phase.ACTIVE:
                existing.request = request  # a refreshed token is used from now on
            return existing, False
        if self._store.is_tombstoned(request.request_id):
            raise TrialConflictError("request_id belongs to a trial that has expired; use a new request_id")
        if self._closing:
            raise ServiceClosingError("gateway is shutting down")
        self._admissions.check_room(line)
        now = self._clock()
        trial = Trial(
            request_id=request.request_id,
            env=line.key,
            rollout_id=self._new_rollout_id(),
            fingerprint=fingerprint,
            request=request,
            created_at=now,
            deadline_at=now + request.deadline_s,
            lease_expires_at=now + request.lease_s,
        )
        self._store.add(trial)
        self._live.grant(trial.rollout_id, trial.request_id)
        line.enqueue(trial.request_id, trial.rollout_id)
        self._timers.arm(trial.deadline_at, trial.request_id)
        self._timers.arm(trial.lease_expires_at, trial.request_id)
        self.created_total += 1
        self.active += 1
        self._transition(TrialEvent.QUEUED, trial)
        return trial, True

    # ---- start --------------------------------------------------------------------------------------

    def start_ready(self, keys: Iterable[EnvKey] | None = None) -> list[Trial]:
        """Move queued trials into free slots (FIFO) and return them; the caller starts their runs."""
        started: list[Trial] = []
        for key in self._admissions if keys is None else keys:
            line = self._admissions[key]
            while (entry := line.next_waiting()) is not None:
                request_id, rollout_id = entry
                trial = self._store.get(request_id)
                if trial is None or trial.rollout_id != rollout_id or trial.status is not TrialStatus.QUEUED:
                    continue  # cancelled while queued, or its id was evicted and reused since
                trial.status = TrialStatus.RUNNING
                trial.holds_slot = True
                line.take_slot()
                started.append(trial)
                self._transition(TrialEvent.RUNNING, trial)
        return started

    def drop_task(self, request_id: str) -> None:
        """Forget a running trial's task (its largest part) once the runtime has started with it."""
        trial = self._store.get(request_id)
        if trial is not None and trial.request is not None and trial.phase is Phase.ACTIVE:
            request = trial.request
            trial.request = attrs.evolve(request, environment=attrs.evolve(request.environment, task={}))

    def place(self, request_id: str, placement: str) -> None:
        """Record where the runtime placed a running trial's run (a replica), for cleanup after a restart."""
        trial = self._store.get(request_id)
        if trial is not None and trial.placement != placement:
            trial.placement = placement
            self._store.changed(trial)

    # ---- finish -------------------------------------------------------------------------------------

    def complete(self, request_id: str, result: RunResult, *, artifact_ref: str | None = None) -> bool:
        """Record a run that finished on its own (`artifact_ref` stands in when the result names none).
        False if something else already won."""
        trial = self._store.get(request_id)
        if trial is None or trial.phase is not Phase.ACTIVE or trial.status is not TrialStatus.RUNNING:
            return False
        trial.status = result.status
        trial.reward = result.reward
        trial.metrics = result.metrics
        trial.artifact_ref = result.artifact_ref or artifact_ref
        trial.error = result.error
        self._to_terminal(trial)
        return True

    def begin_cancel(
        self, request_id: str, cause: Cause, *, detail: str | None = None, reason: str | None = None
    ) -> Cancel:
        trial = self._store.get(request_id)
        if trial is None or trial.phase is not Phase.ACTIVE:
            return Cancel.IGNORED
        trial.cause = cause
        trial.detail = detail
        trial.reason = reason
        self._live.revoke(trial.rollout_id)
        self._timers.disarm(request_id)
        line = self._admissions[trial.env]
        if trial.status is TrialStatus.QUEUED:
            line.leave_queue()
            trial.status = cause.target
            trial.error = {"code": cause.value}
            self._to_terminal(trial)
            self._settle(trial, CleanupState.CONFIRMED)
            return Cancel.FINISHED
        trial.phase = Phase.CANCELLING
        line.stop_running()
        self._transition(TrialEvent.CANCELLING, trial)
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
            else:
                trial.status = TrialStatus.FAILED
                trial.error = {"code": code, "type": "CleanupError", "cause": cause.value}
            if trial.detail is not None:  # the infrastructure failure's kind, whatever the cleanup verdict
                trial.error["kind"] = trial.detail
            if trial.reason is not None:
                trial.error["reason"] = trial.reason
            self._to_terminal(trial)
        self._settle(trial, state)
        return True

    def close(self) -> list[tuple[Trial, Cancel]]:
        """Refuse new trials and begin cancelling every active one (cause service_shutdown)."""
        self._closing = True
        return [
            (trial, self.begin_cancel(trial.request_id, Cause.SERVICE_SHUTDOWN))
            for trial in self.active_trials()
        ]

    def recover(self) -> list[Trial]:
        """At start, before any create: end what a previous process left unfinished in the store.

        Its runs are gone with it (and their requests, token included, were never recorded), so every
        trial not yet terminal ends aborted with cause service_restart: one still queued never started
        and is settled at once; one running or cancelling had a run, so it keeps its slot and its
        cleanup stays pending. Trials already terminal keep their result and await their cleanup too.
        Returns the trials whose cleanup the caller must now run by rollout id, then finish_cleanup().
        """
        now = self._clock()
        pending: list[Trial] = []
        for trial in self._store.restored():
            if trial.phase is not Phase.TERMINAL:
                started = trial.phase is Phase.CANCELLING or trial.status is not TrialStatus.QUEUED
                trial.cause = Cause.SERVICE_RESTART
                trial.status = Cause.SERVICE_RESTART.target
                trial.error = {"code": Cause.SERVICE_RESTART.value}
                trial.reward = None
                trial.phase = Phase.TERMINAL
                trial.request = None
                trial.finished_at = now
                trial.holds_slot = False
                self._transition(TrialEvent.TERMINAL, trial)
                if not started:
                    self._settle(trial, CleanupState.CONFIRMED)
                    continue
            line = self._admissions.get(trial.env)
            trial.holds_slot = line is not None  # its environment may still hold the run's resources
            if line is not None:
                line.hold_slot()
            self._store.changed(trial)
            pending.append(trial)
        return pending

    def _transition(self, event: TrialEvent, trial: Trial) -> None:
        self._store.changed(trial)  # first: observers may look at the store
        self._emit(event, trial)

    def _to_terminal(self, trial: Trial) -> None:
        if trial.phase is Phase.ACTIVE and trial.holds_slot:
            self._admissions[trial.env].stop_running()
        trial.phase = Phase.TERMINAL
        trial.request = None  # the token and task go with it
        trial.finished_at = self._clock()
        self._live.revoke(trial.rollout_id)
        self._timers.disarm(trial.request_id)
        self.active -= 1
        if self._on_terminal is not None:
            try:
                self._on_terminal(trial.request_id, trial.status)
            except Exception:  # like an observer's: it must not stop the trial's transition
                logger.exception("on_terminal failed for request_id=%s", trial.request_id)
        self._transition(TrialEvent.TERMINAL, trial)

    def _settle(self, trial: Trial, state: CleanupState) -> None:
        trial.cleanup = state
        if trial.holds_slot:
            trial.holds_slot = False
            self._admissions[trial.env].free_slot()
        trial.settled_at = self._clock()
        self._transition(TrialEvent.SETTLED, trial)

    # ---- time ---------------------------------------------------------------------------------------

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
        self._timers.arm(trial.lease_expires_at, request_id)
        return None

    def cancel_if_overdue(self, trial: Trial) -> Cancel | None:
        """Begin cancelling a trial found past its deadline or lease (e.g. by a late callback)."""
        cause = overdue_cause(trial, self._clock())
        return None if cause is None else self.begin_cancel(trial.request_id, cause)

    overdue_cause = staticmethod(overdue_cause)

    def next_due(self) -> float | None:
        return self._timers.next_due()

    def expire_due(self) -> tuple[list[tuple[Trial, Cancel]], list[tuple[str, Exception]]]:
        """Begin cancellation of every trial past its deadline (checked first) or lease.

        Cost is proportional to the timers that fell due, never to the number of trials. A record that
        raises is reported in the second list and retried a few times, then dropped (see Timers).
        """
        now = self._clock()
        fired: list[tuple[Trial, Cancel]] = []

        def fire(request_id: str) -> None:
            trial = self._store.get(request_id)
            if trial is None or trial.phase is not Phase.ACTIVE:
                return  # a stale timer: finished trial, or a lease renewed since
            cause = overdue_cause(trial, now)
            if cause is not None:
                fired.append((trial, self.begin_cancel(request_id, cause)))

        errors = self._timers.expire(now, fire)
        return fired, errors

    def evict_expired(self) -> int:
        """Forget settled terminal records older than the retention period, or beyond max_retained
        (oldest first), so memory stays flat however many trials have finished. Returns how many."""
        evicted = self._store.evict(self._clock() - self._retention_s, self._max_retained)
        self.evicted_total += evicted
        return evicted
