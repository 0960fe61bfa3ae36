"""Observer events of trial transitions (relax_gym_core.observe), built only when someone listens."""

from __future__ import annotations

from collections.abc import Callable

from relax_gym_core.observe import Observers, Transition, TrialEvent
from relax_gym_core.protocol import TrialStatus
from relax_gym_core.trials.records import Trial

type Clock = Callable[[], float]
type Emit = Callable[[TrialEvent, Trial], None]


def _ignore(_event: TrialEvent, _trial: Trial) -> None:
    return None


def _failure(trial: Trial) -> str | None:
    if trial.status in (TrialStatus.COMPLETED, TrialStatus.TRUNCATED) or not trial.error:
        return None
    for key in ("kind", "code"):
        value = trial.error.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def transition_emitter(clock: Clock, observers: Observers | None) -> Emit:
    """emit(event, trial): tell every observer what just happened. A no-op without observers, so the
    hot path builds no event (and keeps no per-trial timing) nobody reads."""
    if not observers:
        return _ignore
    fan_out = observers

    def emit(event: TrialEvent, trial: Trial) -> None:
        now = clock()
        previous, since = trial.last_event, trial.changed_at if trial.last_event else trial.created_at
        trial.last_event, trial.changed_at = event, now
        environment, config = trial.env
        fan_out.transition(
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
                failure=_failure(trial) if event is TrialEvent.TERMINAL else None,
            )
        )

    return emit
