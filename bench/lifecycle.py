"""Trial lifecycle benchmark: throughput, memory per idle trial, abort latency, janitor cost vs history, and
the durable ledger side by side with memory (throughput share, memory per finished trial).

Run: .venv/bin/python bench/lifecycle.py  (or `make bench`). Prints one table, each figure next to its
target, and exits 0 whatever the figures are: a slow machine shows MISS, it does not fail.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import shutil
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import attrs

from relax_gym_core.protocol import CreateTrialRequest, TrialStatus, parse_create_request
from relax_gym_core.runtimes import CLEANUP_CONFIRMED, EchoRuntime, RunResult
from relax_gym_core.testing.web import start_gateway
from relax_gym_core.trajectories import TrajectoryStore
from relax_gym_core.trials import Admission, LedgerStore, MemoryStore, TrialBook, TrialService, TrialStore

KEY = ("echo", "echo")
LIFECYCLES = 20_000  # in-process throughput run
IDLE_TRIALS = 10_000  # memory runs
ABORTED = 2_000  # abort runs
RETAINED = 100_000  # janitor/GET growth run; ledger memory run
HTTP_LOOPS = 32
HTTP_SECONDS = 6.0
TRAJECTORY_ROUNDS = 5  # on/off alternations of the trajectory rows
TERMINAL = frozenset({"completed", "truncated", "aborted", "failed"})


class Row(NamedTuple):
    figure: str
    value: str
    target: str
    ok: bool | None  # None: information only


# ---- shared helpers -------------------------------------------------------------------------------------


def body(request_id: str, *, config: str = "echo", sleep_s: float = 0.0) -> dict[str, Any]:
    """A valid create body for the echo environment (what Relax would send)."""
    return {
        "protocol_version": "relax-nemo-gym/v1",
        "request_id": request_id,
        "session": {"session_id": "bench-session", "group_id": "g1", "rollout_mode": "train"},
        "environment": {
            "name": "echo",
            "config": config,
            "task": {
                "messages": [{"role": "user", "content": "hi"}],
                "metadata": {"echo": {"sleep_s": sleep_s}},
            },
        },
        "model_endpoint": {"base_url": "http://127.0.0.1:9/v1", "api_key": "sk-bench", "model": "policy"},
        "interrupt_policy": "protected",
        "deadline_s": 3600,
        "lease_s": 3600,
    }


def requests(prefix: str, count: int, *, sleep_s: float = 0.0) -> list[CreateTrialRequest]:
    """Parsed once, copied with new ids: the in-process figures time the trial manager, not JSON parsing."""
    template = parse_create_request(body(f"{prefix}-0", sleep_s=sleep_s))
    return [attrs.evolve(template, request_id=f"{prefix}-{i}") for i in range(count)]


def make_service(
    max_concurrency: int,
    queue_capacity: int,
    store: TrialStore | None = None,
    trajectories: TrajectoryStore | None = None,
) -> TrialService:
    book = TrialBook(
        clock=time.monotonic,
        store=store if store is not None else MemoryStore(),
        environments={KEY: Admission(max_concurrency=max_concurrency, queue_capacity=queue_capacity)},
        on_terminal=trajectories.finished if trajectories is not None else None,
    )
    return TrialService(book, {KEY: EchoRuntime()}, trajectories=trajectories)


def settled(service: TrialService) -> bool:
    """Every trial terminal with its cleanup settled (no slot held)."""
    return service.book.active == 0 and service.book.env_counts(KEY)[2] == 0


async def let_runs_start() -> None:
    """A few loop turns, so every new supervisor starts its run and reaches the run's sleep."""
    for _ in range(10):
        await asyncio.sleep(0.01)


def finish(book: TrialBook, request: CreateTrialRequest) -> None:
    """Take one trial through its whole lifecycle synchronously, as an echo run would end."""
    book.create(request)
    book.start_ready([KEY])
    book.complete(request.request_id, RunResult(reward=1.0, metrics={"echo": True}))
    book.finish_cleanup(request.request_id, CLEANUP_CONFIRMED)


async def until(predicate: Callable[[], bool], *, timeout_s: float = 120.0) -> None:
    stop = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > stop:
            raise TimeoutError("benchmark condition not reached")
        await asyncio.sleep(0.001)


def confirmed(service: TrialService, batch: Iterable[CreateTrialRequest], status: TrialStatus) -> int:
    snapshots = (service.get(request.request_id) for request in batch)
    return sum(1 for snap in snapshots if snap.status is status and snap.cleanup == "confirmed")


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---- 1. in-process lifecycles ---------------------------------------------------------------------------


async def inprocess_run(
    count: int, store: TrialStore | None = None, limit: int = 512, trajectories: TrajectoryStore | None = None
) -> tuple[float, float, int]:
    """(wall s, CPU s, confirmed) for `count` lifecycles; with a ledger, until the last one is written;
    with trajectories, until the last one is written too."""
    service = make_service(limit // 2, limit // 2, store=store, trajectories=trajectories)
    if trajectories is not None:
        await trajectories.start()  # as the gateway's lifespan does
    await service.start()
    batch = requests("inproc", count)
    wall, cpu = time.perf_counter(), time.process_time()
    created = 0
    while created < count:
        queued, running, _ = service.book.env_counts(KEY)
        room = min(limit - queued - running, count - created)
        for request in batch[created : created + room]:
            service.create(request)
        created += room
        await asyncio.sleep(0)
    await until(lambda: settled(service))
    for request in batch:
        await service.written(request.request_id)  # durable, as a poll would wait for it
    if trajectories is not None:
        await trajectories.flush()  # until the last one is written
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    done = confirmed(service, batch, TrialStatus.COMPLETED)
    await service.close()
    return wall, cpu, done


async def inprocess_lifecycles(count: int) -> list[Row]:
    wall, cpu, done = await inprocess_run(count)
    return [
        Row(
            f"in-process lifecycles/s ({done:,} confirmed)",
            f"{count / wall:,.0f}",
            ">= 1,000",
            count / wall >= 1000,
        ),
        Row(
            "in-process CPU per lifecycle", f"{cpu / count * 1e6:,.0f} us", "<= 1,000 us", cpu / count <= 1e-3
        ),
    ]


# ---- 4a. abort in-process -------------------------------------------------------------------------------


async def inprocess_abort(count: int) -> list[Row]:
    service = make_service(max_concurrency=count, queue_capacity=0)
    await service.start()
    batch = requests("hold", count, sleep_s=3600)
    for request in batch:
        service.create(request)
    await let_runs_start()
    start = time.perf_counter()
    for request in batch:
        service.abort(request.request_id)
    await until(lambda: settled(service))
    elapsed = time.perf_counter() - start
    ok = confirmed(service, batch, TrialStatus.ABORTED)
    await service.close()
    return [
        Row(f"in-process abort {count:,} live ({ok:,} confirmed)", f"{elapsed:.3f} s", "<= 3 s", elapsed <= 3)
    ]


# ---- 3. memory per idle trial (a fresh interpreter per kind) ------------------------------------------


async def _add_idle(service: TrialService, prefix: str, count: int, expected: tuple[int, int]) -> None:
    """Create `count` sleeping trials, each keeping its own parsed request as in the gateway."""
    for i in range(count):
        service.create(parse_create_request(json.dumps(body(f"{prefix}-{i}", sleep_s=3600))))
    await let_runs_start()
    queued, running, _ = service.book.env_counts(KEY)
    if (queued, running) != expected:
        raise RuntimeError(f"expected (queued, running) = {expected}, found {(queued, running)}")


async def _idle_memory(kind: str, count: int) -> tuple[float, float, float]:
    """Bytes per trial of `count` running or queued trials (by RSS, then by tracemalloc over a second
    batch), and the seconds close() takes to cancel all 2 * count of them."""
    running = kind == "running"
    service = make_service(
        max_concurrency=2 * count if running else 1, queue_capacity=0 if running else 2 * count
    )
    await service.start()
    if not running:  # occupy the only slot so every measured trial stays queued
        service.create(parse_create_request(body("occupant", sleep_s=3600)))
    await asyncio.sleep(0.05)
    gc.collect()
    before = rss_bytes()
    await _add_idle(service, "rss", count, (0, count) if running else (count, 1))
    gc.collect()
    rss = (rss_bytes() - before) / count
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    await _add_idle(service, "traced", count, (0, 2 * count) if running else (2 * count, 1))
    gc.collect()
    traced = (tracemalloc.get_traced_memory()[0] - before) / count
    tracemalloc.stop()
    start = time.perf_counter()
    await service.close()
    return traced, rss, time.perf_counter() - start


def idle_memory(kind: str) -> tuple[float, float, float]:
    return asyncio.run(_idle_memory(kind, IDLE_TRIALS))


def terminal_memory(count: int = IDLE_TRIALS) -> float:
    """Bytes per settled terminal trial kept for the retention period (record, indexes, stale timers)."""
    service = make_service(max_concurrency=count, queue_capacity=0)
    book, batch = service.book, requests("done", count)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for request in batch:
        finish(book, request)
    gc.collect()
    retained = (tracemalloc.get_traced_memory()[0] - before) / count
    tracemalloc.stop()
    return retained


def memory_rows() -> list[Row]:
    with ProcessPoolExecutor(max_workers=2, mp_context=get_context("spawn"), max_tasks_per_child=1) as pool:
        running, queued = pool.submit(idle_memory, "running"), pool.submit(idle_memory, "queued")
        terminal = pool.submit(terminal_memory)
        (run_traced, run_rss, closed), (queue_traced, queue_rss, _) = running.result(), queued.result()
        done = terminal.result()
    return [
        Row(
            f"memory per running trial, traced / RSS ({IDLE_TRIALS:,})",
            f"{run_traced:,.0f} / {run_rss:,.0f} B",
            "<= 4,096 B",
            run_traced <= 4096,  # live memory; RSS also holds the burst's freed parse buffers (see README)
        ),
        Row(
            f"memory per queued trial, traced / RSS ({IDLE_TRIALS:,})",
            f"{queue_traced:,.0f} / {queue_rss:,.0f} B",
            "<= 4,096 B",
            queue_traced <= 4096,
        ),
        Row("live trials in one process", f"{2 * IDLE_TRIALS:,} running", ">= 10,000", True),
        Row(f"close() with {2 * IDLE_TRIALS:,} running trials", f"{closed:.2f} s", "", None),
        Row("memory per retained terminal trial", f"{done:,.0f} B", "", None),
    ]


# ---- 5. janitor and GET cost against trials ever seen ---------------------------------------------------


def history(retained: int) -> tuple[Callable[[], object], Callable[[], object]]:
    """(janitor tick, GET) of a book holding `retained` settled terminal trials and 100 active ones."""
    service = make_service(max_concurrency=retained + 100, queue_capacity=0)
    book = service.book
    for request in requests(f"old{retained}", retained):
        finish(book, request)
    live = requests(f"live{retained}", 100, sleep_s=3600)
    for request in live:
        book.create(request)

    def tick() -> None:
        book.expire_due()
        book.evict_expired()

    return tick, lambda: service.get(live[-1].request_id)


def per_call_us(calls: list[Callable[[], object]], number: int = 10_000, rounds: int = 15) -> list[float]:
    """Best-of-rounds CPU time per call; rounds interleave the calls so background load hits all alike."""
    best = [float("inf")] * len(calls)
    for _ in range(rounds):
        for index, call in enumerate(calls):
            start = time.thread_time()
            for _ in range(number):
                call()
            best[index] = min(best[index], (time.thread_time() - start) / number * 1e6)
    return best


def history_rows() -> list[Row]:
    (tick0, get0), (tick1, get1) = history(0), history(RETAINED)
    gc.collect()
    gc.disable()  # a collection over 100k records inside a timed round is noise, not per-call cost
    try:
        t0, t1, g0, g1 = per_call_us([tick0, tick1, get0, get1])
    finally:
        gc.enable()
    return [
        Row(
            f"janitor tick, {RETAINED:,} vs 0 retained",
            f"{t1 / t0:.2f}x ({t1:.2f} / {t0:.2f} us)",
            "~1x (<= 1.5)",
            t1 / t0 <= 1.5,
        ),
        Row(
            f"service.get, {RETAINED:,} vs 0 retained",
            f"{g1 / g0:.2f}x ({g1:.2f} / {g0:.2f} us)",
            "~1x (<= 1.5)",
            g1 / g0 <= 1.5,
        ),
    ]


# ---- 2 and 4b. over HTTP against a real gateway process ------------------------------------------------


class Connection:
    """A minimal keep-alive HTTP/1.1 JSON client. httpx spends ~3x the gateway's CPU per request, so on two
    cores it, not the gateway, would set the pace."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str) -> None:
        self._reader, self._writer, self._host = reader, writer, host

    @classmethod
    async def open(cls, url: str) -> Connection:
        parts = urlsplit(url)
        assert parts.hostname is not None and parts.port is not None
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        return cls(reader, writer, parts.netloc)

    async def request(self, method: str, path: str, payload: object = None) -> tuple[int, Any]:
        data = b"" if payload is None else json.dumps(payload).encode()
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self._host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        )
        self._writer.write(head.encode() + data)
        lines = (await self._reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        content = await self._reader.readexactly(length)
        return int(lines[0].split()[1]), json.loads(content) if content else None

    async def close(self) -> None:
        self._writer.close()
        await self._writer.wait_closed()


def is_terminal(snapshot: dict[str, Any]) -> bool:
    return snapshot["status"] in TERMINAL and snapshot["cleanup"] not in (None, "pending")


async def lifecycle_loops(connections: list[Connection], tag: str, seconds: float) -> tuple[int, int]:
    """Each connection does create + GET-until-terminal for `seconds`; (lifecycles, requests)."""
    stop = time.perf_counter() + seconds

    async def loop(index: int, connection: Connection) -> tuple[int, int]:
        lifecycles = calls = 0
        while time.perf_counter() < stop:
            request_id = f"{tag}-{index}-{lifecycles}"
            _, snapshot = await connection.request("POST", "/v1/trials", body(request_id))
            polls = 0
            while not is_terminal(snapshot):
                if polls:  # the first GET at once, then a short poll interval
                    await asyncio.sleep(0.002)
                _, snapshot = await connection.request("GET", f"/v1/trials/{request_id}")
                polls += 1
            calls += 1 + polls
            lifecycles += 1
        return lifecycles, calls

    results = await asyncio.gather(*(loop(i, c) for i, c in enumerate(connections)))
    return sum(r[0] for r in results), sum(r[1] for r in results)


async def http_lifecycles(connections: list[Connection], pid: int) -> list[Row]:
    await lifecycle_loops(connections, "warm", 1.0)
    wall, cpu, gateway_cpu = time.perf_counter(), time.process_time(), cpu_seconds(pid)
    lifecycles, calls = await lifecycle_loops(connections, "http", HTTP_SECONDS)
    wall = time.perf_counter() - wall
    cpu, gateway_cpu = time.process_time() - cpu, cpu_seconds(pid) - gateway_cpu
    rate, per = lifecycles / wall, gateway_cpu / lifecycles * 1e3
    return [
        Row(f"HTTP lifecycles/s ({len(connections)} loops)", f"{rate:,.0f}", "> 150 (ref)", rate > 150),
        Row("HTTP gateway CPU per lifecycle", f"{per:.2f} ms", "< 8 ms (ref)", per < 8),
        Row("HTTP requests per lifecycle", f"{calls / lifecycles:.2f}", "", None),
        Row("HTTP CPU busy, gateway / client", f"{gateway_cpu / wall:.0%} / {cpu / wall:.0%}", "", None),
    ]


async def each(
    connections: list[Connection], items: Iterable[str], call: Callable[[Connection, str], Awaitable[None]]
) -> None:
    """call(connection, item) for every item, one request in flight per connection."""
    pending = iter(items)

    async def worker(connection: Connection) -> None:
        for item in pending:
            await call(connection, item)

    await asyncio.gather(*(worker(c) for c in connections))


async def http_abort(connections: list[Connection], count: int) -> list[Row]:
    ids = [f"abort-{i}" for i in range(count)]
    snapshots: list[dict[str, Any]] = []

    async def create(connection: Connection, request_id: str) -> None:
        status, _ = await connection.request(
            "POST", "/v1/trials", body(request_id, config="hold", sleep_s=3600)
        )
        if status != 202:
            raise RuntimeError(f"create answered {status}")

    async def abort(connection: Connection, request_id: str) -> None:
        status, _ = await connection.request("POST", f"/v1/trials/{request_id}/abort")
        if status != 202:
            raise RuntimeError(f"abort answered {status}")

    async def get(connection: Connection, request_id: str) -> None:
        snapshots.append((await connection.request("GET", f"/v1/trials/{request_id}"))[1])

    async def active() -> int:
        return int((await connections[0].request("GET", "/healthz"))[1]["active_trials"])

    await each(connections, ids, create)
    await asyncio.sleep(0.2)  # let every run reach its sleep
    start = time.perf_counter()
    await each(connections, ids, abort)
    issued = time.perf_counter() - start
    while True:
        if await active() == 0:
            break
        await asyncio.sleep(0.002)
    elapsed = time.perf_counter() - start
    await each(connections, ids, get)
    ok = sum(1 for s in snapshots if s["status"] == "aborted" and s["cleanup"] == "confirmed")
    return [
        Row(
            f"HTTP abort {count:,} live ({ok:,} confirmed)",
            f"{elapsed:.2f} s (POSTs {issued:.2f})",
            "<= 3 s",
            elapsed <= 3 and ok == count,
        )
    ]


async def over_http() -> list[Row]:
    specs = {
        "echo": {"environment": "echo", "runtime": "echo", "max_concurrency": 64, "queue_capacity": 64},
        "hold": {"environment": "echo", "runtime": "echo", "max_concurrency": ABORTED, "queue_capacity": 0},
    }
    with start_gateway(specs) as gateway:
        connections = [await Connection.open(gateway.url) for _ in range(HTTP_LOOPS)]
        try:
            return [*await http_lifecycles(connections, gateway.pid), *await http_abort(connections, ABORTED)]
        finally:
            for connection in connections:
                await connection.close()


# ---- 6. the durable ledger (SQLite, on disk) side by side with memory ----------------------------------


def share_row(figure: str, disk: float, memory: float) -> Row:
    share = disk / memory
    return Row(figure, f"{share:.0%} ({disk:,.0f} / {memory:,.0f})", ">= 50% of in-memory", share >= 0.5)


async def inprocess_ledger(count: int) -> list[Row]:
    """The in-process run on a MemoryStore and on the ledger, alternated twice (best of each), so
    background load hits both alike. The ledger run ends once its last transition is written."""
    rates: dict[str, list[float]] = {"memory": [], "ledger": []}
    directory = Path(tempfile.mkdtemp(prefix="relax-gym-bench-"))
    try:
        for attempt in range(2):
            for kind, rate in rates.items():
                store = (
                    LedgerStore(directory / f"{attempt}.sqlite3", clock=time.monotonic)
                    if kind == "ledger"
                    else None
                )
                wall, _, _ = await inprocess_run(count, store)
                rate.append(count / wall)
    finally:
        shutil.rmtree(directory)
    return [
        share_row(
            "in-process lifecycles/s, ledger on disk vs in memory", max(rates["ledger"]), max(rates["memory"])
        )
    ]


async def http_rate(tag: str, *, state_dir: str | Path, env: dict[str, str] | None = None) -> float:
    """HTTP lifecycles/s of one real gateway (echo, 64 slots) after a second of warm-up."""
    specs = {"echo": {"environment": "echo", "runtime": "echo", "max_concurrency": 64, "queue_capacity": 64}}
    with start_gateway(specs, state_dir=state_dir, env=env) as gateway:
        connections = [await Connection.open(gateway.url) for _ in range(HTTP_LOOPS)]
        try:
            await lifecycle_loops(connections, f"warm-{tag}", 1.0)
            started = time.perf_counter()
            lifecycles, _ = await lifecycle_loops(connections, tag, HTTP_SECONDS)
            return lifecycles / (time.perf_counter() - started)
        finally:
            for connection in connections:
                await connection.close()


async def http_ledger() -> list[Row]:
    """HTTP lifecycles/s of a real gateway with `--state-dir DIR` and with `--state-dir :memory:`,
    alternated twice (best of each), so background load hits both alike."""
    rates: dict[str, list[float]] = {"memory": [], "ledger": []}
    for attempt in range(2):
        for kind, rate in rates.items():
            with tempfile.TemporaryDirectory(prefix="relax-gym-bench-") as tmp:
                state_dir: str | Path = Path(tmp) / "state" if kind == "ledger" else ":memory:"
                rate.append(await http_rate(f"{kind}-{attempt}", state_dir=state_dir))
    return [
        share_row(
            f"HTTP lifecycles/s, ledger on disk vs in memory ({HTTP_LOOPS} loops)",
            max(rates["ledger"]),
            max(rates["memory"]),
        )
    ]


# ---- 7. trajectories kept (the default) side by side with trajectories off ---------------------------


async def inprocess_trajectories(count: int) -> list[Row]:
    """In-process lifecycles/s with every trial's trajectory written and with none, alternated
    TRAJECTORY_ROUNDS times (best of each: on this shared machine a single run moves by 20 %)."""
    rates: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(TRAJECTORY_ROUNDS):
        for kind, rate in rates.items():
            with tempfile.TemporaryDirectory(prefix="relax-gym-bench-") as tmp:
                store = TrajectoryStore(Path(tmp)) if kind == "on" else None
                wall, _, _ = await inprocess_run(count, trajectories=store)
                if store is not None:
                    await store.close()
                rate.append(count / wall)
    on, off = max(rates["on"]), max(rates["off"])
    # Information: a ~65 us echo lifecycle without HTTP is the capture's worst case; the gateway as
    # deployed (the HTTP row) carries the target.
    return [Row("in-process lifecycles/s, trajectories on vs off", f"{on / off:.0%} ({on:,.0f} / {off:,.0f})",
                "(information)", None)]  # fmt: skip


async def http_trajectories() -> list[Row]:
    """HTTP lifecycles/s of a real gateway with its ledger on disk, trajectories on and off, alternated
    TRAJECTORY_ROUNDS times (best of each)."""
    rates: dict[str, list[float]] = {"off": [], "on": []}
    for attempt in range(TRAJECTORY_ROUNDS):
        for kind, rate in rates.items():
            with tempfile.TemporaryDirectory(prefix="relax-gym-bench-") as tmp:
                env = {"RELAX_GYM_TRAJECTORIES": kind}
                rate.append(await http_rate(f"t{kind}-{attempt}", state_dir=Path(tmp) / "state", env=env))
    on, off = max(rates["on"]), max(rates["off"])
    return [Row(f"HTTP lifecycles/s, trajectories on vs off ({HTTP_LOOPS} loops)",
                f"{on / off:.0%} ({on:,.0f} / {off:,.0f})", ">= 90% of off", on / off >= 0.9)]  # fmt: skip


def ledger_memory(count: int = RETAINED, warm: int = 5_000, traced: int = 10_000) -> tuple[float, float]:
    """Bytes per finished trial on the ledger: RSS growth over `count` trials after `warm`, and
    tracemalloc over the last `traced` of them (a fresh interpreter; the file in a temp directory)."""
    with tempfile.TemporaryDirectory(prefix="relax-gym-bench-") as tmp:
        store = LedgerStore(Path(tmp) / "ledger.sqlite3", clock=time.monotonic)
        service = make_service(max_concurrency=count, queue_capacity=0, store=store)
        batch = requests("flat", warm + count)

        def run(part: list[CreateTrialRequest]) -> None:
            for index, request in enumerate(part, 1):
                finish(service.book, request)
                if index % 1_000 == 0:
                    store.flush_sync()
            store.flush_sync()

        run(batch[:warm])
        gc.collect()
        before = rss_bytes()
        run(batch[warm : warm + count - traced])
        tracemalloc.start()
        start = tracemalloc.get_traced_memory()[0]
        run(batch[warm + count - traced :])
        gc.collect()
        per_traced = (tracemalloc.get_traced_memory()[0] - start) / traced
        tracemalloc.stop()
        per_rss = (rss_bytes() - before) / count
        asyncio.run(store.close())
    return per_traced, per_rss


def ledger_get_us() -> float:
    """CPU per service.get of a settled trial answered from the ledger file (best of rounds)."""
    with tempfile.TemporaryDirectory(prefix="relax-gym-bench-") as tmp:
        store = LedgerStore(Path(tmp) / "ledger.sqlite3", clock=time.monotonic)
        service = make_service(max_concurrency=1_000, queue_capacity=0, store=store)
        for request in requests("old", 1_000):
            finish(service.book, request)
        store.flush_sync()
        (cost,) = per_call_us([lambda: service.get("old-0")], number=2_000, rounds=5)
        asyncio.run(store.close())
    return cost


def ledger_rows() -> list[Row]:
    rows = asyncio.run(inprocess_ledger(LIFECYCLES))
    rows += asyncio.run(http_ledger())
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn"), max_tasks_per_child=1) as pool:
        traced, rss = pool.submit(ledger_memory).result()
    rows.append(
        Row(
            f"memory per finished trial on the ledger, traced / RSS ({RETAINED:,})",
            f"{traced:,.0f} / {rss:,.0f} B",
            "flat (<= 64 B)",
            traced <= 64,
        )
    )
    rows.append(
        Row("service.get of a finished trial, from the ledger file", f"{ledger_get_us():.1f} us", "", None)
    )
    return rows


# ---- table ----------------------------------------------------------------------------------------------


def print_table(rows: list[Row]) -> None:
    header = Row("figure", "value", "target", None)
    widths = [
        max(len((row.figure, row.value, row.target)[column]) for row in (header, *rows))
        for column in range(3)
    ]
    for row in (header, *rows):
        verdict = "ok?" if row is header else "" if row.ok is None else "ok" if row.ok else "MISS"
        cells = (row.figure.ljust(widths[0]), row.value.rjust(widths[1]), row.target.ljust(widths[2]))
        print("  ".join((*cells, verdict)).rstrip())


def main() -> int:
    started, load = time.perf_counter(), os.getloadavg()[0]
    rows = asyncio.run(inprocess_lifecycles(LIFECYCLES))
    rows += asyncio.run(inprocess_abort(ABORTED))
    rows += memory_rows()
    rows += history_rows()
    rows += asyncio.run(over_http())
    rows += ledger_rows()
    rows += asyncio.run(inprocess_trajectories(LIFECYCLES))
    rows += asyncio.run(http_trajectories())
    print_table(rows)
    print(
        f"({time.perf_counter() - started:.0f} s on {os.cpu_count()} CPUs; load average {load:.1f} at start, "
        f"{os.getloadavg()[0]:.1f} at end: wall-clock figures assume an otherwise idle machine)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
