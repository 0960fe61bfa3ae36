"""The replica pool (runtimes/pool.py) without processes: in-process replica handles whose liveness the
test switches, and runs the test ends by hand (finished, failed, aborted) or with its replica.

Two rules no real-process test can check quickly:
- infrastructure failures are never a reward: a run whose replica is lost raises ReplicaLostError (kind
  replica_lost), both when the loss is noticed while the run waits and when its call fails because the
  replica died; through the trial service the trial then ends failed, unscored;
- every run is released from its replica's in-flight count however it ends (finished, failed, its wait
  cancelled, or aborted while it was starting, before anyone waited for it: that one leaked once), so load
  returns to zero and each placement goes to the least-loaded replica.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from relax_gym_core.errors import EnvironmentFailure, ReplicaLostError, RunError
from relax_gym_core.plugin.runs import (
    CLEANUP_CONFIRMED,
    CLEANUP_FAILED,
    CLEANUP_UNVERIFIED,
    CleanupResult,
    RunContext,
    RunHandle,
    RunResult,
)
from relax_gym_core.protocol import CleanupState, CreateTrialRequest, TrialStatus, parse_create_request
from relax_gym_core.replicas.pool import ReplicaPool, StartedReplica
from relax_gym_core.runtimes import EchoRuntime
from relax_gym_core.trials import Admission, MemoryStore, TrialBook, TrialService

pytestmark = pytest.mark.anyio

ENV = ("echo", "default")
SAFETY_S = 30.0  # bounds waits for what must happen; nothing here is timed
FAST_PROBE_S = 0.01  # the pool notices a dead process within a few of these


class Processes:
    """A replica's processes, in this process: alive until the test says otherwise."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.urls: dict[str, str] = {}  # no servers to GET /
        self.up = True
        self.stopped = False

    def alive(self) -> bool:
        return self.up

    def stop(self) -> None:
        self.stopped = True


class Run:
    """One run; it ends when the test resolves `outcome` (a result, or an exception)."""

    def __init__(self) -> None:
        self.outcome: asyncio.Future[RunResult] = asyncio.get_running_loop().create_future()
        self.aborted = False

    async def wait(self) -> RunResult:
        return await asyncio.shield(self.outcome)

    async def abort(self) -> CleanupResult:
        self.aborted = True
        return CLEANUP_CONFIRMED

    async def force_cleanup(self) -> CleanupResult:
        return CLEANUP_CONFIRMED

    async def probe_cleanup(self) -> CleanupResult:
        return CLEANUP_CONFIRMED


class Runs:
    """The runtime of one replica: remembers each run it started, by rollout id."""

    def __init__(self, *, refuse: Callable[[RunContext], bool] = lambda _context: False) -> None:
        self.runs: dict[str, Run] = {}
        self._refuse = refuse

    async def start(self, context: RunContext) -> RunHandle:
        if self._refuse(context):
            raise RunError("this replica refused the run")
        run = self.runs[context.rollout_id] = Run()
        return run

    def handle_for(self, rollout_id: str) -> RunHandle:
        return self.runs.get(rollout_id) or Run()

    async def ready(self) -> bool:
        return True

    async def close(self) -> None:
        return None


def request(request_id: str, echo: dict[str, Any] | None = None) -> CreateTrialRequest:
    body = {
        "protocol_version": "relax-nemo-gym/v1",
        "request_id": request_id,
        "session": {"session_id": f"s-{request_id}", "group_id": "g", "rollout_mode": "train"},
        "environment": {
            "name": ENV[0],
            "config": ENV[1],
            "task": {"messages": [], "metadata": {"echo": echo or {}}},
        },
        "model_endpoint": {"base_url": "http://127.0.0.1:9/v1", "api_key": "sk-x", "model": "m"},
        "interrupt_policy": "protected",
        "deadline_s": 600,
        "lease_s": 600,
    }
    return parse_create_request(json.dumps(body))


def context(rollout_id: str) -> RunContext:
    return RunContext(request=request(rollout_id), rollout_id=rollout_id, environment=ENV[0], config=ENV[1])


def pool_of(
    names: list[str], *, probe_interval_s: float, refuse: Callable[[RunContext], bool] | None = None
) -> tuple[ReplicaPool, dict[str, Processes], dict[str, Runs]]:
    processes = {name: Processes(name) for name in names}
    runtimes = {name: Runs(refuse=refuse) if refuse else Runs() for name in names}
    started = [StartedReplica(processes[name], {ENV: runtimes[name]}) for name in names]
    return ReplicaPool(started, probe_interval_s=probe_interval_s), processes, runtimes


@pytest.fixture
async def closing() -> Any:
    """Pools a test made, closed at its end (their monitor tasks and probe session with them)."""
    pools: list[ReplicaPool] = []
    yield pools.append
    for pool in pools:
        await pool.close()


# ---- a lost replica's run is a typed failure, never a result ----------------------------------------


async def test_a_run_in_flight_when_its_replica_is_lost_raises_replica_lost(closing: Any) -> None:
    pool, processes, runtimes = pool_of(["r0", "r1"], probe_interval_s=FAST_PROBE_S)
    closing(pool)
    handle = await pool.start(context("lost-while-waiting"))
    assert pool.replica_of("lost-while-waiting") == "r0"
    waiting = asyncio.ensure_future(handle.wait())
    processes["r0"].up = False  # its process exits: the pool's process watch notices
    with pytest.raises(ReplicaLostError) as info:
        await asyncio.wait_for(waiting, SAFETY_S)
    assert isinstance(info.value, EnvironmentFailure)
    assert info.value.kind == "replica_lost"
    assert not runtimes["r0"].runs["lost-while-waiting"].outcome.done()  # it never finished: no result
    status = pool.status()
    assert (status.healthy, status.lost, dict(status.running)) == (1, 1, {"r1": 0})
    # Out of placement at once, its cleanup unprovable (its processes held what the run had).
    assert (await handle.abort()).confirmed is False
    nxt = await pool.start(context("after-the-loss"))
    assert pool.replica_of("after-the-loss") == "r1"
    runtimes["r1"].runs["after-the-loss"].outcome.set_result(RunResult(reward=1.0))
    assert (await nxt.wait()).reward == 1.0


async def test_a_run_whose_call_fails_because_its_replica_died_raises_replica_lost(closing: Any) -> None:
    # The watch never runs here (an hour between probes): the failed call itself finds the replica dead.
    pool, processes, runtimes = pool_of(["r0", "r1"], probe_interval_s=3600)
    closing(pool)
    handle = await pool.start(context("reset"))
    processes["r0"].up = False
    runtimes["r0"].runs["reset"].outcome.set_exception(RunError("connection reset by peer"))
    with pytest.raises(ReplicaLostError) as info:
        await asyncio.wait_for(handle.wait(), SAFETY_S)
    assert info.value.kind == "replica_lost"
    status = pool.status()
    assert (status.healthy, status.lost, dict(status.running)) == (1, 1, {"r1": 0})


class CountedProcesses(Processes):
    """Processes whose servers refuse every connection, counting how often the pool asked after them."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        with socket.socket() as closed:  # a loopback port nobody listens on once closed
            closed.bind(("127.0.0.1", 0))
            self.urls = {"resources": f"http://127.0.0.1:{closed.getsockname()[1]}"}
        self.asked = 0

    def alive(self) -> bool:
        self.asked += 1
        return self.up


async def test_a_failed_call_on_a_silent_replica_waits_for_its_host_to_report_the_loss(closing: Any) -> None:
    # A node gone under Ray: the call fails at once, the host reports the actor dead seconds later. The
    # pool does not name the symptom in between: a replica whose servers answer nothing is waited for.
    processes = CountedProcesses("r0")
    runs = Runs()
    pool = ReplicaPool([StartedReplica(processes, {ENV: runs})], probe_interval_s=FAST_PROBE_S)
    closing(pool)
    handle = await pool.start(context("node-gone"))
    runs.runs["node-gone"].outcome.set_exception(RunError("connection refused"))
    waiting = asyncio.ensure_future(handle.wait())
    await until(lambda: processes.asked > 50, "the pool to keep asking")  # long past the old give-up
    assert not waiting.done()
    processes.up = False  # the host's report comes in
    with pytest.raises(ReplicaLostError):
        await asyncio.wait_for(waiting, SAFETY_S)


async def test_a_cleanup_failing_because_its_replica_was_lost_meanwhile_is_unverified(
    closing: Any,
) -> None:
    pool, processes, runtimes = pool_of(["r0"], probe_interval_s=FAST_PROBE_S)
    closing(pool)
    handle = await pool.start(context("gone-while-asked"))
    asked = asyncio.get_running_loop().create_future()
    answer: asyncio.Future[CleanupResult] = asyncio.get_running_loop().create_future()

    async def force_cleanup() -> CleanupResult:
        asked.set_result(None)
        return await answer

    runtimes["r0"].runs["gone-while-asked"].force_cleanup = force_cleanup  # type: ignore[method-assign]
    cleaning = asyncio.ensure_future(handle.force_cleanup())
    await asked
    processes["r0"].up = False
    await until(lambda: pool.status().lost == 1, "the loss to be noticed")
    answer.set_result(CLEANUP_FAILED)  # the dead server's refusal: nothing proven about the run
    assert await asyncio.wait_for(cleaning, SAFETY_S) == CLEANUP_UNVERIFIED


async def test_a_run_that_fails_on_a_healthy_replica_keeps_its_own_error(closing: Any) -> None:
    pool, _processes, runtimes = pool_of(["r0"], probe_interval_s=FAST_PROBE_S)
    closing(pool)
    handle = await pool.start(context("agent-bug"))
    runtimes["r0"].runs["agent-bug"].outcome.set_exception(RunError("the agent crashed"))
    with pytest.raises(RunError) as info:
        await asyncio.wait_for(handle.wait(), SAFETY_S)
    assert not isinstance(info.value, ReplicaLostError)
    assert pool.status().lost == 0


async def until(predicate: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    stop = loop.time() + SAFETY_S
    while not predicate():
        assert loop.time() < stop, f"never happened: {what}"
        await asyncio.sleep(0.005)


def service_on(pool: ReplicaPool, *, concurrency: int) -> TrialService:
    book = TrialBook(
        clock=asyncio.get_running_loop().time,
        store=MemoryStore(),
        environments={ENV: Admission(max_concurrency=concurrency, queue_capacity=16, max_deadline_s=1e6)},
    )
    return TrialService(book, {ENV: pool.runtime_for(ENV)}, cleanup_grace_s=SAFETY_S, scan_interval_s=3600)


async def test_through_the_service_a_lost_replicas_trial_fails_unscored_and_the_other_still_scores(
    closing: Any,
) -> None:
    pool, processes, runtimes = pool_of(["r0", "r1"], probe_interval_s=FAST_PROBE_S)
    closing(pool)
    service = service_on(pool, concurrency=2)
    await service.start()
    try:
        for request_id in ("on-r0", "on-r1"):
            service.create(request(request_id))
        await until(lambda: all(len(r.runs) == 1 for r in runtimes.values()), "a run on each replica")
        processes["r0"].up = False
        lost_id = next(iter(runtimes["r0"].runs))
        (survivor,) = runtimes["r1"].runs.values()
        survivor.outcome.set_result(RunResult(reward=0.5))
        ids = ("on-r0", "on-r1")
        await until(lambda: all(service.get(r).cleanup is not CleanupState.PENDING for r in ids), "settled")
        lost = next(service.get(r) for r in ids if service.book.get(r).rollout_id == lost_id)
        scored = next(service.get(r) for r in ids if service.book.get(r).rollout_id != lost_id)
    finally:
        await service.close()
    assert (lost.status, lost.reward, lost.cleanup) == (TrialStatus.FAILED, None, CleanupState.UNVERIFIED)
    assert lost.error is not None and lost.error["kind"] == "replica_lost"
    assert (scored.status, scored.reward, scored.cleanup) == (
        TrialStatus.COMPLETED,
        0.5,
        CleanupState.CONFIRMED,
    )


# ---- every run is released; placement stays least-loaded --------------------------------------------


class Account:
    """The test's own account of which run is in flight where, to check the pool's against."""

    def __init__(self, pool: ReplicaPool, runtimes: dict[str, Runs]) -> None:
        self.pool = pool
        self.runtimes = runtimes
        self.where: dict[str, str] = {}  # rollout id -> replica, while in flight
        self.ran: dict[str, str] = {}  # rollout id -> replica, for good
        self.handles: dict[str, RunHandle] = {}
        self.placed = dict.fromkeys(runtimes, 0)
        self.order = list(runtimes)  # ties go to the earliest started replica

    def in_flight(self) -> dict[str, int]:
        counts = dict.fromkeys(self.runtimes, 0)
        for replica in self.where.values():
            counts[replica] += 1
        return counts

    def check(self, after: str) -> None:
        status = self.pool.status()
        assert dict(status.running) == self.in_flight(), f"runs in flight after {after}"
        assert dict(status.placed) == self.placed, f"runs placed after {after}"

    async def start(self, rollout_id: str) -> None:
        counts = self.in_flight()
        least = min(self.order, key=lambda name: counts[name])
        handle = await self.pool.start(context(rollout_id))
        assert self.pool.replica_of(rollout_id) == least, f"{rollout_id} not on the least-loaded {least}"
        self.where[rollout_id] = self.ran[rollout_id] = least
        self.handles[rollout_id] = handle
        self.placed[least] += 1
        self.check(f"starting {rollout_id}")

    def run(self, rollout_id: str) -> Run:
        return self.runtimes[self.ran[rollout_id]].runs[rollout_id]

    async def finish(self, rollout_id: str, result: RunResult) -> None:
        self.run(rollout_id).outcome.set_result(result)
        assert await asyncio.wait_for(self.handles[rollout_id].wait(), SAFETY_S) == result
        await self._ended(rollout_id, "finishing")
        assert (await self.handles[rollout_id].probe_cleanup()).confirmed  # as the service does next
        self.check(f"the cleanup of {rollout_id}")

    async def fail(self, rollout_id: str) -> None:
        self.run(rollout_id).outcome.set_exception(RunError("the agent's /run answered 500"))
        with pytest.raises(RunError):
            await asyncio.wait_for(self.handles[rollout_id].wait(), SAFETY_S)
        await self._ended(rollout_id, "failing")
        await self._aborted(rollout_id)  # the service's cleanup ladder of a failed run starts so

    async def abort(self, rollout_id: str, *, waited: bool = True) -> None:
        """As the trial service aborts: the wait is cancelled, then the run is told to abort. Unwaited:
        the abort came while the run was starting, before the service waited for it."""
        if waited:
            waiting = asyncio.ensure_future(self.handles[rollout_id].wait())
            await asyncio.sleep(0)  # the wait is under way when the abort comes
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
            await self._ended(rollout_id, "cancelling the wait of")
        else:
            del self.where[rollout_id]
        await self._aborted(rollout_id)

    async def _ended(self, rollout_id: str, how: str) -> None:
        """Its wait is over: no longer in flight, before any cleanup step."""
        del self.where[rollout_id]
        self.check(f"{how} {rollout_id}")

    async def _aborted(self, rollout_id: str) -> None:
        assert (await self.handles[rollout_id].abort()).confirmed
        assert self.run(rollout_id).aborted
        self.check(f"aborting {rollout_id}")


async def test_nine_runs_on_two_replicas_end_every_way_and_leave_nothing_in_flight(closing: Any) -> None:
    pool, _processes, runtimes = pool_of(["r0", "r1"], probe_interval_s=FAST_PROBE_S)
    closing(pool)
    account = Account(pool, runtimes)
    for rollout_id in ("a", "b", "c", "d"):
        await account.start(rollout_id)  # r0, r1, r0, r1
    await account.finish("a", RunResult(reward=1.0))
    await account.start("e")  # r0: it has one in flight, r1 two
    await account.fail("b")
    await account.start("f")  # r1
    await account.abort("c")
    await account.start("g")  # r0
    await account.start("h")  # a tie: r0
    await account.start("i")  # r1
    await account.finish("d", RunResult(status=TrialStatus.TRUNCATED, reward=0.0))
    await account.fail("e")
    await account.abort("f")
    await account.finish("g", RunResult(reward=0.25))
    await account.abort("h", waited=False)
    await account.fail("i")
    assert dict(pool.status().running) == {"r0": 0, "r1": 0}
    assert sum(account.placed.values()) == 9


async def test_a_run_aborted_before_anyone_waited_for_it_is_released(closing: Any) -> None:
    """The trial service's abort can come while a run is starting: it then never waits for the run,
    only runs its cleanup ladder (the run's count leaked here once)."""
    pool, _processes, runtimes = pool_of(["r0", "r1"], probe_interval_s=FAST_PROBE_S)
    closing(pool)
    account = Account(pool, runtimes)
    await account.start("aborted-while-starting")
    await account.abort("aborted-while-starting", waited=False)
    await account.start("next")  # r0 again: nothing is left in flight there
    assert dict(pool.status().running) == {"r0": 1, "r1": 0}


async def test_a_cleanup_handle_for_a_recorded_placement_counts_nothing(closing: Any) -> None:
    """Cleanup after a restart addresses a run this pool did not start: no count to take back."""
    pool, _processes, _runtimes = pool_of(["r0", "r1"], probe_interval_s=FAST_PROBE_S)
    closing(pool)
    placement = f"r1@{pool.incarnation}"
    for step in ("abort", "force_cleanup", "probe_cleanup"):
        handle = pool.handle_for(ENV, f"recovered-{step}", placement)
        assert (await getattr(handle, step)()).confirmed
    assert dict(pool.status().running) == {"r0": 0, "r1": 0}
    await pool.start(context("fresh"))
    assert pool.replica_of("fresh") == "r0"


async def test_a_run_that_fails_to_start_holds_no_place(closing: Any) -> None:
    pool, _processes, runtimes = pool_of(
        ["r0", "r1"], probe_interval_s=FAST_PROBE_S, refuse=lambda c: c.rollout_id.startswith("refused")
    )
    closing(pool)
    for rollout_id in ("refused-1", "refused-2", "refused-3"):
        with pytest.raises(RunError):
            await pool.start(context(rollout_id))
        assert pool.replica_of(rollout_id) is None
    assert dict(pool.status().running) == {"r0": 0, "r1": 0}
    await pool.start(context("ok"))
    assert pool.replica_of("ok") == "r0"  # every refusal went to r0 (least loaded) and left it so
    assert dict(pool.status().running) == {"r0": 1, "r1": 0}
    assert list(runtimes["r0"].runs) == ["ok"]


def running(service: TrialService, request_id: str) -> Callable[[], bool]:
    return lambda: service.get(request_id).status is TrialStatus.RUNNING


def echo_trials() -> Iterator[tuple[str, dict[str, Any], TrialStatus]]:
    """Nine echo trials: three scored, three failing, three held until aborted."""
    for index in range(3):
        yield f"scored-{index}", {"reward": 0.5}, TrialStatus.COMPLETED
        yield f"failing-{index}", {"fail": True}, TrialStatus.FAILED
        yield f"held-{index}", {"sleep_s": 3600}, TrialStatus.ABORTED


async def test_nine_echo_trials_through_the_service_on_two_replicas_return_every_slot(closing: Any) -> None:
    replicas = [StartedReplica(Processes(name), {ENV: EchoRuntime()}) for name in ("r0", "r1")]
    pool = ReplicaPool(replicas, probe_interval_s=FAST_PROBE_S)
    closing(pool)
    service = service_on(pool, concurrency=4)  # more trials than slots, more slots than replicas
    await service.start()
    trials = list(echo_trials())
    try:
        for request_id, echo, _ in trials:
            service.create(request(request_id, echo))
        for request_id in [r for r, _, status in trials if status is TrialStatus.ABORTED]:
            await until(running(service, request_id), f"{request_id} running")
            service.abort(request_id)
        await until(
            lambda: all(service.get(r).cleanup is not CleanupState.PENDING for r, _, _ in trials), "settled"
        )
        outcomes = {r: service.get(r).status for r, _, _ in trials}
        status = pool.status()
    finally:
        await service.close()
    assert outcomes == {r: expected for r, _, expected in trials}
    assert (status.healthy, status.lost) == (2, 0)
    assert dict(status.running) == {"r0": 0, "r1": 0}
    assert sum(status.placed.values()) == 9
