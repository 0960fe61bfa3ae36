"""Property: the ledger replays the live run. Two trial books run in lockstep under one fake clock, one on
a MemoryStore (the in-memory semantics), one on a real SQLite LedgerStore; after every step the ledger
file, read back by a fresh store, yields the same snapshot for every trial id as both live books (and the
same expired/unknown verdicts). A restart step reopens the file with a new book: every trial that was not
terminal ends aborted with cause service_restart, everything terminal reads exactly as before."""

from __future__ import annotations

import asyncio
import itertools
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from relax_gym_core.errors import RelaxGymError, TrialExpiredError, TrialNotFoundError
from relax_gym_core.plugin.runs import CLEANUP_CONFIRMED, CLEANUP_UNVERIFIED, CleanupResult, RunResult
from relax_gym_core.protocol import CleanupState, TrialStatus, unstructure
from relax_gym_core.trials import Cause, LedgerStore, MemoryStore, Phase, TrialBook
from relax_gym_core.trials.records import EnvKey

from .test_book_stateful import ENVIRONMENTS, FakeClock, different_payload, make_request

WALL_OFFSET = 2.0**30  # wall = fake monotonic + offset: exact in binary, so times round-trip exactly
RETENTION_S = 8.0
QUARTERS = st.integers(2, 240).map(lambda n: n / 4)  # durations in quarter seconds: exact floats
OUTCOMES = {
    "confirmed": CLEANUP_CONFIRMED,
    "unverified": CLEANUP_UNVERIFIED,
    "failed": CleanupResult(confirmed=False, error_code="cleanup_failed"),
}


def view(trial: Any) -> tuple[Any, ...]:
    """Everything a snapshot shows, plus what recovery and retention depend on."""
    return (
        unstructure(TrialBook.snapshot(trial)),
        trial.phase,
        trial.cause,
        trial.env,
        trial.rollout_id,
        trial.fingerprint,
        trial.holds_slot,
        trial.created_at,
        trial.deadline_at,
        trial.finished_at,
        trial.settled_at,
    )


def lookup(book: TrialBook, request_id: str) -> Any:
    try:
        return view(book.get(request_id))
    except TrialExpiredError:
        return "expired"
    except TrialNotFoundError:
        return "unknown"


def close(store: LedgerStore) -> None:
    asyncio.run(store.close())


class LedgerReplay(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="relax-gym-ledger-test-"))
        self.path = self.dir / "ledger.sqlite3"
        self.clock = FakeClock()
        self.key = b"k" * 32  # one key for both books: fingerprints must compare equal
        self.ledger = self.open_ledger()
        self.ref: TrialBook | None = self.make_book(MemoryStore())
        self.book = self.make_book(self.ledger)
        self.ids: list[str] = []
        self.requests: dict[str, Any] = {}
        self.counter = itertools.count()

    def open_ledger(self) -> LedgerStore:
        return LedgerStore(
            self.path,
            clock=self.clock,
            wall_clock=lambda: self.clock.now + WALL_OFFSET,
            fingerprint_key=self.key,
        )

    def make_book(self, store: Any) -> TrialBook:
        # The same rollout id sequence in both books, so their records are equal.
        rollouts = itertools.count()
        return TrialBook(
            clock=self.clock,
            store=store,
            environments=ENVIRONMENTS,
            retention_s=RETENTION_S,
            fingerprint_key=self.key,
            new_rollout_id=lambda: f"rollout-{next(rollouts)}-0",
        )

    def books(self) -> list[TrialBook]:
        return [self.book] if self.ref is None else [self.ref, self.book]

    def both(self, action: Any) -> list[Any]:
        """Apply `action(book)` to every live book; outcomes (or the error class) must agree."""
        outcomes = []
        for book in self.books():
            try:
                result = action(book)
            except RelaxGymError as exc:
                result = type(exc)
            outcomes.append(result)
        assert all(o == outcomes[0] for o in outcomes), outcomes
        return outcomes

    def teardown(self) -> None:
        close(self.ledger)
        shutil.rmtree(self.dir, ignore_errors=True)

    # ---- rules --------------------------------------------------------------------------------------

    @rule(
        env=st.sampled_from(sorted(ENVIRONMENTS)), deadline=QUARTERS, lease=QUARTERS, task=st.integers(0, 2)
    )
    def create(self, env: EnvKey, deadline: float, lease: float, task: int) -> None:
        request = make_request(f"req-{next(self.counter)}", env, deadline, lease, task)
        outcomes = self.both(
            lambda book: (book.create(request)[1], [t.request_id for t in book.start_ready([env])])
        )
        if not isinstance(outcomes[0], type):
            self.ids.append(request.request_id)
            self.requests[request.request_id] = request

    @precondition(lambda self: bool(self.ids))
    @rule(data=st.data(), how=st.sampled_from(["same", "task", "deadline", "model", "metadata"]))
    def replay(self, data: st.DataObject, how: str) -> None:
        request = self.requests[data.draw(st.sampled_from(self.ids))]
        sent = request if how == "same" else different_payload(request, how)
        self.both(lambda book: book.create(sent)[1])

    @rule()
    def start(self) -> None:
        self.both(lambda book: [trial.request_id for trial in book.start_ready()])

    @precondition(lambda self: bool(self.ids))
    @rule(data=st.data(), reward=st.one_of(st.floats(-2, 2, allow_nan=False), st.integers(0, 3)))
    def complete(self, data: st.DataObject, reward: float) -> None:
        request_id = data.draw(st.sampled_from(self.ids))
        self.both(lambda book: book.complete(request_id, RunResult(reward=reward, metrics={"n": 1})))

    @precondition(lambda self: bool(self.ids))
    @rule(data=st.data(), cause=st.sampled_from([Cause.ABORTED, Cause.AGENT_ERROR]))
    def cancel(self, data: st.DataObject, cause: Cause) -> None:
        request_id = data.draw(st.sampled_from(self.ids))
        detail = "sandbox_lost" if cause is Cause.AGENT_ERROR else None
        self.both(lambda book: book.begin_cancel(request_id, cause, detail=detail))

    @precondition(lambda self: bool(self.ids))
    @rule(data=st.data(), outcome=st.sampled_from(sorted(OUTCOMES)))
    def finish_cleanup(self, data: st.DataObject, outcome: str) -> None:
        request_id = data.draw(st.sampled_from(self.ids))
        self.both(lambda book: book.finish_cleanup(request_id, OUTCOMES[outcome]))

    @precondition(lambda self: bool(self.ids))
    @rule(data=st.data())
    def renew(self, data: st.DataObject) -> None:
        request_id = data.draw(st.sampled_from(self.ids))
        self.both(lambda book: book.renew(request_id))

    @rule(dt=QUARTERS)
    def advance_and_expire(self, dt: float) -> None:
        self.clock.advance(dt)
        self.both(lambda book: sorted(trial.request_id for trial, _ in book.expire_due()[0]))

    @rule()
    def evict(self) -> None:
        # The ledger evicts what is written, in its next batch: write, evict, write.
        self.ledger.flush_sync()
        for book in self.books():
            book.evict_expired()
        self.ledger.flush_sync()

    @rule()
    def restart(self) -> None:
        """The process ends (everything acknowledged is written) and a new one opens the same file."""
        self.ledger.flush_sync()
        before = {request_id: lookup(self.book, request_id) for request_id in self.ids}
        close(self.ledger)
        self.ledger = self.open_ledger()
        self.book = self.make_book(self.ledger)
        self.ref = None  # the in-memory run does not survive; the ledger is the reference from here
        recovered = {trial.request_id for trial in self.book.recover()}
        for request_id, old in before.items():
            new = lookup(self.book, request_id)
            if not isinstance(old, tuple):
                assert new == old  # expired stays expired, unknown unknown
                continue
            snapshot, phase = old[0], old[1]
            if phase is Phase.TERMINAL:
                assert new[0] == snapshot  # result and verdict as recorded
                assert (request_id in recovered) == (snapshot["cleanup"] == "pending")
                continue
            trial = self.book.get(request_id)
            assert (trial.status, trial.error, trial.reward) == (
                TrialStatus.ABORTED,
                {"code": "service_restart"},
                None,
            )
            assert trial.phase is Phase.TERMINAL and trial.cause is Cause.SERVICE_RESTART
            never_started = phase is Phase.ACTIVE and snapshot["status"] == "queued"
            assert trial.cleanup is (CleanupState.CONFIRMED if never_started else CleanupState.PENDING)
            assert (request_id in recovered) == (not never_started)
        assert self.book.active == 0
        assert self.book.recover() == []  # once

    # ---- the property -------------------------------------------------------------------------------

    @invariant()
    def replay_from_ledger(self) -> None:
        self.ledger.flush_sync()
        fresh = self.open_ledger()
        try:
            reader = TrialBook(clock=self.clock, store=fresh, environments=ENVIRONMENTS)
            for request_id in self.ids:
                live = [lookup(book, request_id) for book in self.books()]
                assert all(seen == live[0] for seen in live)
                assert lookup(reader, request_id) == live[0]
            assert len(fresh) == len(self.ledger)
        finally:
            close(fresh)


LedgerReplay.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLedgerReplay = LedgerReplay.TestCase
