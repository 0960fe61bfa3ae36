"""The run-adapter seam: how the trial service drives one environment run.

A Runtime starts runs; each run is a RunHandle the service waits on, aborts, and asks to clean up.
NeMo Gym agents over HTTP, the in-process echo environment, and later local sandboxes all sit behind
this one interface, keyed by rollout id so cleanup can be confirmed (also after a restart).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import attrs
from attrs import field, frozen

from relax_gym_core.protocol import CreateTrialRequest, TrialStatus
from relax_gym_core.protocol.types import check_artifact_ref, check_reward, json_object, optional_json_object


@frozen(kw_only=True)
class ModelRoute:
    """How a run's model calls reach this trial's bridge; the runtime picks what its agent can carry.

    `base_url` has the trial's rollout id in its path (for agents given only a URL, such as a CLI);
    None when the gateway has no bridge. `metadata` tags a request body (for agents that resend
    responses_create_params.metadata on every model call, as NeMo Gym's simple_agent does).
    """

    base_url: str | None = None
    metadata: Mapping[str, str] = field(factory=dict)


class Trajectory(Protocol):
    """Where a runtime notes what its environment was asked and answered, for the trial's trajectory
    (the gateway adds the model calls itself): the JSON bytes as they went and came, kept as they are —
    or, from a runtime that never encodes them, the document, encoded later by the writer process."""

    def run_request(self, body: bytes | Mapping[str, Any]) -> None: ...

    def run_answer(self, body: bytes | Mapping[str, Any]) -> None: ...


class _Unrecorded:
    def run_request(self, body: bytes | Mapping[str, Any]) -> None:
        return None

    def run_answer(self, body: bytes | Mapping[str, Any]) -> None:
        return None


UNRECORDED: Trajectory = _Unrecorded()  # trajectories off, or a run outside the gateway


@frozen(kw_only=True)
class RunContext:
    """What a runtime needs to start one run."""

    request: CreateTrialRequest
    rollout_id: str
    environment: str
    config: str
    model: ModelRoute = ModelRoute()
    trajectory: Trajectory = UNRECORDED

    @property
    def model_base_url(self) -> str | None:
        return self.model.base_url


@frozen(kw_only=True)
class RunResult:
    """The outcome of a run that finished on its own."""

    status: TrialStatus = TrialStatus.COMPLETED
    # Validated like the snapshot fields they become: a bad result fails the run (agent_error) instead
    # of making every later poll of the trial fail.
    reward: float | dict[str, Any] | None = field(default=None, validator=check_reward)
    metrics: dict[str, Any] = field(factory=dict, validator=json_object("metrics"))
    artifact_ref: str | None = field(default=None, validator=check_artifact_ref)
    error: dict[str, Any] | None = field(default=None, validator=optional_json_object("error"))

    def __attrs_post_init__(self) -> None:
        if self.status not in (TrialStatus.COMPLETED, TrialStatus.TRUNCATED):
            raise ValueError("a run can only finish as completed or truncated")

    def with_metrics(self, metrics: Mapping[str, Any]) -> RunResult:
        """This result with `metrics` added to (and overriding) its own."""
        return attrs.evolve(self, metrics={**self.metrics, **metrics})


@frozen(kw_only=True)
class CleanupResult:
    """Whether a run's resources are proven released; error_code says why not."""

    confirmed: bool
    error_code: str | None = None


CLEANUP_CONFIRMED = CleanupResult(confirmed=True)
CLEANUP_UNVERIFIED = CleanupResult(confirmed=False, error_code="cleanup_unverified")
CLEANUP_FAILED = CleanupResult(confirmed=False, error_code="cleanup_failed")
CLEANUP_PROBE_FAILED = CleanupResult(confirmed=False, error_code="cleanup_probe_failed")


class RunHandle(Protocol):
    """One run. wait() is cancelled by the service when the trial is cancelled.

    `placement` names where a pooled runtime placed it (a replica), recorded in the ledger so a restarted
    gateway addresses its cleanup there (handle_for); None for a runtime without replicas.
    """

    @property
    def placement(self) -> str | None: ...

    async def wait(self) -> RunResult: ...

    async def abort(self) -> CleanupResult: ...

    async def force_cleanup(self) -> CleanupResult: ...

    async def probe_cleanup(self) -> CleanupResult: ...


class Runtime(Protocol):
    """Starts runs for one or more registered environments."""

    async def start(self, context: RunContext) -> RunHandle:
        """Allocate and start a run quickly; the long wait happens in RunHandle.wait()."""
        ...

    def handle_for(self, rollout_id: str, placement: str | None = None) -> RunHandle:
        """A handle for a run this process did not start (after a gateway restart), addressed by its
        rollout id (and the placement its ledger record names): only its cleanup steps are used (abort,
        force_cleanup, probe_cleanup), never wait()."""
        ...

    async def ready(self) -> bool: ...

    async def close(self) -> None: ...
