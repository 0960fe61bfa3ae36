"""Every trial transition reaches the observers once, in order, after the state it describes is true; a
failing observer changes nothing; events carry no rollout id or token."""

from __future__ import annotations

import itertools
import logging

import attrs
import pytest

from relax_gym_core.observe import Observers, Transition, TrialEvent
from relax_gym_core.plugin.runs import CLEANUP_CONFIRMED, RunResult
from relax_gym_core.protocol import CleanupState, TrialStatus
from relax_gym_core.testing import RecordingObserver
from relax_gym_core.trials import Admission
from relax_gym_core.trials.book import Cancel, TrialBook
from relax_gym_core.trials.records import Cause
from relax_gym_core.trials.store import MemoryStore

from .test_book import ENV, FakeClock, make_request

Q, R, C, T, S = (
    TrialEvent.QUEUED,
    TrialEvent.RUNNING,
    TrialEvent.CANCELLING,
    TrialEvent.TERMINAL,
    TrialEvent.SETTLED,
)


def observed_book(*observers: object) -> tuple[TrialBook, FakeClock]:
    clock = FakeClock()
    counter = itertools.count()
    book = TrialBook(
        clock=clock,
        store=MemoryStore(),
        environments={ENV: Admission(max_concurrency=1, queue_capacity=4, max_deadline_s=1e6)},
        new_rollout_id=lambda: f"rollout-{next(counter)}",
        observers=Observers(observers),  # type: ignore[arg-type]
    )
    return book, clock


def test_a_finished_trial_is_queued_running_terminal_settled() -> None:
    seen = RecordingObserver()
    book, clock = observed_book(seen)
    book.create(make_request("a"))
    book.create(make_request("a"))  # an identical replay is not an event
    clock.advance(1)
    book.start_ready()
    clock.advance(2)
    book.complete("a", RunResult(reward=1.0))
    clock.advance(3)
    book.finish_cleanup("a", CLEANUP_CONFIRMED)
    events = seen.transitions
    assert [e.event for e in events] == [Q, R, T, S]
    assert [(e.status, e.cleanup) for e in events] == [
        (TrialStatus.QUEUED, CleanupState.PENDING),
        (TrialStatus.RUNNING, CleanupState.PENDING),
        (TrialStatus.COMPLETED, CleanupState.PENDING),
        (TrialStatus.COMPLETED, CleanupState.CONFIRMED),
    ]
    assert [e.age_s for e in events] == [0, 1, 3, 6]
    assert [(e.previous, e.phase_s) for e in events] == [(None, 0), (Q, 1), (R, 2), (T, 3)]
    assert {(e.environment, e.config, e.request_id) for e in events} == {(*ENV, "a")}


def test_cancelled_trials_say_how_they_ended() -> None:
    seen = RecordingObserver()
    book, _ = observed_book(seen)
    book.create(make_request("running"))
    book.create(make_request("queued"))
    book.start_ready()
    assert book.begin_cancel("queued", Cause.ABORTED) is Cancel.FINISHED
    assert book.begin_cancel("running", Cause.DEADLINE_EXCEEDED) is Cancel.NEEDS_CLEANUP
    book.finish_cleanup("running", CLEANUP_CONFIRMED)
    assert seen.events_of("queued") == [Q, T, S]
    assert seen.events_of("running") == [Q, R, C, T, S]
    last = {e.request_id: (e.status, e.cleanup) for e in seen.transitions}
    assert last == {
        "queued": (TrialStatus.ABORTED, CleanupState.CONFIRMED),
        "running": (TrialStatus.TRUNCATED, CleanupState.CONFIRMED),
    }


class Exploding:
    def transition(self, event: Transition) -> None:
        raise RuntimeError("observer bug")

    def callback(self, outcome: object) -> None:
        raise RuntimeError("observer bug")


def test_a_failing_observer_is_logged_and_changes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    seen = RecordingObserver()
    book, _ = observed_book(Exploding(), seen)
    with caplog.at_level(logging.ERROR, logger="relax_gym.observe"):
        book.create(make_request("a"))
        book.start_ready()
        assert book.complete("a", RunResult(reward=0.5))
        assert book.finish_cleanup("a", CLEANUP_CONFIRMED)
    assert seen.events_of("a") == [Q, R, T, S]  # later observers still see every event
    snapshot = book.snapshot(book.get("a"))
    assert (snapshot.status, snapshot.reward, snapshot.cleanup) == (TrialStatus.COMPLETED, 0.5, "confirmed")
    assert len([r for r in caplog.records if r.name == "relax_gym.observe"]) == 4


def test_events_carry_no_rollout_id_or_token() -> None:
    seen = RecordingObserver()
    book, _ = observed_book(seen)
    trial, _ = book.create(make_request("a", api_key="sk-secret-token"))
    book.start_ready()
    fields = {field.name for field in attrs.fields(Transition)}
    assert not fields & {"rollout_id", "api_key", "request", "endpoint"}
    assert trial.rollout_id not in repr(seen.transitions)
    assert "sk-secret-token" not in repr(seen.transitions)


def test_no_observers_builds_no_events(monkeypatch: pytest.MonkeyPatch) -> None:
    book, _ = observed_book()

    def forbidden(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("an event was built with nobody to read it")

    monkeypatch.setattr("relax_gym_core.trials.events.Transition", forbidden)
    book.create(make_request("a"))
    book.start_ready()
    assert book.complete("a", RunResult(reward=1.0))


def test_on_terminal_hears_each_end_once_before_the_observers_and_cannot_break_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen = RecordingObserver()
    ended: list[tuple[str, TrialStatus, int]] = []

    def on_terminal(request_id: str, status: TrialStatus) -> None:
        ended.append((request_id, status, len(seen.transitions)))
        if request_id == "b":
            raise RuntimeError("listener broke")

    counter = itertools.count()
    book = TrialBook(
        clock=FakeClock(),
        store=MemoryStore(),
        environments={ENV: Admission(max_concurrency=1, queue_capacity=4, max_deadline_s=1e6)},
        new_rollout_id=lambda: f"rollout-{next(counter)}",
        observers=Observers([seen]),
        on_terminal=on_terminal,
    )
    for request_id in ("a", "b"):
        book.create(make_request(request_id))
        book.start_ready()
        book.complete(request_id, RunResult(reward=1.0))
        book.finish_cleanup(request_id, CLEANUP_CONFIRMED)
    # Told before the observers heard TERMINAL (Q, R were heard), once per trial, even after a failure.
    assert ended == [("a", TrialStatus.COMPLETED, 2), ("b", TrialStatus.COMPLETED, 6)]
    assert [e.event for e in seen.transitions] == [Q, R, T, S, Q, R, T, S]
    assert "on_terminal failed for request_id=b" in caplog.text
