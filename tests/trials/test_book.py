"""Example-based tests of TrialBook: admission, slots, FIFO, expiry, cleanup outcomes, eviction, janitor."""

from __future__ import annotations

import itertools
from typing import Any

import attrs
import pytest

from relax_gym_core.errors import (
    QueueFullError,
    RolloutUnavailableError,
    ServiceClosingError,
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
    InterruptPolicy,
    ModelEndpoint,
    SessionInfo,
    TrialStatus,
    unstructure,
)
from relax_gym_core.trials import Admission
from relax_gym_core.trials.book import Cancel, TrialBook
from relax_gym_core.trials.records import Cause, EnvKey, Phase, Trial
from relax_gym_core.trials.store import MemoryStore

ENV: EnvKey = ("echo", "default")
RETENTION_S = 100.0


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, dt: float) -> None:
        self.now += dt


class CountingStore(MemoryStore):
    """MemoryStore that counts get() calls."""

    def __init__(self) -> None:
        super().__init__()
        self.gets = 0

    def get(self, request_id: str) -> Trial | None:
        self.gets += 1
        return super().get(request_id)


class BrokenRecordStore(MemoryStore):
    """MemoryStore whose get() raises for one request id (a corrupt record)."""

    def __init__(self, bad_id: str) -> None:
        super().__init__()
        self.bad_id = bad_id
        self.broken = False

    def get(self, request_id: str) -> Trial | None:
        if self.broken and request_id == self.bad_id:
            raise RuntimeError("corrupt record")
        return super().get(request_id)


def make_request(
    request_id: str,
    *,
    env: EnvKey = ENV,
    deadline_s: float = 600.0,
    lease_s: float = 300.0,
    api_key: str = "sk-test",
    session_id: str = "sess",
    headers: dict[str, str] | None = None,
    task: dict[str, Any] | None = None,
) -> CreateTrialRequest:
    return CreateTrialRequest(
        protocol_version=PROTOCOL_VERSION,
        request_id=request_id,
        session=SessionInfo(session_id=session_id, group_id="grp", rollout_mode="train"),
        environment=EnvironmentRef(name=env[0], config=env[1], task=task if task is not None else {"q": 1}),
        model_endpoint=ModelEndpoint(
            base_url="http://trainer.local/v1", api_key=api_key, model="m", headers=headers or {}
        ),
        interrupt_policy=InterruptPolicy.PROTECTED,
        deadline_s=deadline_s,
        lease_s=lease_s,
    )


def make_book(
    *,
    max_concurrency: int = 1,
    queue_capacity: int = 8,
    clock: FakeClock | None = None,
    store: MemoryStore | None = None,
) -> tuple[TrialBook, FakeClock]:
    clock = clock or FakeClock()
    counter = itertools.count()
    book = TrialBook(
        clock=clock,
        store=store if store is not None else MemoryStore(),
        environments={
            ENV: Admission(max_concurrency=max_concurrency, queue_capacity=queue_capacity, max_deadline_s=1e6)
        },
        retention_s=RETENTION_S,
        new_rollout_id=lambda: f"rollout-{next(counter)}",
    )
    return book, clock


def started_ids(book: TrialBook) -> list[str]:
    return [trial.request_id for trial in book.start_ready()]


def run_to_completion(book: TrialBook, request_id: str, reward: float = 1.0) -> None:
    assert book.complete(request_id, RunResult(reward=reward))
    assert book.finish_cleanup(request_id, CLEANUP_CONFIRMED)


# ---- FIFO and slots ----------------------------------------------------------------------------------


def test_start_order_is_fifo() -> None:
    book, _ = make_book(max_concurrency=1, queue_capacity=8)
    for name in ("a", "b", "c", "d", "e"):
        book.create(make_request(name))
    assert started_ids(book) == ["a"]
    assert started_ids(book) == []  # the slot is taken
    run_to_completion(book, "a")
    assert started_ids(book) == ["b"]
    assert book.begin_cancel("c", Cause.ABORTED) is Cancel.FINISHED  # cancelled while queued: skipped
    run_to_completion(book, "b")
    assert started_ids(book) == ["d"]
    run_to_completion(book, "d")
    assert started_ids(book) == ["e"]


def test_start_fills_every_free_slot_in_order() -> None:
    book, _ = make_book(max_concurrency=2, queue_capacity=8)
    for name in ("a", "b", "c"):
        book.create(make_request(name))
    assert started_ids(book) == ["a", "b"]
    assert book.env_counts(ENV) == (1, 2, 2)


def test_cancelled_running_trial_holds_slot_until_cleanup_but_not_queue_admission() -> None:
    book, _ = make_book(max_concurrency=1, queue_capacity=0)
    book.create(make_request("a"))
    assert started_ids(book) == ["a"]
    with pytest.raises(QueueFullError) as info:
        book.create(make_request("b"))
    assert info.value.retry_after_s > 0

    assert book.begin_cancel("a", Cause.ABORTED) is Cancel.NEEDS_CLEANUP
    trial_a = book.get("a")
    assert trial_a.phase is Phase.CANCELLING
    assert trial_a.status is TrialStatus.RUNNING  # not terminal until cleanup settles
    assert book.env_counts(ENV) == (0, 0, 1)

    # A cancelling trial no longer counts against admission ...
    trial_b, created = book.create(make_request("b"))
    assert created
    # ... but keeps its slot, so b must wait for a's cleanup.
    assert started_ids(book) == []
    assert trial_b.status is TrialStatus.QUEUED
    assert book.env_counts(ENV) == (1, 0, 1)

    assert book.finish_cleanup("a", CLEANUP_CONFIRMED)
    trial_a = book.get("a")
    assert trial_a.status is TrialStatus.ABORTED
    assert trial_a.error == {"code": "aborted"}
    assert trial_a.cleanup is CleanupState.CONFIRMED
    assert book.env_counts(ENV) == (1, 0, 0)
    assert started_ids(book) == ["b"]
    assert book.env_counts(ENV) == (0, 1, 1)


def test_completed_trial_keeps_slot_until_cleanup_is_settled() -> None:
    book, _ = make_book(max_concurrency=1, queue_capacity=4)
    book.create(make_request("a"))
    book.create(make_request("b"))
    assert started_ids(book) == ["a"]

    assert book.complete("a", RunResult(reward=0.5, metrics={"turns": 3}))
    trial_a = book.get("a")
    snap = book.snapshot(trial_a)
    assert snap.status is TrialStatus.COMPLETED
    assert snap.reward == 0.5
    assert snap.metrics == {"turns": 3}
    assert snap.cleanup is CleanupState.PENDING
    assert unstructure(snap)["cleanup"] == "pending"
    assert trial_a.request is None  # token dropped once terminal
    assert not book.is_live(trial_a.rollout_id)
    assert book.active == 1  # only b
    assert book.env_counts(ENV) == (1, 0, 1)
    assert started_ids(book) == []  # a's slot is still held

    assert book.finish_cleanup("a", CLEANUP_CONFIRMED)
    snap = book.snapshot(trial_a)
    assert snap.status is TrialStatus.COMPLETED
    assert snap.reward == 0.5
    assert snap.cleanup is CleanupState.CONFIRMED
    assert unstructure(snap)["cleanup"] == "confirmed"
    assert not book.finish_cleanup("a", CLEANUP_CONFIRMED)  # settled once
    assert started_ids(book) == ["b"]


def test_complete_loses_to_cancellation() -> None:
    book, _ = make_book()
    book.create(make_request("a"))
    started_ids(book)
    assert book.begin_cancel("a", Cause.ABORTED) is Cancel.NEEDS_CLEANUP
    assert not book.complete("a", RunResult(reward=1.0))
    assert book.finish_cleanup("a", CLEANUP_CONFIRMED)
    trial = book.get("a")
    assert trial.status is TrialStatus.ABORTED
    assert trial.reward is None
    assert book.begin_cancel("a", Cause.ABORTED) is Cancel.IGNORED


def test_complete_of_queued_trial_is_refused() -> None:
    book, _ = make_book()
    book.create(make_request("a"))
    assert not book.complete("a", RunResult(reward=1.0))
    assert book.get("a").status is TrialStatus.QUEUED


def test_begin_cancel_of_queued_trial_finishes_at_once_with_cleanup_confirmed() -> None:
    book, _ = make_book(max_concurrency=1, queue_capacity=4)
    book.create(make_request("a"))
    started_ids(book)
    trial_b, _ = book.create(make_request("b"))
    book.create(make_request("c"))
    assert book.env_counts(ENV) == (2, 1, 1)

    assert book.begin_cancel("b", Cause.ABORTED) is Cancel.FINISHED
    assert trial_b.status is TrialStatus.ABORTED
    assert trial_b.phase is Phase.TERMINAL
    assert trial_b.cleanup is CleanupState.CONFIRMED
    assert trial_b.error == {"code": "aborted"}
    assert trial_b.reward is None
    assert trial_b.request is None
    assert not book.is_live(trial_b.rollout_id)
    with pytest.raises(RolloutUnavailableError):
        book.live(trial_b.rollout_id)
    assert book.env_counts(ENV) == (1, 1, 1)
    assert book.active == 2
    assert not book.finish_cleanup("b", CLEANUP_UNVERIFIED)  # nothing left to settle

    run_to_completion(book, "a")
    assert started_ids(book) == ["c"]  # b's stale queue entry is skipped


def test_rollout_id_is_live_while_the_trial_is_active() -> None:
    book, _ = make_book()
    trial, _ = book.create(make_request("a"))
    assert book.live(trial.rollout_id) is trial
    started_ids(book)
    assert book.live(trial.rollout_id) is trial
    book.begin_cancel("a", Cause.AGENT_ERROR)
    assert not book.is_live(trial.rollout_id)
    with pytest.raises(RolloutUnavailableError):
        book.live(trial.rollout_id)
    with pytest.raises(RolloutUnavailableError):
        book.live("no-such-rollout")


# ---- replay and conflict -----------------------------------------------------------------------------


def test_identical_replay_returns_same_trial_and_api_key_refresh_is_not_a_conflict() -> None:
    book, _ = make_book()
    trial, created = book.create(make_request("a"))
    assert created
    again, created = book.create(make_request("a"))
    assert again is trial
    assert not created
    refreshed, created = book.create(make_request("a", api_key="sk-rotated"))
    assert refreshed is trial
    assert not created
    assert book.created_total == 1
    with pytest.raises(TrialConflictError):
        book.create(make_request("a", task={"q": 2}))
    with pytest.raises(TrialConflictError):
        book.create(make_request("a", deadline_s=601.0))


def test_replay_is_answered_even_when_queue_is_full() -> None:
    book, _ = make_book(max_concurrency=1, queue_capacity=0)
    trial, _ = book.create(make_request("a"))
    with pytest.raises(QueueFullError):
        book.create(make_request("b"))
    assert book.create(make_request("a")) == (trial, False)


# ---- deadlines and leases ----------------------------------------------------------------------------


def test_deadline_expiry_truncates_after_confirmed_cleanup() -> None:
    book, clock = make_book()
    trial, _ = book.create(make_request("a", deadline_s=10.0, lease_s=100.0))
    started_ids(book)
    clock.advance(9.9)
    assert book.expire_due() == ([], [])
    clock.advance(0.1)
    fired, errors = book.expire_due()
    assert errors == []
    assert fired == [(trial, Cancel.NEEDS_CLEANUP)]
    assert trial.cause is Cause.DEADLINE_EXCEEDED
    assert trial.phase is Phase.CANCELLING
    assert book.finish_cleanup("a", CLEANUP_CONFIRMED)
    snap = book.snapshot(trial)
    assert snap.status is TrialStatus.TRUNCATED
    assert snap.error == {"code": "deadline_exceeded"}
    assert snap.reward is None
    assert snap.cleanup is CleanupState.CONFIRMED


def test_lease_expiry_aborts_and_renew_extends_the_lease() -> None:
    book, clock = make_book()
    trial, _ = book.create(make_request("a", deadline_s=100.0, lease_s=5.0))
    started_ids(book)
    clock.advance(4.0)
    book.renew("a")
    assert trial.lease_expires_at == clock.now + 5.0
    clock.advance(2.0)  # past the original lease, within the renewed one
    assert book.expire_due() == ([], [])
    assert trial.phase is Phase.ACTIVE
    clock.advance(3.0)
    fired, errors = book.expire_due()
    assert errors == []
    assert fired == [(trial, Cancel.NEEDS_CLEANUP)]
    assert book.finish_cleanup("a", CLEANUP_CONFIRMED)
    assert trial.status is TrialStatus.ABORTED
    assert trial.error == {"code": "lease_expired"}


def test_lease_expiry_of_queued_trial_finishes_at_once() -> None:
    book, clock = make_book(max_concurrency=1)
    book.create(make_request("a", lease_s=1000.0))
    started_ids(book)
    trial_b, _ = book.create(make_request("b", lease_s=5.0))
    clock.advance(5.0)
    fired, _ = book.expire_due()
    assert fired == [(trial_b, Cancel.FINISHED)]
    assert trial_b.status is TrialStatus.ABORTED
    assert trial_b.error == {"code": "lease_expired"}
    assert trial_b.cleanup is CleanupState.CONFIRMED
    assert book.env_counts(ENV) == (0, 1, 1)


def test_deadline_wins_when_deadline_and_lease_are_both_past() -> None:
    book, clock = make_book()
    trial, _ = book.create(make_request("a", deadline_s=5.0, lease_s=5.0))
    started_ids(book)
    clock.advance(50.0)
    fired, _ = book.expire_due()
    assert fired == [(trial, Cancel.NEEDS_CLEANUP)]
    assert trial.cause is Cause.DEADLINE_EXCEEDED


def test_renew_of_non_active_trial_is_a_no_op() -> None:
    book, clock = make_book()
    trial, _ = book.create(make_request("a", lease_s=5.0))
    book.begin_cancel("a", Cause.ABORTED)
    lease = trial.lease_expires_at
    clock.advance(1.0)
    book.renew("a")
    assert trial.lease_expires_at == lease


def test_cancel_if_overdue() -> None:
    book, clock = make_book()
    trial, _ = book.create(make_request("a", deadline_s=50.0, lease_s=5.0))
    started_ids(book)
    assert book.cancel_if_overdue(trial) is None
    clock.advance(5.0)
    assert book.cancel_if_overdue(trial) is Cancel.NEEDS_CLEANUP
    assert trial.cause is Cause.LEASE_EXPIRED


# ---- cleanup outcomes --------------------------------------------------------------------------------


def test_unverified_cleanup_fails_the_trial_with_cleanup_error() -> None:
    book, _ = make_book()
    trial, _ = book.create(make_request("a"))
    started_ids(book)
    book.begin_cancel("a", Cause.ABORTED)
    assert book.finish_cleanup("a", CLEANUP_UNVERIFIED)
    assert trial.status is TrialStatus.FAILED
    assert trial.error == {"code": "cleanup_unverified", "type": "CleanupError", "cause": "aborted"}
    assert trial.cleanup is CleanupState.UNVERIFIED
    assert trial.reward is None
    assert book.env_counts(ENV) == (0, 0, 0)  # the slot is given up


def test_failed_cleanup_fails_the_trial_and_keeps_the_cause() -> None:
    book, _ = make_book()
    trial, _ = book.create(make_request("a", deadline_s=5.0))
    started_ids(book)
    book.begin_cancel("a", Cause.DEADLINE_EXCEEDED)
    assert book.finish_cleanup("a", CleanupResult(confirmed=False, error_code="cleanup_failed"))
    assert trial.status is TrialStatus.FAILED
    assert trial.error == {"code": "cleanup_failed", "type": "CleanupError", "cause": "deadline_exceeded"}
    assert trial.cleanup is CleanupState.FAILED


def test_agent_error_with_confirmed_cleanup_is_failed() -> None:
    book, _ = make_book()
    trial, _ = book.create(make_request("a"))
    started_ids(book)
    assert book.begin_cancel("a", Cause.AGENT_ERROR) is Cancel.NEEDS_CLEANUP
    book.finish_cleanup("a", CLEANUP_CONFIRMED)
    assert trial.status is TrialStatus.FAILED
    assert trial.error == {"code": "agent_error"}


def test_unverified_cleanup_after_completion_keeps_the_result() -> None:
    book, _ = make_book()
    trial, _ = book.create(make_request("a"))
    started_ids(book)
    book.complete("a", RunResult(reward={"score": 1}))
    assert book.finish_cleanup("a", CLEANUP_UNVERIFIED)
    assert trial.status is TrialStatus.COMPLETED
    assert trial.reward == {"score": 1}
    assert trial.error is None
    assert trial.cleanup is CleanupState.UNVERIFIED


def test_finish_cleanup_of_active_trial_is_refused() -> None:
    book, _ = make_book()
    book.create(make_request("a"))
    started_ids(book)
    assert not book.finish_cleanup("a", CLEANUP_CONFIRMED)
    assert book.env_counts(ENV) == (0, 1, 1)


# ---- lookup and eviction -----------------------------------------------------------------------------


def test_unknown_request_id_is_not_found() -> None:
    book, _ = make_book()
    with pytest.raises(TrialNotFoundError, match="not found"):
        book.get("nope")
    with pytest.raises(TrialNotFoundError):
        book.renew("nope")
    assert book.begin_cancel("nope", Cause.ABORTED) is Cancel.IGNORED
    assert not book.complete("nope", RunResult())
    assert not book.finish_cleanup("nope", CLEANUP_CONFIRMED)


def test_eviction_after_retention_reads_as_expired_and_blocks_reuse() -> None:
    book, clock = make_book(max_concurrency=2)
    book.create(make_request("a"))
    book.create(make_request("b"))
    started_ids(book)
    run_to_completion(book, "a")
    book.complete("b", RunResult(reward=0.0))  # cleanup still pending: never evicted

    clock.advance(RETENTION_S - 1.0)
    assert book.evict_expired() == 0
    assert book.get("a").status is TrialStatus.COMPLETED
    clock.advance(1.0)
    assert book.evict_expired() == 1
    assert book.evicted_total == 1

    with pytest.raises(TrialExpiredError) as info:
        book.get("a")
    assert "expired" in str(info.value)
    assert "not found" not in str(info.value)
    assert not isinstance(info.value, TrialNotFoundError)
    with pytest.raises(TrialExpiredError):
        book.renew("a")
    with pytest.raises(TrialConflictError):
        book.create(make_request("a"))
    assert book.get("b").cleanup is CleanupState.PENDING

    clock.advance(10 * RETENTION_S)
    assert book.evict_expired() == 0  # b still holds its slot
    book.finish_cleanup("b", CLEANUP_CONFIRMED)
    clock.advance(RETENTION_S)
    assert book.evict_expired() == 1
    assert book.terminal_count() == 0
    assert book.active == 0


# ---- janitor -----------------------------------------------------------------------------------------


def test_expire_due_cost_does_not_grow_with_trials_that_are_not_due() -> None:
    store = CountingStore()
    book, clock = make_book(max_concurrency=10, queue_capacity=20_000, store=store)
    template = make_request("seed", deadline_s=10_000.0, lease_s=5_000.0)
    for i in range(10_000):
        book.create(attrs.evolve(template, request_id=f"t{i}"))
    started_ids(book)
    assert book.active == 10_000

    clock.advance(100.0)
    store.gets = 0
    assert book.expire_due() == ([], [])
    assert store.gets == 0

    short, _ = book.create(make_request("short", deadline_s=1.0))
    clock.advance(1.0)
    store.gets = 0
    fired, errors = book.expire_due()
    assert fired == [(short, Cancel.FINISHED)]
    assert errors == []
    assert store.gets <= 4  # only the due timers were looked at


def test_one_bad_record_does_not_wedge_the_janitor() -> None:
    store = BrokenRecordStore("bad")
    book, clock = make_book(max_concurrency=1, queue_capacity=8, store=store)
    ok1, _ = book.create(make_request("ok1", deadline_s=1000.0, lease_s=5.0))
    book.create(make_request("bad", deadline_s=1000.0, lease_s=5.0))
    ok2, _ = book.create(make_request("ok2", deadline_s=1000.0, lease_s=5.0))
    started_ids(book)
    store.broken = True

    clock.advance(5.0)
    fired, errors = book.expire_due()
    assert [request_id for request_id, _ in errors] == ["bad"]
    assert isinstance(errors[0][1], RuntimeError)
    assert sorted((trial.request_id, outcome) for trial, outcome in fired) == [
        ("ok1", Cancel.NEEDS_CLEANUP),
        ("ok2", Cancel.FINISHED),
    ]
    assert ok1.cause is Cause.LEASE_EXPIRED
    assert ok2.status is TrialStatus.ABORTED

    attempts = 1
    for _ in range(10):
        clock.advance(1.0)
        fired, errors = book.expire_due()
        assert fired == []
        attempts += len(errors)
    assert attempts == 3  # retried, then dropped
    clock.advance(100.0)
    assert book.expire_due() == ([], [])


# When the deadline and lease timers of a bad record fall due in the same scan, the failure budget is
# still counted per request id: 3 attempts, not 3 per timer.
def test_bad_record_with_coincident_timers_is_attempted_three_times() -> None:
    store = BrokenRecordStore("bad")
    book, clock = make_book(store=store)
    book.create(make_request("bad", deadline_s=5.0, lease_s=5.0))
    store.broken = True
    clock.advance(5.0)
    attempts = 0
    for _ in range(10):
        attempts += len(book.expire_due()[1])
        clock.advance(1.0)
    assert attempts == 3


def test_expire_due_ignores_stale_timers_of_finished_trials() -> None:
    store = CountingStore()
    book, clock = make_book(store=store)
    book.create(make_request("a", deadline_s=10.0, lease_s=10.0))
    started_ids(book)
    run_to_completion(book, "a")
    clock.advance(20.0)
    assert book.expire_due() == ([], [])
    assert book.get("a").status is TrialStatus.COMPLETED


def test_close_cancels_every_active_trial_and_refuses_new_ones() -> None:
    book, _ = make_book(max_concurrency=1)
    book.create(make_request("a"))
    started_ids(book)
    book.create(make_request("b"))
    outcomes = {trial.request_id: outcome for trial, outcome in book.close()}
    assert outcomes == {"a": Cancel.NEEDS_CLEANUP, "b": Cancel.FINISHED}
    assert book.closing
    assert book.get("b").error == {"code": "service_shutdown"}
    assert book.create(make_request("a"))[1] is False  # replays are still answered
    with pytest.raises(ServiceClosingError):
        book.create(make_request("c"))


# A queued trial cancelled while all slots are busy leaves a stale queue entry behind; if its id is
# evicted, its tombstone pushed out of the bounded FIFO and the id created again, the stale entry must
# not start the new trial a second time.
def test_recreated_request_id_is_started_once() -> None:
    counter = itertools.count()
    clock = FakeClock()
    book = TrialBook(
        clock=clock,
        store=MemoryStore(tombstone_capacity=1),
        environments={ENV: Admission(max_concurrency=2, queue_capacity=4)},
        retention_s=RETENTION_S,
        new_rollout_id=lambda: f"rollout-{next(counter)}",
    )
    book.create(make_request("a"))
    book.create(make_request("b"))
    assert started_ids(book) == ["a", "b"]
    book.create(make_request("x"))
    assert book.begin_cancel("x", Cause.ABORTED) is Cancel.FINISHED  # stale queue entry stays behind
    book.create(make_request("y"))
    book.begin_cancel("y", Cause.ABORTED)
    clock.advance(RETENTION_S)
    assert book.evict_expired() == 2  # x's tombstone is pushed out by y's
    book.create(make_request("x"))
    run_to_completion(book, "a")
    assert started_ids(book) == ["x"]
    run_to_completion(book, "b")
    assert started_ids(book) == []
    assert book.env_counts(ENV) == (0, 1, 1)


def test_retained_terminal_trials_are_capped_oldest_first() -> None:
    clock = FakeClock()
    book = TrialBook(
        clock=clock,
        store=MemoryStore(),
        environments={ENV: Admission(max_concurrency=1, queue_capacity=10)},
        retention_s=3600.0,
        max_retained=3,
    )
    for index in range(5):
        book.create(make_request(f"r{index}"))
        book.begin_cancel(f"r{index}", Cause.ABORTED)  # queued -> terminal and settled at once
    assert book.evict_expired() == 2  # well inside the retention period, but over the cap
    with pytest.raises(TrialExpiredError):
        book.get("r1")
    assert book.get("r2").status is TrialStatus.ABORTED
    assert book.terminal_count() == 3


def test_running_trial_drops_its_task_but_keeps_what_callbacks_need() -> None:
    book, clock = make_book()
    book.create(make_request("r", task={"messages": ["x" * 10_000]}, lease_s=30.0))
    (trial,) = book.start_ready()
    book.drop_task("r")
    assert trial.request is not None
    assert trial.request.environment.task == {}
    assert trial.request.model_endpoint.api_key == "sk-test"
    clock.advance(20.0)
    assert book.renew("r") is None
    assert trial.lease_expires_at == clock.now + 30.0  # it still knows its lease length
    clock.advance(20.0)  # past the original lease, within the renewed one
    assert book.expire_due() == ([], [])
    assert trial.phase is Phase.ACTIVE


@pytest.mark.parametrize(
    ("deadline_s", "lease_s", "cause"),
    [(100.0, 5.0, Cause.LEASE_EXPIRED), (5.0, 100.0, Cause.DEADLINE_EXCEEDED)],
)
@pytest.mark.parametrize("start", [True, False], ids=["running", "queued"])
def test_an_overdue_renew_cancels_instead_of_reviving(
    deadline_s: float, lease_s: float, cause: Cause, start: bool
) -> None:
    book, clock = make_book()
    trial, _ = book.create(make_request("r", deadline_s=deadline_s, lease_s=lease_s))
    if start:
        book.start_ready()
    lease = trial.lease_expires_at
    clock.advance(5.0)  # the janitor has not run yet
    outcome = book.renew("r")
    assert outcome is (Cancel.NEEDS_CLEANUP if start else Cancel.FINISHED)
    assert trial.cause is cause
    assert trial.lease_expires_at == lease
    assert not book.is_live(trial.rollout_id)
    assert book.renew("r") is None  # no longer active: a no-op
