"""Hypothesis state machine over TrialBook with a fake clock: random create/replay/renew/cancel/expire/
start/complete/cleanup/evict sequences, with the book's invariants checked after every step."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from relax_gym_core.errors import (
    PolicyMismatchError,
    QueueFullError,
    RolloutUnavailableError,
    TrialConflictError,
    TrialExpiredError,
    TrialNotFoundError,
)
from relax_gym_core.plugin.runs import CLEANUP_CONFIRMED, CLEANUP_UNVERIFIED, CleanupResult, RunResult
from relax_gym_core.protocol import (
    PROTOCOL_VERSION,
    CleanupState,
    CreateTrialRequest,
    EnvironmentRef,
    Generation,
    InterruptPolicy,
    ModelEndpoint,
    SessionInfo,
    TrialStatus,
)
from relax_gym_core.trials import Admission
from relax_gym_core.trials.book import Cancel, TrialBook
from relax_gym_core.trials.records import Cause, EnvKey, Phase, Trial
from relax_gym_core.trials.store import MemoryStore

RETENTION_S = 10.0
ENVIRONMENTS: dict[EnvKey, Admission] = {
    ("alpha", "default"): Admission(max_concurrency=2, queue_capacity=2, max_deadline_s=100.0),
    ("beta", "small"): Admission(max_concurrency=1, queue_capacity=0, max_deadline_s=100.0),
}
CLEANUP_OUTCOMES = {
    "confirmed": CLEANUP_CONFIRMED,
    "unverified": CLEANUP_UNVERIFIED,
    "failed": CleanupResult(confirmed=False, error_code="cleanup_failed"),
}
CLEANUP_STATE = {
    "confirmed": CleanupState.CONFIRMED,
    "unverified": CleanupState.UNVERIFIED,
    "failed": CleanupState.FAILED,
}

durations = st.floats(min_value=0.5, max_value=60.0, allow_nan=False, allow_infinity=False)
steps = st.floats(min_value=0.0, max_value=10.0, allow_nan=False, allow_infinity=False)
rewards = st.one_of(
    st.floats(min_value=-10.0, max_value=10.0, allow_nan=False),
    st.dictionaries(st.sampled_from(["score", "bonus"]), st.integers(-5, 5), max_size=2),
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, dt: float) -> None:
        self.now += dt


def make_request(
    request_id: str, env: EnvKey, deadline_s: float, lease_s: float, task: int
) -> CreateTrialRequest:
    return CreateTrialRequest(
        protocol_version=PROTOCOL_VERSION,
        request_id=request_id,
        session=SessionInfo(session_id="sess", group_id="grp", rollout_mode="train"),
        environment=EnvironmentRef(name=env[0], config=env[1], task={"task": task}),
        model_endpoint=ModelEndpoint(base_url="http://trainer.local/v1", api_key="sk-0", model="m"),
        interrupt_policy=InterruptPolicy.PROTECTED,
        deadline_s=deadline_s,
        lease_s=lease_s,
    )


def _endpoint(request: CreateTrialRequest, **changes: Any) -> CreateTrialRequest:
    return attrs.evolve(request, model_endpoint=attrs.evolve(request.model_endpoint, **changes))


def _session(request: CreateTrialRequest, **changes: Any) -> CreateTrialRequest:
    return attrs.evolve(request, session=attrs.evolve(request.session, **changes))


def different_payload(request: CreateTrialRequest, how: str) -> CreateTrialRequest:
    """The request with exactly one thing a replay must repeat changed."""
    if how == "task":
        environment = attrs.evolve(request.environment, task={"task": request.environment.task["task"] + 1})
        return attrs.evolve(request, environment=environment)
    if how == "deadline":
        return attrs.evolve(request, deadline_s=request.deadline_s + 1.0)
    if how == "lease":
        return attrs.evolve(request, lease_s=request.lease_s + 1.0)
    if how == "model":
        return _endpoint(request, model="other")
    if how == "base_url":
        return _endpoint(request, base_url="http://other-trainer.local/v1")
    if how == "headers":
        return _endpoint(request, headers={"X-Extra": "1"})
    if how == "session_id":
        return _session(request, session_id="other-session")
    if how == "group_id":
        return _session(request, group_id="other-group")
    if how == "generation":
        return attrs.evolve(request, generation=Generation(sampling_params={"temperature": 0.5}))
    if how == "interrupt_policy":
        return attrs.evolve(request, interrupt_policy=InterruptPolicy.INTERRUPTIBLE)
    if how == "env":
        other = next(
            key for key in ENVIRONMENTS if key != (request.environment.name, request.environment.config)
        )
        environment = attrs.evolve(request.environment, name=other[0], config=other[1])
        return attrs.evolve(request, environment=environment)
    assert how == "metadata"
    return attrs.evolve(request, metadata={"changed": True})


PAYLOAD_CHANGES = [
    "task",
    "deadline",
    "lease",
    "model",
    "base_url",
    "headers",
    "session_id",
    "group_id",
    "generation",
    "interrupt_policy",
    "env",
    "metadata",
]


class TrialBookMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.store = MemoryStore()
        rollout_ids = itertools.count()
        self.book = TrialBook(
            clock=self.clock,
            store=self.store,
            environments=ENVIRONMENTS,
            retention_s=RETENTION_S,
            new_rollout_id=lambda: f"rollout-{next(rollout_ids)}",
        )
        self.ids = itertools.count()
        self.requests: dict[str, CreateTrialRequest] = {}  # every admitted, not yet evicted trial
        self.order: dict[str, int] = {}  # admission order, for FIFO checks
        self.started: set[str] = set()
        self.refused: list[CreateTrialRequest] = []  # refused with 429, may be retried
        self.evicted: dict[str, str] = {}  # request_id -> rollout_id
        self.first_terminal: dict[str, TrialStatus] = {}
        self.settled_at: dict[str, float] = {}
        self.left_active: set[str] = set()
        self.rollouts: dict[str, str] = {}  # request_id -> rollout_id, to check they die with eviction
        self.created = 0

    # ---- helpers ------------------------------------------------------------------------------------

    def trial(self, request_id: str) -> Trial:
        trial = self.book.get(request_id)
        assert trial.request_id == request_id
        return trial

    def live_ids(self) -> list[str]:
        return sorted(self.requests, key=self.order.__getitem__)

    def cleanup_pending_ids(self) -> list[str]:
        return [
            rid
            for rid in self.live_ids()
            if self.trial(rid).cleanup is CleanupState.PENDING and self.trial(rid).phase is not Phase.ACTIVE
        ]

    def running_ids(self) -> list[str]:
        return [
            rid
            for rid in self.live_ids()
            if self.trial(rid).phase is Phase.ACTIVE and self.trial(rid).status is TrialStatus.RUNNING
        ]

    def at_capacity(self, key: EnvKey) -> bool:
        queued, running, _ = self.book.env_counts(key)
        admission = ENVIRONMENTS[key]
        return queued + running >= admission.max_concurrency + admission.queue_capacity

    def admit(self, request: CreateTrialRequest) -> None:
        key = (request.environment.name, request.environment.config)
        full = self.at_capacity(key)
        active_before = self.book.active
        try:
            trial, created = self.book.create(request)
        except QueueFullError:
            assert full, "429 although the environment had room"
            self.refused.append(request)
            return
        assert not full, "admitted although the environment was at capacity"
        assert created
        assert trial.status is TrialStatus.QUEUED
        assert trial.phase is Phase.ACTIVE
        assert trial.request is request
        assert trial.deadline_at == self.clock.now + request.deadline_s
        assert trial.lease_expires_at == self.clock.now + request.lease_s
        assert self.book.active == active_before + 1
        self.created += 1
        self.requests[request.request_id] = request
        self.order[request.request_id] = next(self.ids)

    def snapshot_state(self, trial: Trial) -> tuple[Any, ...]:
        return (
            trial.status,
            trial.phase,
            trial.cause,
            trial.cleanup,
            trial.reward,
            trial.error,
            trial.holds_slot,
        )

    # ---- rules --------------------------------------------------------------------------------------

    @rule(
        env=st.sampled_from(sorted(ENVIRONMENTS)),
        deadline_s=durations,
        lease_s=durations,
        task=st.integers(0, 3),
        dispatch=st.booleans(),
    )
    def create_new(self, env: EnvKey, deadline_s: float, lease_s: float, task: int, dispatch: bool) -> None:
        self.admit(make_request(f"req-{next(self.ids)}", env, deadline_s, lease_s, task))
        if dispatch:  # as the service does after an admission
            self.start_ready()

    @precondition(lambda self: bool(self.refused))
    @rule(data=st.data())
    def retry_refused(self, data: st.DataObject) -> None:
        request = data.draw(st.sampled_from(self.refused))
        self.refused.remove(request)
        self.admit(request)

    @precondition(lambda self: bool(self.requests))
    @rule(data=st.data())
    def replay_identical(self, data: st.DataObject) -> None:
        request_id = data.draw(st.sampled_from(self.live_ids()))
        before = self.trial(request_id)
        state = self.snapshot_state(before)
        trial, created = self.book.create(self.requests[request_id])
        assert trial is before
        assert not created
        assert self.snapshot_state(trial) == state

    @precondition(lambda self: bool(self.requests))
    @rule(data=st.data(), api_key=st.text("abcdef0123456789", min_size=1, max_size=8))
    def replay_with_new_api_key(self, data: st.DataObject, api_key: str) -> None:
        """The one change a replay may make: a refreshed token, used from then on while active."""
        request_id = data.draw(st.sampled_from(self.live_ids()))
        refreshed = _endpoint(self.requests[request_id], api_key=api_key)
        before = self.trial(request_id)
        state, request = self.snapshot_state(before), before.request
        trial, created = self.book.create(refreshed)
        assert trial is before
        assert not created
        assert self.snapshot_state(trial) == state
        if trial.phase is Phase.ACTIVE:
            assert trial.request is refreshed
        else:
            assert trial.request is request  # a cancelling or finished trial keeps what it had
        self.requests[request_id] = refreshed

    @precondition(lambda self: bool(self.requests))
    @rule(data=st.data(), how=st.sampled_from(PAYLOAD_CHANGES))
    def replay_conflicting(self, data: st.DataObject, how: str) -> None:
        request_id = data.draw(st.sampled_from(self.live_ids()))
        trial = self.trial(request_id)
        state, request = self.snapshot_state(trial), trial.request
        # The registry refuses another interrupt policy (400) before the replay check could (409).
        refusal = PolicyMismatchError if how == "interrupt_policy" else TrialConflictError
        with pytest.raises(refusal):
            self.book.create(different_payload(self.requests[request_id], how))
        assert self.snapshot_state(trial) == state
        assert trial.request is request

    @precondition(lambda self: bool(self.evicted))
    @rule(data=st.data())
    def touch_evicted(self, data: st.DataObject) -> None:
        request_id = data.draw(st.sampled_from(sorted(self.evicted)))
        with pytest.raises(TrialExpiredError):
            self.book.get(request_id)
        with pytest.raises(TrialExpiredError):
            self.book.renew(request_id)
        with pytest.raises(TrialConflictError):
            self.book.create(make_request(request_id, ("alpha", "default"), 1.0, 1.0, 0))
        assert self.book.begin_cancel(request_id, Cause.ABORTED) is Cancel.IGNORED

    @rule()
    def get_unknown(self) -> None:
        with pytest.raises(TrialNotFoundError):
            self.book.get("never-created")

    @precondition(lambda self: bool(self.requests))
    @rule(data=st.data())
    def renew(self, data: st.DataObject) -> None:
        request_id = data.draw(st.sampled_from(self.live_ids()))
        trial = self.trial(request_id)
        lease = trial.lease_expires_at
        self.book.renew(request_id)
        if trial.phase is Phase.ACTIVE:
            assert trial.lease_expires_at == self.clock.now + self.requests[request_id].lease_s
        else:
            assert trial.lease_expires_at == lease

    @precondition(lambda self: bool(self.requests))
    @rule(data=st.data(), cause=st.sampled_from([Cause.ABORTED, Cause.AGENT_ERROR]))
    def cancel(self, data: st.DataObject, cause: Cause) -> None:
        """Abort (client) or agent failure (supervisor): begin_cancel on any trial."""
        request_id = data.draw(st.sampled_from(self.live_ids()))
        self.check_cancel(request_id, cause, lambda: self.book.begin_cancel(request_id, cause))

    def check_cancel(self, request_id: str, cause: Cause, action: Callable[[], Cancel]) -> Cancel:
        trial = self.trial(request_id)
        phase, status = trial.phase, trial.status
        state = self.snapshot_state(trial)
        outcome = action()
        if phase is not Phase.ACTIVE:
            assert outcome is Cancel.IGNORED
            assert self.snapshot_state(trial) == state
        elif status is TrialStatus.QUEUED:
            assert outcome is Cancel.FINISHED
            assert trial.status is cause.target
            assert trial.error == {"code": cause.value}
            assert trial.cleanup is CleanupState.CONFIRMED
        else:
            assert outcome is Cancel.NEEDS_CLEANUP
            assert trial.phase is Phase.CANCELLING
            assert trial.status is TrialStatus.RUNNING
            assert trial.holds_slot
        if phase is Phase.ACTIVE:
            assert trial.cause is cause
        return outcome

    @rule(dt=steps)
    def advance_and_expire(self, dt: float) -> None:
        self.clock.advance(dt)
        now = self.clock.now
        due: dict[str, tuple[Cause, TrialStatus]] = {}
        for request_id in self.live_ids():
            trial = self.trial(request_id)
            if trial.phase is Phase.ACTIVE:
                # the deadline is checked first
                if now >= trial.deadline_at:
                    due[request_id] = (Cause.DEADLINE_EXCEEDED, trial.status)
                elif now >= trial.lease_expires_at:
                    due[request_id] = (Cause.LEASE_EXPIRED, trial.status)
        fired, errors = self.book.expire_due()
        assert errors == []
        assert sorted(trial.request_id for trial, _ in fired) == sorted(due)
        for trial, outcome in fired:
            cause, status = due[trial.request_id]
            assert trial.cause is cause
            expected = Cancel.FINISHED if status is TrialStatus.QUEUED else Cancel.NEEDS_CLEANUP
            assert outcome is expected
        for request_id in self.live_ids():
            trial = self.trial(request_id)
            if trial.phase is Phase.ACTIVE:
                assert trial.deadline_at > now
                assert trial.lease_expires_at > now
        assert self.book.expire_due() == ([], [])

    @rule()
    def start_ready(self) -> None:
        expected: dict[EnvKey, list[str]] = {}
        for key, admission in ENVIRONMENTS.items():
            _, _, slots_held = self.book.env_counts(key)
            waiting = [
                rid
                for rid in self.live_ids()
                if self.trial(rid).env == key
                and self.trial(rid).phase is Phase.ACTIVE
                and self.trial(rid).status is TrialStatus.QUEUED
            ]
            expected[key] = waiting[: max(0, admission.max_concurrency - slots_held)]
        started = self.book.start_ready()
        for key in ENVIRONMENTS:
            assert [trial.request_id for trial in started if trial.env == key] == expected[key], "not FIFO"
        for trial in started:
            assert trial.status is TrialStatus.RUNNING
            assert trial.phase is Phase.ACTIVE
            assert trial.holds_slot
            assert trial.request_id not in self.started
            self.started.add(trial.request_id)
        for key, admission in ENVIRONMENTS.items():
            queued, _, slots_held = self.book.env_counts(key)
            assert queued == 0 or slots_held == admission.max_concurrency, "a queued trial was left waiting"

    @precondition(lambda self: bool(self.running_ids()))
    @rule(
        data=st.data(),
        reward=rewards,
        status=st.sampled_from([TrialStatus.COMPLETED, TrialStatus.TRUNCATED]),
    )
    def complete_running(self, data: st.DataObject, reward: Any, status: TrialStatus) -> None:
        self.check_complete(data.draw(st.sampled_from(self.running_ids())), reward, status)

    @precondition(lambda self: bool(self.requests))
    @rule(data=st.data())
    def complete_any(self, data: st.DataObject) -> None:
        """A late or duplicate completion report: only a running active trial accepts it."""
        self.check_complete(data.draw(st.sampled_from(self.live_ids())), 1.0, TrialStatus.COMPLETED)

    def check_complete(self, request_id: str, reward: Any, status: TrialStatus) -> None:
        trial = self.trial(request_id)
        eligible = trial.phase is Phase.ACTIVE and trial.status is TrialStatus.RUNNING
        state = self.snapshot_state(trial)
        done = self.book.complete(request_id, RunResult(status=status, reward=reward, metrics={"m": 1}))
        assert done is eligible
        if eligible:
            assert trial.status is status
            assert trial.reward == reward
            assert trial.phase is Phase.TERMINAL
            assert trial.cleanup is CleanupState.PENDING
            assert trial.holds_slot
        else:
            assert self.snapshot_state(trial) == state

    @precondition(lambda self: bool(self.running_ids()))
    @rule(data=st.data())
    def fail_running(self, data: st.DataObject) -> None:
        request_id = data.draw(st.sampled_from(self.running_ids()))
        outcome = self.check_cancel(
            request_id, Cause.AGENT_ERROR, lambda: self.book.begin_cancel(request_id, Cause.AGENT_ERROR)
        )
        assert outcome is Cancel.NEEDS_CLEANUP

    @precondition(lambda self: bool(self.cleanup_pending_ids()))
    @rule(data=st.data(), outcome=st.sampled_from(sorted(CLEANUP_OUTCOMES)))
    def finish_cleanup(self, data: st.DataObject, outcome: str) -> None:
        request_id = data.draw(st.sampled_from(self.cleanup_pending_ids()))
        trial = self.trial(request_id)
        was_cancelling = trial.phase is Phase.CANCELLING
        status, reward = trial.status, trial.reward
        key = trial.env
        slots_before = self.book.env_counts(key)[2]
        assert self.book.finish_cleanup(request_id, CLEANUP_OUTCOMES[outcome])
        assert trial.cleanup is CLEANUP_STATE[outcome]
        assert trial.phase is Phase.TERMINAL
        assert not trial.holds_slot
        assert self.book.env_counts(key)[2] == slots_before - 1
        if was_cancelling:
            cause = trial.cause
            assert cause is not None
            if outcome == "confirmed":
                assert trial.status is cause.target
                assert trial.error == {"code": cause.value}
            else:
                assert trial.status is TrialStatus.FAILED
                assert trial.error == {
                    "code": CLEANUP_OUTCOMES[outcome].error_code,
                    "type": "CleanupError",
                    "cause": cause.value,
                }
        else:
            assert (trial.status, trial.reward) == (status, reward)
        assert not self.book.finish_cleanup(request_id, CLEANUP_CONFIRMED)

    @precondition(lambda self: bool(self.requests))
    @rule(data=st.data())
    def finish_cleanup_out_of_turn(self, data: st.DataObject) -> None:
        """finish_cleanup of an active or already settled trial is refused and changes nothing."""
        request_id = data.draw(st.sampled_from(self.live_ids()))
        trial = self.trial(request_id)
        if trial.cleanup is CleanupState.PENDING and trial.phase is not Phase.ACTIVE:
            return
        state = self.snapshot_state(trial)
        assert not self.book.finish_cleanup(request_id, CLEANUP_UNVERIFIED)
        assert self.snapshot_state(trial) == state

    @rule(dt=st.floats(min_value=0.0, max_value=1.5 * RETENTION_S, allow_nan=False))
    def advance_and_evict(self, dt: float) -> None:
        self.clock.advance(dt)
        horizon = self.clock.now - RETENTION_S
        expected = {rid for rid, at in self.settled_at.items() if at <= horizon and rid in self.requests}
        for request_id in expected:
            trial = self.trial(request_id)
            assert trial.phase is Phase.TERMINAL
            assert trial.cleanup is not CleanupState.PENDING
        evicted_before = self.book.evicted_total
        assert self.book.evict_expired() == len(expected)
        assert self.book.evicted_total == evicted_before + len(expected)
        for request_id in expected:
            assert self.store.get(request_id) is None
            rollout_id = self.rollouts.pop(request_id)
            self.evicted[request_id] = rollout_id
            del self.requests[request_id]
        for request_id in self.requests:
            assert self.store.get(request_id) is not None

    # ---- invariants ---------------------------------------------------------------------------------

    @invariant()
    def trials_are_consistent(self) -> None:
        assert len(self.store) == len(self.requests)
        non_terminal = 0
        for request_id in self.requests:
            trial = self.trial(request_id)
            self.rollouts.setdefault(request_id, trial.rollout_id)
            assert trial.rollout_id == self.rollouts[request_id]
            assert isinstance(trial.status, TrialStatus)

            # phase and status agree
            if trial.phase is Phase.ACTIVE:
                assert trial.status in (TrialStatus.QUEUED, TrialStatus.RUNNING)
                assert request_id not in self.left_active, "a trial came back to ACTIVE"
            else:
                self.left_active.add(request_id)
            if trial.phase is Phase.CANCELLING:
                assert trial.status is TrialStatus.RUNNING
                assert trial.cause is not None
            assert (trial.phase is Phase.TERMINAL) == trial.status.is_terminal

            # terminal status is final
            if trial.status.is_terminal:
                first = self.first_terminal.setdefault(request_id, trial.status)
                assert trial.status is first, f"terminal status changed {first} -> {trial.status}"
                assert trial.finished_at is not None
            else:
                assert request_id not in self.first_terminal
                non_terminal += 1

            # cancellation never carries a reward
            if trial.cause is not None:
                assert trial.reward is None
                if trial.status.is_terminal:
                    assert trial.status in (trial.cause.target, TrialStatus.FAILED)
                    assert trial.error is not None
                    assert trial.error["code"] in (trial.cause.value, "cleanup_unverified", "cleanup_failed")

            # the rollout id is live exactly as long as the trial is active
            assert self.book.is_live(trial.rollout_id) == (trial.phase is Phase.ACTIVE)
            if trial.phase is Phase.ACTIVE:
                assert self.book.live(trial.rollout_id) is trial
            else:
                with pytest.raises(RolloutUnavailableError):
                    self.book.live(trial.rollout_id)

            # the token goes with the terminal transition
            assert (trial.request is None) == (trial.phase is Phase.TERMINAL)

            # a slot is held from start until cleanup is settled
            assert trial.holds_slot == (request_id in self.started and trial.cleanup is CleanupState.PENDING)
            if trial.cleanup is not CleanupState.PENDING:
                assert trial.phase is Phase.TERMINAL
                self.settled_at.setdefault(request_id, self.clock.now)

            # the public view is always valid wire data
            snap = self.book.snapshot(trial)
            assert snap.status is trial.status
            assert snap.cleanup is trial.cleanup

        for rollout_id in self.evicted.values():
            assert not self.book.is_live(rollout_id)

        assert self.book.active == non_terminal
        assert self.book.terminal_count() == len(self.requests) - non_terminal
        assert self.book.created_total == self.created
        assert self.book.evicted_total == len(self.evicted)

    @invariant()
    def counters_respect_admission(self) -> None:
        assert self.book.active >= 0
        for key, admission in ENVIRONMENTS.items():
            queued, running, slots_held = self.book.env_counts(key)
            assert queued >= 0
            assert running >= 0
            assert slots_held >= 0
            assert queued + running <= admission.max_concurrency + admission.queue_capacity
            assert slots_held <= admission.max_concurrency
            trials = [self.trial(rid) for rid in self.requests if self.trial(rid).env == key]
            active = [t for t in trials if t.phase is Phase.ACTIVE]
            assert queued == sum(t.status is TrialStatus.QUEUED for t in active)
            assert running == sum(t.status is TrialStatus.RUNNING for t in active)
            assert slots_held == sum(t.holds_slot for t in trials)


TrialBookMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestTrialBookMachine = TrialBookMachine.TestCase
