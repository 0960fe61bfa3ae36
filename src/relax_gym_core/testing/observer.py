"""RecordingObserver: keeps every event it is shown, for tests of code that observes trials and calls."""

from __future__ import annotations

import threading

from relax_gym_core.observe import CallbackOutcome, Transition, TrialEvent


class RecordingObserver:
    """An Observer (relax_gym_core.observe) that records; safe to read from a test thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._transitions: list[Transition] = []
        self._callbacks: list[CallbackOutcome] = []

    def transition(self, event: Transition) -> None:
        with self._lock:
            self._transitions.append(event)

    def callback(self, outcome: CallbackOutcome) -> None:
        with self._lock:
            self._callbacks.append(outcome)

    @property
    def transitions(self) -> list[Transition]:
        with self._lock:
            return list(self._transitions)

    @property
    def callbacks(self) -> list[CallbackOutcome]:
        with self._lock:
            return list(self._callbacks)

    def events_of(self, request_id: str) -> list[TrialEvent]:
        return [event.event for event in self.transitions if event.request_id == request_id]
