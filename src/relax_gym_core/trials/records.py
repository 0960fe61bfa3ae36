"""The trial record (plain data, no I/O); the admission policy it is admitted under is the plugin API's."""

from __future__ import annotations

from enum import Enum, StrEnum
from typing import Any

from attrs import define

from relax_gym_core.observe import TrialEvent
from relax_gym_core.plugin.specs import EnvKey
from relax_gym_core.protocol import CleanupState, CreateTrialRequest, TrialStatus


class Phase(Enum):
    """Internal lifecycle layer under the public status."""

    ACTIVE = "active"  # queued or running, rollout id live
    CANCELLING = "cancelling"  # cancellation begun, cleanup ladder running
    TERMINAL = "terminal"  # status final (cleanup may still be pending after a normal finish)


class Cause(StrEnum):
    """Why a trial was cancelled; also its error code when cleanup is confirmed."""

    ABORTED = "aborted"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    LEASE_EXPIRED = "lease_expired"
    AGENT_ERROR = "agent_error"
    SERVICE_SHUTDOWN = "service_shutdown"
    SERVICE_RESTART = "service_restart"  # the gateway restarted while the trial was live: its run is lost

    @property
    def target(self) -> TrialStatus:
        if self is Cause.DEADLINE_EXCEEDED:
            return TrialStatus.TRUNCATED
        if self is Cause.AGENT_ERROR:
            return TrialStatus.FAILED
        return TrialStatus.ABORTED


@define(slots=True, kw_only=True, eq=False)
class Trial:
    """One trial. Mutated only by TrialBook; the request (and its token) is dropped once terminal.

    `rollout_id` names the run to its environment (its /run body, its model calls, its cleanup URLs) and
    is recorded in the ledger, so cleanup can run by it after a restart (trials/rollouts.py).
    """

    request_id: str
    env: EnvKey
    rollout_id: str
    fingerprint: bytes
    request: CreateTrialRequest | None
    created_at: float
    deadline_at: float
    lease_expires_at: float
    status: TrialStatus = TrialStatus.QUEUED
    phase: Phase = Phase.ACTIVE
    cause: Cause | None = None
    detail: str | None = None  # e.g. the infrastructure failure kind behind an agent_error
    # ...and the environment's own reason for it, if it gave one (bounded, no secret): in the error once
    # final, so not a ledger column of its own.
    reason: str | None = None
    holds_slot: bool = False
    reward: float | dict[str, Any] | None = None
    metrics: dict[str, Any] | None = None
    artifact_ref: str | None = None
    error: dict[str, Any] | None = None
    cleanup: CleanupState = CleanupState.PENDING
    finished_at: float | None = None
    settled_at: float | None = None  # when its cleanup verdict came in: the retention clock starts here
    # Which replica of its environment ran it (the runtime's word for it, recorded in the ledger), so a
    # restarted gateway sends its cleanup there; None when the runtime has no replicas.
    placement: str | None = None
    # For observers (relax_gym_core.observe): the last event seen and when, so each event can say how long
    # the trial spent in the phase it ends. Kept only while observers are installed.
    last_event: TrialEvent | None = None
    changed_at: float = 0.0
