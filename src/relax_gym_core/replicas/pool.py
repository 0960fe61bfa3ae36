"""A pool of environment replicas behind one Runtime: placement, health, replacement.

A replica is one wired copy of the environments' servers; each has its own runtime per (environment,
config), made for its addresses. The pool

- places each run on the least-loaded healthy replica (runs in flight on it) and keeps rollout id ->
  replica, so abort, force-cleanup and probe of a run always go to the replica that ran it; the run's
  `placement` (replica name @ this pool's incarnation) is recorded in the trial ledger, so a restarted
  gateway knows the replica that ran a recovered rollout: its own replica (cleanup goes there) or one of
  an earlier process, gone with it (cleanup `unverified` at once: nobody is left to ask);
- probes every replica: handle.alive() (its processes) every probe interval, and GET / of each server on
  its own schedule. A replica whose process is gone, or whose servers have answered nothing for
  `unresponsive_s` (long: a loaded host answers late, and a false loss kills every trial on it), is out
  of placement at once and its runs end with ReplicaLostError (kind replica_lost: an infrastructure
  failure, never a reward of 0);
- starts a replacement (bounded attempts with back-off) in a worker thread, so the event loop never
  waits for server start-up;
- stops placing at close; `relax-gym up` stops the replicas themselves once the gateway is done.

Cleanup of a lost replica's runs is reported `unverified`: its processes are gone, but the cleanup
contract does not say that a run's resources lived only in them (r2e keeps each rollout's checkout on
disk, which outlives a SIGKILL). Admission stays the trial book's, per environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Protocol

import aiohttp
from attrs import frozen

from relax_gym_core.errors import EnvironmentFailure, ReplicaLostError
from relax_gym_core.plugin.runs import (
    CLEANUP_CONFIRMED,
    CLEANUP_UNVERIFIED,
    CleanupResult,
    RunContext,
    RunHandle,
    RunResult,
    Runtime,
)
from relax_gym_core.plugin.specs import EnvKey

logger = logging.getLogger("relax_gym.replicas")


UNAVAILABLE = "replica_unavailable"  # the kind of a run no healthy replica could take
PROBE_TIMEOUT_S = 10.0  # one GET / of one server


class ReplicaProcesses(Protocol):
    """What the pool needs of a started replica (relax_gym_core.replicas.spec.ReplicaHandle has it)."""

    @property
    def name(self) -> str: ...

    @property
    def urls(self) -> Mapping[str, str]: ...

    def alive(self) -> bool: ...

    def stop(self) -> None: ...


@frozen
class StartedReplica:
    """A started replica and its runtimes, one per (environment, config) it serves."""

    handle: ReplicaProcesses
    runtimes: Mapping[EnvKey, Runtime]


@frozen(kw_only=True)
class PoolStatus:
    wanted: int
    healthy: int
    starting: int
    lost: int  # replicas lost since start
    placed: Mapping[str, int]  # replica name -> runs placed on it since start (lost replicas included)
    running: Mapping[str, int]  # replica name -> runs in flight on it now (healthy replicas)


class _Replica:
    def __init__(self, started: StartedReplica, incarnation: str) -> None:
        self.handle = started.handle
        self.placement = f"{started.handle.name}@{incarnation}"
        self.runtimes = started.runtimes
        self.running = 0
        self.placed = 0
        self.answered_at: float | None = None  # loop time of its last full answer (None: not probed yet)
        self.lost = False
        self.lost_event = asyncio.Event()

    @property
    def name(self) -> str:
        return self.handle.name


class PooledRun:
    """One run on one replica; fails with ReplicaLostError if that replica dies while it runs.

    A run placed by this pool counts in its replica's runs in flight until its wait ends or it is
    aborted, whichever comes first (a trial aborted while its run was starting is never waited for); a
    handle made for the cleanup of a run placed elsewhere (`counted=False`) never counted.
    """

    def __init__(
        self, pool: ReplicaPool, replica: _Replica, inner: RunHandle, rollout_id: str, *, counted: bool = True
    ) -> None:
        self._pool = pool
        self._replica = replica
        self._inner = inner
        self._rollout_id = rollout_id
        self._released = not counted

    @property
    def placement(self) -> str:
        """Where it runs, for the ledger (TrialService records it)."""
        return self._replica.placement

    def _release(self) -> None:
        if not self._released:
            self._released = True
            self._replica.running -= 1

    async def wait(self) -> RunResult:
        replica = self._replica
        run = asyncio.ensure_future(self._inner.wait())
        lost = asyncio.ensure_future(replica.lost_event.wait())
        try:
            await asyncio.wait((run, lost), return_when=asyncio.FIRST_COMPLETED)
            if not run.done():
                run.cancel()  # closes the call to the dead replica
                await asyncio.gather(run, return_exceptions=True)
                raise ReplicaLostError(f"replica {replica.name} was lost while the run was in flight")
            if run.exception() is not None and await self._pool.confirm_lost(replica):
                # The call failed because its replica died (connection reset, or the agent's 500 when
                # only the resources server died): name that, not the symptom.
                raise ReplicaLostError(f"replica {replica.name} was lost while the run was in flight")
            return run.result()
        finally:
            for task in (run, lost):
                task.cancel()
            await asyncio.gather(run, lost, return_exceptions=True)
            self._release()

    async def _cleanup(self, step: Callable[[], Awaitable[CleanupResult]]) -> CleanupResult:
        if self._replica.lost:
            self._release()
            return CLEANUP_UNVERIFIED  # nothing left to ask; see the module docstring
        result = await step()
        if result.confirmed:
            self._pool.forget(self._rollout_id)
        elif self._replica.lost_event.is_set():
            return CLEANUP_UNVERIFIED  # lost while it was asked: its failure says nothing about the run
        return result

    async def abort(self) -> CleanupResult:
        self._release()  # also when the abort came while the run was starting: nobody waits for it then
        if self._replica.lost:
            return CLEANUP_UNVERIFIED
        return await self._cleanup(self._inner.abort)

    async def force_cleanup(self) -> CleanupResult:
        return await self._cleanup(self._inner.force_cleanup)

    async def probe_cleanup(self) -> CleanupResult:
        return await self._cleanup(self._inner.probe_cleanup)


class _GoneReplica:
    """A run of an earlier gateway process on a replica that went with it: nobody can prove its cleanup."""

    unreachable = True  # recovery records `unverified` at once instead of retrying (trials/recovery.py)
    placement = None

    async def wait(self) -> RunResult:
        raise ReplicaLostError("the replica that ran this run is gone")

    async def abort(self) -> CleanupResult:
        return CLEANUP_UNVERIFIED

    async def force_cleanup(self) -> CleanupResult:
        return CLEANUP_UNVERIFIED

    async def probe_cleanup(self) -> CleanupResult:
        return CLEANUP_UNVERIFIED


class _EveryReplica:
    """A run of an earlier gateway process: which replica ran it is not known here, so its cleanup goes
    to every healthy replica and is confirmed only when all of them confirm it (by rollout id)."""

    placement = None

    def __init__(self, handles: list[RunHandle]) -> None:
        self._handles = handles

    async def wait(self) -> RunResult:
        raise EnvironmentFailure("a run of an earlier gateway process cannot be waited for", kind=UNAVAILABLE)

    async def _all(self, steps: Iterable[Callable[[], Awaitable[CleanupResult]]]) -> CleanupResult:
        results = await asyncio.gather(*(step() for step in steps))
        failed = [result for result in results if not result.confirmed]
        if not self._handles:
            return CLEANUP_UNVERIFIED
        return failed[0] if failed else CLEANUP_CONFIRMED

    async def abort(self) -> CleanupResult:
        return await self._all(handle.abort for handle in self._handles)

    async def force_cleanup(self) -> CleanupResult:
        return await self._all(handle.force_cleanup for handle in self._handles)

    async def probe_cleanup(self) -> CleanupResult:
        return await self._all(handle.probe_cleanup for handle in self._handles)


class ReplicaPool:
    """The Runtime of every (environment, config) served by one set of replicas.

    `start_replica(name)` starts one more replica (blocking: it runs in a worker thread) for replacements.
    """

    def __init__(
        self,
        replicas: Iterable[StartedReplica],
        *,
        start_replica: Callable[[str], StartedReplica] | None = None,
        names: Callable[[], str] | None = None,
        probe_interval_s: float = 0.5,
        restart_delay_s: float = 1.0,
        max_restart_attempts: int = 3,
        unresponsive_s: float = 60.0,
        incarnation: str | None = None,
    ) -> None:
        # Tells this process's replicas from those of earlier ones; a launcher whose replicas outlive the
        # gateway (and are found again) passes the incarnation they were started under.
        self.incarnation = incarnation or secrets.token_hex(4)
        self._replicas = [_Replica(started, self.incarnation) for started in replicas]
        self.wanted = len(self._replicas)
        self.environments = sorted({key[0] for r in self._replicas for key in r.runtimes})
        self._start_replica = start_replica
        self._names = names
        self._probe_interval_s = probe_interval_s
        # GET / costs each server a request (and its framework's middleware): asked 30 times per
        # unresponsive_s at most, which still notices silence within a thirtieth of the bound that acts on it.
        self._answer_interval_s = max(probe_interval_s, unresponsive_s / 30)
        self._restart_delay_s = restart_delay_s
        self._max_attempts = max_restart_attempts
        self._unresponsive_s = unresponsive_s
        self._placements: dict[str, _Replica] = {}
        self._starting = 0
        self._lost_total = 0
        self._placed_lost: dict[str, int] = {}
        self._closing = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._monitors: list[asyncio.Task[None]] = []
        self._http: aiohttp.ClientSession | None = None

    # ---- runs -------------------------------------------------------------------------------------------

    async def start(self, context: RunContext) -> RunHandle:
        if self._closing:
            raise EnvironmentFailure("the replica pool is closing", kind=UNAVAILABLE)
        self.open()
        key = (context.environment, context.config)
        healthy = [r for r in self._replicas if not r.lost and key in r.runtimes]
        if not healthy:
            raise EnvironmentFailure(
                f"no healthy replica of environment {context.environment!r} ({self._starting} starting)",
                kind=UNAVAILABLE,
            )
        replica = min(healthy, key=lambda r: r.running)  # ties: the earliest started
        replica.running += 1
        replica.placed += 1
        self._placements[context.rollout_id] = replica
        try:
            inner = await replica.runtimes[key].start(context)
        except BaseException:
            replica.running -= 1
            self._placements.pop(context.rollout_id, None)
            raise
        return PooledRun(self, replica, inner, context.rollout_id)

    def runtime_for(self, key: EnvKey) -> PoolRuntime:
        """The Runtime of one (environment, config) on this pool (what the gateway's service holds)."""
        return PoolRuntime(self, key)

    def handle_for(self, key: EnvKey, rollout_id: str, placement: str | None = None) -> RunHandle:
        """The run `rollout_id` for its cleanup: on the replica `placement` names (as the ledger recorded
        it) or this process placed it on; a run placed nobody knows where goes to every replica."""
        if placement is not None:
            ran = next((r for r in self._replicas if r.placement == placement and key in r.runtimes), None)
            if ran is None:
                return _GoneReplica()
            return PooledRun(self, ran, ran.runtimes[key].handle_for(rollout_id), rollout_id, counted=False)
        replica = self._placements.get(rollout_id)
        if replica is not None and key in replica.runtimes:
            inner = replica.runtimes[key].handle_for(rollout_id)
            return PooledRun(self, replica, inner, rollout_id, counted=False)
        live = [
            r.runtimes[key].handle_for(rollout_id) for r in self._replicas if not r.lost and key in r.runtimes
        ]
        return _EveryReplica(live)

    def replica_of(self, rollout_id: str) -> str | None:
        """The replica a live run was placed on (None once its cleanup is confirmed, or unknown)."""
        replica = self._placements.get(rollout_id)
        return None if replica is None else replica.name

    def forget(self, rollout_id: str) -> None:
        self._placements.pop(rollout_id, None)

    async def ready(self) -> bool:
        self.open()
        healthy = [r for r in self._replicas if not r.lost]
        if not healthy:
            return False
        checks = [runtime.ready() for r in healthy for runtime in r.runtimes.values()]
        results = await asyncio.gather(*checks, return_exceptions=True)
        return all(result is True for result in results)

    async def close(self) -> None:
        """Stop placing and probing (the replicas' processes are their launcher's to stop)."""
        if self._closing:
            return
        self._closing = True
        for task in (*self._tasks, *self._monitors):
            task.cancel()
        await asyncio.gather(*self._tasks, *self._monitors, return_exceptions=True)
        for replica in self._replicas:
            for runtime in {id(r): r for r in replica.runtimes.values()}.values():
                await runtime.close()
        if self._http is not None:
            await self._http.close()

    # ---- health -----------------------------------------------------------------------------------------

    def open(self) -> None:
        """Start probing (idempotent; needs the running loop, so the gateway calls it at start-up)."""
        if not self._monitors and not self._closing:
            self._monitors = [
                asyncio.create_task(self._watch_processes(), name="relax-gym replica processes"),
                asyncio.create_task(self._watch_answers(), name="relax-gym replica answers"),
            ]

    def status(self) -> PoolStatus:
        healthy = [r for r in self._replicas if not r.lost]
        placed = dict(self._placed_lost)
        placed.update({r.name: r.placed for r in self._replicas})
        return PoolStatus(
            wanted=self.wanted,
            healthy=len(healthy),
            starting=self._starting,
            lost=self._lost_total,
            placed=placed,
            running={r.name: r.running for r in healthy},
        )

    async def confirm_lost(self, replica: _Replica) -> bool:
        """After a failed call: is its replica dead? No as soon as all its servers answer GET / (the
        failure was the run's own); yes once its process is reported gone. A replica whose servers are
        silent is waited for: how long its host takes to report a dead node is the cluster's business
        (Ray's health checks take seconds), and the unresponsive watch bounds it anyway."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self._unresponsive_s + self._probe_interval_s
        while not self._closing:
            if replica.lost:
                return True
            if not replica.handle.alive():
                self._lose(replica, "its process exited")
                return True
            if await self._answers(replica) or loop.time() > give_up:
                return replica.lost
            await asyncio.sleep(self._probe_interval_s / 5)
        return replica.lost

    async def _watch_processes(self) -> None:
        """Cheap and certain: a replica whose process has exited is lost at once."""
        while True:
            await asyncio.sleep(self._probe_interval_s)
            for replica in [r for r in self._replicas if not r.lost]:
                if not replica.handle.alive():
                    self._lose(replica, "its process exited")

    async def _watch_answers(self) -> None:
        """GET / of every server: a replica silent for unresponsive_s is lost (hung, or unreachable)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self._answer_interval_s)
            replicas = [r for r in self._replicas if not r.lost]
            answers = await asyncio.gather(*(self._answers(r) for r in replicas))
            now = loop.time()
            for replica, answered in zip(replicas, answers, strict=True):
                if answered or replica.answered_at is None:
                    replica.answered_at = now  # (a new replica answered GET / just before it joined)
                elif not replica.lost and now - replica.answered_at > self._unresponsive_s:
                    self._lose(replica, f"its servers answered nothing for {now - replica.answered_at:.0f} s")

    async def _answers(self, replica: _Replica) -> bool:
        if self._http is None:
            self._http = aiohttp.ClientSession(
                trust_env=False, timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
            )

        async def check(url: str) -> bool:
            assert self._http is not None
            try:
                async with self._http.get(f"{url}/") as response:
                    return response.status < 300
            except (aiohttp.ClientError, TimeoutError):
                return False

        return all(await asyncio.gather(*(check(url) for url in replica.handle.urls.values())))

    def _lose(self, replica: _Replica, why: str) -> None:
        if replica.lost:
            return
        replica.lost = True
        replica.lost_event.set()  # its runs end now (PooledRun.wait)
        self._lost_total += 1
        self._replicas.remove(replica)
        self._placed_lost[replica.name] = replica.placed
        for rollout_id in [k for k, v in self._placements.items() if v is replica]:
            del self._placements[rollout_id]
        logger.error(
            "replica %s lost (%s): out of placement, %d run(s) ended", replica.name, why, replica.running
        )
        # Stop what is left of it (its other servers) off the loop: stop() waits for processes to exit.
        threading.Thread(target=_quietly, args=(replica.handle.stop,), daemon=True).start()
        if self._start_replica is not None and not self._closing:
            task = asyncio.create_task(self._replace(), name=f"relax-gym replace {replica.name}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _replace(self) -> None:
        assert self._start_replica is not None
        self._starting += 1
        try:
            delay = self._restart_delay_s
            for attempt in range(1, self._max_attempts + 1):
                await asyncio.sleep(delay)
                name = self._names() if self._names is not None else f"replacement-{self._lost_total}"
                try:
                    started = await _in_thread(self._start_replica, name)
                except Exception as exc:  # noqa: BLE001 - logged (without a trace: no secrets), retried
                    logger.error(  # noqa: TRY400
                        "replacement replica %s failed to start (attempt %d of %d): %s",
                        name,
                        attempt,
                        self._max_attempts,
                        type(exc).__name__,
                    )
                    delay *= 2
                    continue
                if self._closing:
                    await _in_thread(started.handle.stop)
                    return
                self._replicas.append(_Replica(started, self.incarnation))
                logger.warning("replica %s started (replacement)", name)
                return
            logger.error(
                "no replacement replica after %d attempts; the pool stays degraded", self._max_attempts
            )
        finally:
            self._starting -= 1


class PoolRuntime:
    """One (environment, config) of a ReplicaPool, as the Runtime the trial service drives."""

    def __init__(self, pool: ReplicaPool, key: EnvKey) -> None:
        self.pool = pool
        self.key = key

    async def start(self, context: RunContext) -> RunHandle:
        return await self.pool.start(context)

    def handle_for(self, rollout_id: str, placement: str | None = None) -> RunHandle:
        return self.pool.handle_for(self.key, rollout_id, placement)

    async def ready(self) -> bool:
        return await self.pool.ready()

    async def close(self) -> None:
        await self.pool.close()


def _quietly(stop: Callable[[], None]) -> None:
    try:
        stop()
    except Exception:  # the launcher's close() stops it again, and reports
        logger.warning("stopping a lost replica failed", exc_info=True)


async def _in_thread[T](function: Callable[..., T], *args: object) -> T:
    """Run blocking `function` in a daemon thread: unlike asyncio.to_thread, a gateway shutting down
    does not wait for a replica start-up that may take minutes (its launcher stops the result)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def deliver(result: T | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def work() -> None:
        try:
            result = function(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(deliver, None, exc)
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(deliver, result, None)

    threading.Thread(target=work, daemon=True, name="relax-gym replica start").start()
    return await future
