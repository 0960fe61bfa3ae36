"""The one place where trial transitions and model-call outcomes are observed.

Metrics, structured logs and a durable ledger all hang off this seam instead of reaching into the trial
book or the bridge. Observers are called synchronously, right after the state they describe has changed
(so what they read is already true), and must be cheap: they run inside every transition and every model
call. An observer that raises is logged and skipped; it never undoes or blocks a transition.

Events carry no rollout id (a live bridge key) and no token: observers may log what they get.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from enum import StrEnum
from typing import Protocol

from attrs import frozen

from relax_gym_core.protocol import CleanupState, TrialStatus

logger = logging.getLogger("relax_gym.observe")


class TrialEvent(StrEnum):
    QUEUED = "queued"  # admitted (a replay of an existing trial is not an event)
    RUNNING = "running"  # took a slot; its run starts now
    CANCELLING = "cancelling"  # abort, deadline, lease or shutdown hit a started trial: cleanup runs
    TERMINAL = "terminal"  # its status is final (cleanup may still be pending)
    SETTLED = "settled"  # its cleanup verdict is in and its slot is free


@frozen(kw_only=True)
class Transition:
    event: TrialEvent
    request_id: str
    environment: str
    config: str
    status: TrialStatus
    cleanup: CleanupState
    at: float  # the trial book's clock
    age_s: float  # since the trial was admitted
    previous: TrialEvent | None  # the phase this event ends (None for QUEUED)
    phase_s: float  # how long the trial spent in that phase
    # What ended a trial that did not finish on its own (TERMINAL, not completed or truncated): its error's
    # kind (an infrastructure failure's name: judge_failed, masked:..., replica_lost), else its code.
    failure: str | None = None


@frozen(kw_only=True)
class CallbackOutcome:
    """One model call through the bridge, as the agent saw it."""

    request_id: str
    environment: str
    config: str
    resource: str  # chat/completions | responses | messages
    status: int  # the HTTP status the call ended with (the upstream's, or the bridge's own error status)
    attempts: int  # upstream attempts made (retries of 5xx included); 0 if none was made
    seconds: float


class Observer(Protocol):
    def transition(self, event: Transition) -> None: ...

    def callback(self, outcome: CallbackOutcome) -> None: ...


class Observers:
    """Fans an event out to every observer, isolating their failures from the caller."""

    def __init__(self, observers: Sequence[Observer] = ()) -> None:
        self._observers = tuple(observers)

    def __bool__(self) -> bool:
        return bool(self._observers)  # callers skip building events nobody reads

    def transition(self, event: Transition) -> None:
        for observer in self._observers:
            try:
                observer.transition(event)
            except Exception:
                logger.exception("observer %r failed on %s", observer, event.event.value)

    def callback(self, outcome: CallbackOutcome) -> None:
        for observer in self._observers:
            try:
                observer.callback(outcome)
            except Exception:
                logger.exception("observer %r failed on a model call", observer)
