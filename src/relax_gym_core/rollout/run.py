"""Running a rollout's trials: each (row, repeat) is one real trial through the gateway (the thin client's
run_trial), at most `concurrency` at a time, and one trials.jsonl line when it ends.

Request ids are `rollout-<run id>-<line>-<repeat>-<attempt>`: a rerun sends the same id and body for a
trial it did not see end, so the gateway replays it (a trial still running is joined, one that completed
is taken as it is) instead of running it twice. Only a trial the previous invocation left interrupted
(its replay is already aborted) or whose id the gateway refuses to replay (409: expired, or another body)
is run again, under the next attempt number.

A trial that ends without a reward (failed, aborted by someone else, lost) is recorded as an
infrastructure failure with its kind; a gateway that refuses trials or cannot be reached stops the whole
run (nothing is recorded for it), since no trial could succeed.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio
from attrs import frozen

from relax_gym_core.client import (
    ClientOptions,
    GatewayClient,
    RemoteTrialError,
    TrialCancelledError,
    run_trial,
)
from relax_gym_core.client.exceptions import TrialGoneError
from relax_gym_core.client.output import TRAJECTORY_COUNTS, failure_kind, stop_reason
from relax_gym_core.errors import GatewayRequestError, ProtocolError, RelaxGymError
from relax_gym_core.protocol import (
    PROTOCOL_VERSION,
    CleanupState,
    CreateTrialRequest,
    EnvironmentRef,
    InterruptPolicy,
    SessionInfo,
    TrialSnapshot,
    TrialStatus,
)
from relax_gym_core.rollout.data import DataRow
from relax_gym_core.rollout.live import Progress
from relax_gym_core.rollout.policy import Policy, oracle_token
from relax_gym_core.rollout.store import TRAJECTORY
from relax_gym_core.rollout.trajectories import TrajectoryReader

CLEANUP_WAIT_S = 60.0  # how long a trial's slot waits for its cleanup verdict before recording "pending"
LEASE_S = 60.0
POLLS_PER_S = 100.0  # what all trials' status polls together may ask of the gateway


def client_options(concurrency: int) -> ClientOptions:
    """Each trial polls every 0.2 s, or less often when so many run that their polls would load the
    gateway more than POLLS_PER_S (a gateway busy answering polls answers everything late, renews too)."""
    return ClientOptions(
        poll_interval_s=max(0.2, concurrency / POLLS_PER_S),
        abort_timeout_s=5.0,
        startup_timeout_s=600.0,  # a full admission queue is back-pressure: wait for room, do not fail
        # One long poll per trial in flight, a renew at times beside it: none waits for the pool.
        max_connections=max(100, 2 * concurrency),
    )


# Why a previous invocation's trial may have been cut short: its replay is then no result of ours.
_INTERRUPTIONS = frozenset({"aborted", "lease_expired", "service_shutdown"})


@frozen
class Planned:
    row: DataRow
    repeat: int


@frozen(kw_only=True)
class TrialSettings:
    run_id: str
    policy: Policy
    oracle: tuple[int, float] | None  # (seed, known-bad rate) when the policy is the oracle
    deadline_s: Callable[[str], float]  # by environment: --deadline-s within the environment's maximum
    interrupt_policy: Callable[[str], InterruptPolicy]


def request_id(run_id: str, line: int, repeat: int, attempt: int) -> str:
    return f"rollout-{run_id}-{line}-{repeat}-{attempt}"


def build_request(settings: TrialSettings, trial: Planned, attempt: int) -> CreateTrialRequest:
    row, repeat = trial.row, trial.repeat
    key = oracle_token(*settings.oracle, row.line, repeat) if settings.oracle is not None else None
    environment = row.route.environment
    return CreateTrialRequest(
        protocol_version=PROTOCOL_VERSION,
        request_id=request_id(settings.run_id, row.line, repeat, attempt),
        session=SessionInfo(
            session_id=f"rollout-{settings.run_id}-{row.line}-{repeat}",
            group_id=f"rollout-{settings.run_id}-{row.line}",  # a row's repeats are one group
            rollout_mode="eval",
            attempt=attempt,
        ),
        environment=EnvironmentRef(name=environment, config=row.route.config, task=row.task),
        model_endpoint=settings.policy.endpoint(key),
        interrupt_policy=settings.interrupt_policy(environment),
        deadline_s=settings.deadline_s(environment),
        lease_s=LEASE_S,
        metadata={"integration": "relax-gym-rollout"},
    )


class ReplayAwareClient(GatewayClient):
    """Remembers which creates answered with an already-finished trial: replays of an earlier invocation."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.replayed: set[str] = set()

    async def create(self, request: CreateTrialRequest, *, wait_s: float = 0.0) -> TrialSnapshot:
        snapshot = await super().create(request, wait_s=wait_s)
        if self.create_replayed and snapshot.status.is_terminal:
            self.replayed.add(request.request_id)
        return snapshot


def _identifiers(error: Mapping[str, Any] | None) -> str | None:
    """A trial error as its identifiers only: error texts may quote prompts, paths or keys."""
    if not error:
        return None
    kept = [
        f"{key}={error[key]}" for key in ("code", "kind", "type", "cause") if isinstance(error.get(key), str)
    ]
    return " ".join(kept) or None


def _failure_kind(snapshot: TrialSnapshot) -> str | None:
    if snapshot.status in (TrialStatus.FAILED, TrialStatus.ABORTED):
        return failure_kind(snapshot)
    reward = snapshot.reward
    if isinstance(reward, dict):
        reward = reward.get("scalar")
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        return "missing_reward"
    return None


def make_record(
    trial: Planned,
    request: CreateTrialRequest,
    snapshot: TrialSnapshot | None,
    *,
    started_at: float,
    total_s: float,
    failure: tuple[str, str] | None = None,
    model_calls: int | None = None,
    phases: Mapping[str, float] | None = None,
    trajectory: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One trials.jsonl line (README: "The main job: rollouts and reports" documents every field)."""
    reward: Any = snapshot.reward if snapshot is not None else None
    components = None
    if isinstance(reward, dict):
        components = reward.get("components")
        reward = reward.get("scalar")
    kind = failure[0] if failure is not None else _failure_kind(snapshot) if snapshot is not None else None
    if model_calls is None and snapshot is not None and isinstance(snapshot.metrics.get("model_calls"), int):
        model_calls = int(snapshot.metrics["model_calls"])
    counts = trajectory.get("counts") if trajectory is not None else None
    counts = counts if isinstance(counts, dict) else {}
    if model_calls is None and isinstance(counts.get("model_calls"), int):
        model_calls = counts["model_calls"]
    record: dict[str, Any] = {
        "row": trial.row.line,
        "row_id": trial.row.row_id,
        "row_digest": trial.row.digest,
        "repeat": trial.repeat,
        "environment": trial.row.route.environment,
        "config": trial.row.route.config,
        "request_id": request.request_id,
        "attempt": request.session.attempt,
        "status": snapshot.status.value if snapshot is not None else "lost",
        "reward": float(reward) if kind is None else None,
        "metrics": dict(snapshot.metrics) if snapshot is not None else {},
        "failure_kind": kind,
        "error": failure[1] if failure is not None else _identifiers(snapshot.error if snapshot else None),
        "cleanup": snapshot.cleanup.value if snapshot is not None and snapshot.cleanup is not None else None,
        "timings": {"started_at": round(started_at, 3), "total_s": round(total_s, 6), **(phases or {})},
        "model_calls": model_calls,
        # What the Relax recipes check of a trajectory (None: the gateway kept none).
        **{key: counts.get(key) for key in TRAJECTORY_COUNTS},
        "stop_reason": stop_reason(snapshot) if snapshot is not None else "env_error:trial_lost",
    }
    if isinstance(components, dict) and kind is None:
        record["reward_components"] = components
    if trajectory is not None:
        record[TRAJECTORY] = {"row": trial.row.line, "repeat": trial.repeat, **trajectory}
    return record


class Engine:
    """Runs planned trials; `stop` ends the run early (Ctrl-C, or a fatal gateway error)."""

    def __init__(
        self,
        client: ReplayAwareClient,
        settings: TrialSettings,
        progress: Progress,
        record: Callable[[dict[str, Any]], None],
        *,
        take_watch: Callable[[str], tuple[int, dict[str, float]]] | None,
    ) -> None:
        self.client = client
        self.settings = settings
        self.progress = progress
        self.record = record
        self.take_watch = take_watch
        self.stop = anyio.Event()
        self.fatal: RelaxGymError | None = None
        self.interrupted: list[str | None] = []  # cleanup verdicts of the trials a stop aborted
        self.trajectories = TrajectoryReader(client)

    async def run(self, plan: Sequence[Planned], concurrency: int) -> None:
        slots = anyio.Semaphore(concurrency)
        async with anyio.create_task_group() as reading:
            reading.start_soon(self.trajectories.serve)
            async with anyio.create_task_group() as tg:
                for trial in plan:
                    await slots.acquire()
                    if self.stop.is_set():
                        slots.release()
                        break
                    self.progress.started()
                    tg.start_soon(self._one, trial, slots)
            reading.cancel_scope.cancel()  # every trial has its trajectory (or gave up on it)
        self.progress.stop_queue()

    def fail(self, exc: RelaxGymError) -> None:
        if self.fatal is None:
            self.fatal = exc
        self.stop.set()

    async def _one(self, trial: Planned, slots: anyio.Semaphore) -> None:
        held = True
        try:
            ended = await self._attempts(trial)
            slots.release()  # the trial is over: reading its trajectory need not keep the next one waiting
            held = False
            if ended is not None:
                request_id, make = ended
                trajectory = await self.trajectories.read(request_id) if request_id is not None else None
                self.record(make(trajectory=trajectory))
        finally:
            self.progress.left()
            if held:
                slots.release()

    async def _attempts(self, trial: Planned) -> tuple[str | None, functools.partial[dict[str, Any]]] | None:
        """How the trial ended: the request id whose trajectory its record wants (None: it has none), and
        what makes the record of it with that trajectory; None when nothing is to be recorded."""
        attempt = 1
        while True:
            request = build_request(self.settings, trial, attempt)
            started_at, clock = time.time(), time.monotonic()
            failure: tuple[str, str] | None = None
            try:
                snapshot: TrialSnapshot | None = await run_trial(request, client=self.client, stop=self.stop)
            except TrialCancelledError:
                await self._settle_aborted(request.request_id)
                return None
            except RemoteTrialError as exc:
                if request.request_id in self.client.replayed and _was_interrupted(exc.snapshot):
                    attempt += 1
                    continue
                snapshot = exc.snapshot
            except TrialGoneError as exc:
                snapshot, failure = None, ("trial_lost", str(exc))
            except GatewayRequestError as exc:
                if exc.status_code == 409:  # the id cannot be replayed here: run the trial anew
                    attempt += 1
                    continue
                self.fail(exc)
                return None
            except ProtocolError as exc:
                self.fail(exc)
                return None
            total_s = time.monotonic() - clock
            if snapshot is not None:
                snapshot = await self._settled(snapshot)
            calls, phases = self.take_watch(request.request_id) if self.take_watch else (None, None)
            make = functools.partial(
                make_record,
                trial,
                request,
                snapshot,
                started_at=started_at,
                total_s=total_s,
                failure=failure,
                model_calls=calls,
                phases=phases,
            )
            return (request.request_id if snapshot is not None else None), make

    async def _settled(self, snapshot: TrialSnapshot) -> TrialSnapshot:
        """The snapshot with its cleanup verdict. Most verdicts follow the final status within
        milliseconds, so the first looks come quickly (the slot is held meanwhile), then every poll."""
        deadline = time.monotonic() + CLEANUP_WAIT_S
        delay = 0.02
        while snapshot.cleanup in (None, CleanupState.PENDING) and time.monotonic() < deadline:
            await anyio.sleep(delay)
            delay = min(delay * 2, self.client.options.poll_interval_s)
            try:
                snapshot = await self.client.get(snapshot.request_id, retry_until=deadline)
            except RelaxGymError:
                break  # recorded with cleanup as last seen: the verdict could not be read
        return snapshot

    async def _settle_aborted(self, request_id: str) -> None:
        """After a stop: make sure the trial is aborted and wait for its cleanup verdict."""
        verdict: str | None = None
        with anyio.CancelScope(shield=True):
            try:
                snapshot = await self.client.get(request_id)
                if not snapshot.status.is_terminal:
                    await self.client.abort(request_id)
                settled = await self.client.settled(request_id, timeout_s=CLEANUP_WAIT_S)
                verdict = settled.cleanup.value if settled.cleanup is not None else None
            except TrialGoneError:
                verdict = "not_created"  # stopped before the gateway had it
            except (TimeoutError, RelaxGymError):
                verdict = None
        if self.take_watch is not None:
            self.take_watch(request_id)
        self.interrupted.append(verdict)


def _was_interrupted(snapshot: TrialSnapshot) -> bool:
    error = snapshot.error or {}
    if snapshot.status is TrialStatus.ABORTED:
        return True
    return snapshot.status is TrialStatus.FAILED and error.get("cause") in _INTERRUPTIONS
