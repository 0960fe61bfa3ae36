"""TrialService: drives runs for the TrialBook on one asyncio loop (supervisors, cleanup, janitor).

The book decides; this module only waits on things and reports what happened. Queued trials cost no
task: a supervisor task exists only while a trial holds a slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping

from attrs import frozen

from relax_gym_core.errors import EnvironmentFailure, RolloutUnavailableError, StoreUnavailableError
from relax_gym_core.plugin.runs import (
    CLEANUP_CONFIRMED,
    CLEANUP_FAILED,
    UNRECORDED,
    CleanupResult,
    ModelRoute,
    RunContext,
    RunHandle,
    Runtime,
    Trajectory,
)
from relax_gym_core.plugin.specs import EnvKey
from relax_gym_core.protocol import CleanupState, CreateTrialRequest, Generation, ModelEndpoint, TrialSnapshot
from relax_gym_core.protocol.text import safe_text
from relax_gym_core.trajectories import Recorder, TrajectoryStore, trajectory_path
from relax_gym_core.trials.book import Cancel, TrialBook
from relax_gym_core.trials.callbacks import CallbackScope
from relax_gym_core.trials.changes import Changes
from relax_gym_core.trials.records import Cause, Phase, Trial
from relax_gym_core.trials.recovery import RecoveryPolicy, prove_released

logger = logging.getLogger("relax_gym.trials")


@frozen(kw_only=True)
class TrialStats:
    """How many trials this gateway has seen, for its health answers."""

    trials: int  # created by this process
    active_trials: int
    terminal_trials: int
    evicted_trials: int  # forgotten after the retention period


@frozen(kw_only=True)
class CallbackTarget:
    """What the bridge needs to forward one model call of a trial."""

    request_id: str
    env: EnvKey
    endpoint: ModelEndpoint
    generation: Generation
    remaining_s: float
    trajectory: Recorder | None = None  # where its model calls are recorded (None: trajectories off)


class TrialService:
    def __init__(
        self,
        book: TrialBook,
        runtimes: Mapping[EnvKey, Runtime],
        *,
        cleanup_grace_s: float = 30.0,
        scan_interval_s: float = 0.25,
        validate_endpoint: Callable[[ModelEndpoint], None] = lambda _endpoint: None,
        model_route: Callable[[str], ModelRoute] = lambda _rollout_id: ModelRoute(),
        error_hold_s: float = 30.0,
        recovery: RecoveryPolicy | None = None,
        trajectories: TrajectoryStore | None = None,
        changes: Changes | None = None,
    ) -> None:
        self.book = book
        self.trajectories = trajectories
        self.changes = changes  # an observer of `book`: what watch() waits on (None: it does not wait)
        self._recovery = recovery or RecoveryPolicy()
        self._recoveries: set[asyncio.Task[None]] = set()  # cleanups of trials a restart ended
        self._runtimes = runtimes
        self._grace = cleanup_grace_s
        self._scan_interval_s = scan_interval_s
        self._validate_endpoint = validate_endpoint
        self._model_route = model_route
        self._supervisors: dict[str, asyncio.Task[None]] = {}
        self._starts: dict[str, asyncio.Future[RunHandle]] = {}
        self._handles: dict[str, RunHandle] = {}
        self._cleanups: set[asyncio.Task[None]] = set()
        self._callbacks: dict[str, set[CallbackScope]] = {}  # the model calls in flight, per trial
        self._janitor: asyncio.Task[None] | None = None
        self.janitor_error: str | None = None
        self._janitor_error_at = 0.0
        self._error_hold_s = error_hold_s

    # ---- lifecycle ----------------------------------------------------------------------------------

    async def start(self) -> None:
        await self.book.store.start()
        self._recover()  # before any request: a poll after a restart sees the trial ended, never 404
        self._janitor = asyncio.create_task(self._janitor_loop(), name="relax-gym-janitor")

    async def close(self, budget_s: float | None = None) -> None:
        """Graceful shutdown: cancel every trial (service_shutdown), await cleanups, stop runtimes.

        `budget_s` bounds the wait for runs and cleanup ladders (each ladder alone may take three cleanup
        graces): whatever is still running then is cancelled, its cleanup left pending, so the process
        exits inside its kill window. The log line says how many cleanups were proven.
        """
        if self.changes is not None:
            self.changes.close()  # long polls answer now
        for task in self._recoveries:
            task.cancel()  # their cleanups stay pending in the ledger: the next start runs them again
        await asyncio.gather(*self._recoveries, return_exceptions=True)
        closed: list[Trial] = []
        for trial, outcome in self.book.close():
            self._after_cancel(trial, outcome)
            if outcome is not Cancel.IGNORED:
                closed.append(trial)
        loop = asyncio.get_running_loop()
        deadline = None if budget_s is None else loop.time() + budget_s
        waited: set[asyncio.Task[None]] = set()
        pending = {*self._supervisors.values(), *self._cleanups}
        while pending:
            waited |= pending
            timeout = None if deadline is None else deadline - loop.time()
            if timeout is not None and timeout <= 0:
                break
            await asyncio.wait(pending, timeout=timeout)
            pending = {t for t in (*self._supervisors.values(), *self._cleanups) if not t.done()}
        for task in pending:
            task.cancel()
        await asyncio.gather(*waited, return_exceptions=True)
        confirmed = sum(trial.cleanup is CleanupState.CONFIRMED for trial in closed)
        log = logger.warning if closed else logger.info
        log(
            "shutdown: %d trial(s) aborted, %d cleanup(s) confirmed, %d left unconfirmed%s",
            len(closed),
            confirmed,
            len(closed) - confirmed,
            f" (shutdown budget spent: gave up after {budget_s:g} s)" if pending else "",
        )
        if self._janitor is not None:
            self._janitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._janitor
        for runtime in {id(r): r for r in self._runtimes.values()}.values():
            await runtime.close()
        await self.book.store.close()  # last: every transition above is written before the lock goes

    # ---- trial API ----------------------------------------------------------------------------------

    def create(self, request: CreateTrialRequest) -> tuple[TrialSnapshot, bool]:
        self.book.admission_for(request)  # reference order: environment checks before the callback URL
        self._validate_endpoint(request.model_endpoint)
        trial, created = self.book.create(request)
        if created:
            self._dispatch(trial.env)
        return self.book.snapshot(trial), created

    def get(self, request_id: str) -> TrialSnapshot:
        return self.book.snapshot(self.book.get(request_id))

    async def watch(self, request_id: str, wait_s: float) -> TrialSnapshot:
        """get(), once the trial has made its next transition or wait_s has passed (a long poll): at once
        for a wait_s of 0 and for a trial with nothing left to change (terminal, its cleanup decided)."""
        snapshot = self.get(request_id)
        settled = snapshot.status.is_terminal and snapshot.cleanup is not CleanupState.PENDING
        if settled or self.changes is None or wait_s <= 0:
            return snapshot
        await self.changes.next(request_id, wait_s)
        return self.get(request_id)

    async def ended(self, request_id: str, wait_s: float) -> TrialSnapshot:
        """get(), once the trial's status is final (its cleanup may still be pending) or wait_s has passed:
        what a create that was asked to wait answers, so a short trial costs its client one request."""
        snapshot = self.get(request_id)
        if self.changes is None or wait_s <= 0:
            return snapshot
        loop = asyncio.get_running_loop()
        until = loop.time() + wait_s  # real waiting, whatever clock the book keeps
        while not snapshot.status.is_terminal and not self.changes.closed:  # closed: next() would not wait
            left = until - loop.time()
            if left <= 0:
                break
            await self.changes.next(request_id, left)
            snapshot = self.get(request_id)
        return snapshot

    async def written(self, request_id: str) -> None:
        """Wait until this trial's state so far is durable; answer anyone about it only then."""
        pending = self.book.store.unwritten(request_id)
        if pending is not None:
            await pending

    async def _durable(self, request_id: str) -> None:
        """written(), through failed writes: the ledger retries them with back-off (no spin here), and
        the trial's deadline bounds the wait. A disk that stalls delays a run; it does not fail it."""
        while True:
            try:
                await self.written(request_id)
            except StoreUnavailableError:
                continue
            return

    def renew(self, request_id: str) -> None:
        outcome = self.book.renew(request_id)
        if outcome is not None:
            self._after_cancel(self.book.get(request_id), outcome)

    def abort(self, request_id: str) -> TrialSnapshot:
        trial = self.book.get(request_id)
        self._after_cancel(trial, self.book.begin_cancel(request_id, Cause.ABORTED))
        return self.book.snapshot(trial)

    async def readiness(self) -> tuple[bool, list[str]]:
        reasons: list[str] = []
        if self.book.closing:
            reasons.append("gateway is shutting down")
        if self._janitor is None or self._janitor.done():
            reasons.append("janitor is not running")
        if self.janitor_error is not None:
            reasons.append(f"janitor: {self.janitor_error}")
        if (problem := self.book.store.problem()) is not None:
            reasons.append(problem)
        runtimes = {id(r): r for r in self._runtimes.values()}.values()
        results = await asyncio.gather(*(r.ready() for r in runtimes), return_exceptions=True)
        if any(result is not True for result in results):
            reasons.append("an environment runtime is not ready")
        return not reasons, reasons

    @property
    def janitor_healthy(self) -> bool:
        return self.janitor_error is None

    # ---- model callbacks ----------------------------------------------------------------------------

    def live(self, rollout_id: str) -> Trial:
        """The active trial a model call's rollout id names, or RolloutUnavailableError."""
        return self.book.live(rollout_id)

    def is_live(self, rollout_id: str) -> bool:
        return self.book.is_live(rollout_id)

    @staticmethod
    def is_active(trial: Trial) -> bool:
        """Still active (a trial found by live() may have ended since, e.g. while a call's body was read)."""
        return trial.phase is Phase.ACTIVE

    def callback(self, trial: Trial) -> tuple[CallbackTarget, CallbackScope]:
        """One model call of `trial` (found by live()): what to forward, and the scope to make it in,
        which is cancelled if the trial is (the call ends unavailable)."""
        if trial.phase is not Phase.ACTIVE:
            raise RolloutUnavailableError("callback capability is unavailable")
        outcome = self.book.cancel_if_overdue(trial)
        if outcome is not None:
            self._after_cancel(trial, outcome)
            raise RolloutUnavailableError("callback capability is unavailable")
        request = trial.request
        assert request is not None  # active trials keep their request
        target = CallbackTarget(
            request_id=trial.request_id,
            env=trial.env,
            endpoint=request.model_endpoint,
            generation=request.generation,
            remaining_s=trial.deadline_at - self.book.now(),
            trajectory=self.trajectories.recorder(trial.request_id) if self.trajectories else None,
        )
        return target, CallbackScope(self._callbacks, trial.request_id)

    # ---- internals ----------------------------------------------------------------------------------

    def _record(self, trial: Trial, request: CreateTrialRequest) -> Trajectory:
        if self.trajectories is None:
            return UNRECORDED
        endpoint = request.model_endpoint
        # Whatever of these reached a body (agents echo their configuration) is replaced on disk. A session
        # id the request id is made of is no secret to whoever made it (relax-gym rollout does that; Relax
        # hashes it): replacing it would erase the request id.
        session = request.session.session_id
        secrets = (endpoint.api_key, trial.rollout_id, *endpoint.headers.values())
        secrets += (session,) if session not in trial.request_id else ()
        return self.trajectories.begin(trial.request_id, trial.env[0], trial.env[1], secrets)

    def _recover(self) -> None:
        for trial in self.book.recover():
            task = asyncio.create_task(self._recover_one(trial))
            self._recoveries.add(task)
            task.add_done_callback(self._recoveries.discard)

    async def _recover_one(self, trial: Trial) -> None:
        """Prove the run of a trial a restart ended is released, by rollout id (recovery.py)."""
        runtime = self._runtimes.get(trial.env)
        handle: RunHandle | None = None
        if runtime is not None:
            try:
                # A recorded placement (the replica that ran it) goes to the runtime that recorded it.
                handle = runtime.handle_for(trial.rollout_id, trial.placement)
            except Exception:
                logger.exception("recovery: no handle for request_id=%s", trial.request_id)
        label = f"request_id={trial.request_id} environment={trial.env[0]} config={trial.env[1]}"
        clock = asyncio.get_running_loop().time  # real waiting, whatever clock the book keeps
        outcome = await prove_released(handle, self._ladder, self._recovery, clock=clock, label=label)
        self.book.finish_cleanup(trial.request_id, outcome)
        if runtime is not None:
            self._dispatch(trial.env)

    def _dispatch(self, key: EnvKey) -> None:
        for trial in self.book.start_ready([key]):
            self._supervisors[trial.request_id] = asyncio.create_task(self._supervise(trial))

    def _after_cancel(self, trial: Trial, outcome: Cancel) -> None:
        if outcome is not Cancel.IGNORED:
            for scope in self._callbacks.pop(trial.request_id, ()):
                scope.cancel()
        if outcome is Cancel.NEEDS_CLEANUP:
            task = asyncio.create_task(self._cleanup(trial))
            self._cleanups.add(task)
            task.add_done_callback(self._cleanups.discard)

    async def _supervise(self, trial: Trial) -> None:
        request_id = trial.request_id
        request = trial.request
        try:
            assert request is not None
            # Write-ahead: the ledger knows the trial is running before its environment does, so a
            # restart never leaves a started run it believes was only queued.
            await self._durable(request_id)
            runtime = self._runtimes[trial.env]
            context = RunContext(
                request=request,
                rollout_id=trial.rollout_id,
                environment=trial.env[0],
                config=trial.env[1],
                model=self._model_route(trial.rollout_id),
                trajectory=self._record(trial, request),
            )
            # Shielded: a cancel during start must not lose the handle; the cleanup ladder awaits it.
            start = asyncio.ensure_future(runtime.start(context))
            self._starts[request_id] = start
            handle = await asyncio.shield(start)
            self._handles[request_id] = handle
            if handle.placement is not None:  # the replica a pooled runtime chose
                self.book.place(request_id, handle.placement)
            del self._starts[request_id], start, context, request  # nothing may pin them for the whole run
            self.book.drop_task(request_id)  # the runtime has the task now; keep the trial small
            result = await handle.wait()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # An EnvironmentFailure names its kind: an infrastructure failure, reported, never a reward of 0.
            failure = exc if isinstance(exc, EnvironmentFailure) else None
            where = (request_id, trial.env[0], trial.env[1])
            # The environment's reason may quote a URL of the run's (/ng-rollout/<rollout id>/...): masked.
            reason = (
                None
                if failure is None or not failure.reason
                else safe_text(failure.reason, secrets=(trial.rollout_id,)) or None
            )
            if failure is None:
                logger.exception("trial run failed request_id=%s environment=%s config=%s", *where)
            else:
                logger.warning(
                    "trial run failed request_id=%s environment=%s config=%s kind=%s reason=%s",
                    *where,
                    failure.kind,
                    reason,
                )
            self._supervisors.pop(request_id, None)
            cancel = self.book.begin_cancel(
                request_id,
                Cause.AGENT_ERROR,
                detail=None if failure is None else failure.kind,
                reason=reason,
            )
            self._after_cancel(trial, cancel)
            return
        # The environment's own artifact comes first; else the trajectory is the trial's artifact.
        artifact_ref = trajectory_path(request_id) if self.trajectories is not None else None
        if self.book.complete(request_id, result, artifact_ref=artifact_ref):
            outcome = await self._release(self._handles.pop(request_id, None))
            self.book.finish_cleanup(request_id, outcome)
            self._dispatch(trial.env)
        self._supervisors.pop(request_id, None)

    async def _cleanup(self, trial: Trial) -> None:
        request_id = trial.request_id
        supervisor = self._supervisors.pop(request_id, None)
        if supervisor is not None and supervisor is not asyncio.current_task():
            supervisor.cancel()
            await asyncio.gather(supervisor, return_exceptions=True)
        handle = self._handles.pop(request_id, None)
        start = self._starts.pop(request_id, None)
        if handle is None and start is not None:
            try:
                handle = await asyncio.wait_for(asyncio.shield(start), self._grace)
            except Exception:  # noqa: BLE001 - a start that failed allocated nothing we can address
                handle = None
        outcome = CLEANUP_CONFIRMED if handle is None else await self._ladder(handle)
        if trial.phase is Phase.CANCELLING:
            self.book.finish_cleanup(request_id, outcome)
        self._dispatch(trial.env)

    async def _step(self, step: Callable[[], Awaitable[CleanupResult]]) -> CleanupResult:
        try:
            return await asyncio.wait_for(step(), self._grace)
        except Exception:
            logger.warning("cleanup step %s failed", getattr(step, "__name__", "?"), exc_info=True)
            return CLEANUP_FAILED

    async def _ladder(self, handle: RunHandle) -> CleanupResult:
        """abort -> force_cleanup -> probe, each bounded by the grace; only a confirmation counts.

        If any step failed and nothing confirmed, the outcome is cleanup_failed (not the last answer)."""
        failed = False
        result = CLEANUP_FAILED
        for step in (handle.abort, handle.force_cleanup, handle.probe_cleanup):
            result = await self._step(step)
            if result.confirmed:
                return result
            failed = failed or result.error_code == CLEANUP_FAILED.error_code
        return CLEANUP_FAILED if failed else result

    async def _release(self, handle: RunHandle | None) -> CleanupResult:
        """After a normal finish: prove the run's resources are gone (probe, else force + probe)."""
        if handle is None:
            return CLEANUP_CONFIRMED
        result = await self._step(handle.probe_cleanup)
        if result.confirmed:
            return result
        forced = await self._step(handle.force_cleanup)
        return forced if forced.confirmed else await self._step(handle.probe_cleanup)

    async def _janitor_loop(self) -> None:
        while True:
            await asyncio.sleep(self._scan_interval_s)
            errors: list[tuple[str, Exception]]
            try:
                fired, errors = self.book.expire_due()
                for trial, outcome in fired:
                    self._after_cancel(trial, outcome)
                self.book.evict_expired()
            except Exception as scan_error:  # noqa: BLE001 - health reports it; the next clean scan recovers
                errors = [("-", scan_error)]
            for request_id, error in errors:
                logger.error("janitor could not process request_id=%s: %r", request_id, error)
            # An error stays visible for a while (operators must be able to see it), then health recovers
            # by itself once scans run clean again.
            now = self.book.now()
            if errors:
                self.janitor_error = f"{len(errors)} record(s) failed, last {type(errors[-1][1]).__name__}"
                self._janitor_error_at = now
            elif self.janitor_error is not None and now - self._janitor_error_at >= self._error_hold_s:
                self.janitor_error = None

    def stats(self) -> TrialStats:
        return TrialStats(
            trials=self.book.created_total,
            active_trials=self.book.active,
            terminal_trials=self.book.terminal_count(),
            evicted_trials=self.book.evicted_total,
        )
