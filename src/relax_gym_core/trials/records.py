"""The trial record and the per-environment admission policy (plain data, no I/O)."""

from __future__ import annotations

from enum import Enum, StrEnum
from typing import Any

from attrs import define, frozen

from relax_gym_core.observe import TrialEvent
from relax_gym_core.protocol import CleanupState, CreateTrialRequest, InterruptPolicy, TrialStatus

type EnvKey = tuple[str, str]  # (environment name, config name)


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


@frozen(kw_only=True)
class Admission:
    """Admission policy of one registered (environment, config)."""

    max_concurrency: int = 1
    queue_capacity: int = 8
    max_deadline_s: float = 3600.0
    interrupt_policy: InterruptPolicy = InterruptPolicy.PROTECTED


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
