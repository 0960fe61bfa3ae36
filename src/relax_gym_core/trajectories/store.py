"""Trajectories: what each trial's run was asked and answered, and every model call it made, in order.

A trial's Recorder is fed while the trial runs — by its runtime (the /run body and the environment's
answer) and by the bridge (each model call: the body as sent upstream, the answer, status, time,
attempts). Feeding it is cheap because the bridge calls it on every model call: it keeps references to
bytes it was given and counts them against the per-trial cap, past which it keeps only their sizes.
When the trial ends (the trial book's on_terminal), it joins a batch; every BATCH_S the event loop hands
the batch to the writer process (writer.py), which stores each trial as one row of
`<state dir>/trajectories/trajectories.sqlite3` (0600): a header, then the bodies as they came, each
with every secret of the trial (API key, session id, rollout id, header values) replaced — bodies past
the cap were never kept, and a marker says how much. Nothing is parsed or folded until a reader asks
(decode); a reader of a trial not yet written gets the same document from the record in hand, so reading
a trajectory as its trial ends (relax-gym rollout does, for every trial) neither waits for the writer nor
makes it write a batch early. A trial that was running when the gateway died has none. Rows go with
their trial's record: the writer deletes those past the ledger's retention, and the oldest beyond
max_retained.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import json
import logging
import marshal
import os
import sqlite3
import sys
import tempfile
import time
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from relax_gym_core.protocol import TrialStatus
from relax_gym_core.trajectories import writer
from relax_gym_core.trajectories.fold import fold_stream, usage_of
from relax_gym_core.trajectories.writer import FORMAT, FRAME, ModelCall, Record, connect, cut_marker

logger = logging.getLogger("relax_gym.trajectories")

__all__ = ["FORMAT", "ModelCall"]

REDACTED = writer.REDACTED_BYTES.decode()
DEFAULT_MAX_BYTES = 8 * 1024 * 1024  # a long SWE trajectory (hundreds of calls over a 32K context) fits
SWEEP_EVERY = 4096  # trajectories written between two sweeps of expired ones
FLUSH_WAIT_S = 30.0  # how long flush() waits for the writer
BATCH_S = 0.05  # a finished trial's trajectory is sent to the writer within this
STOP_WAIT_S = 30.0  # how long close() lets the writer process finish its last batch


def trajectory_path(request_id: str) -> str:
    """Where the trial API serves a trial's trajectory (its snapshot's artifact_ref)."""
    return f"/v1/trials/{request_id}/trajectory"  # request ids are URL-safe (protocol/types.py)


class Recorder:
    """One trial's trajectory while it runs (RunContext.trajectory for its runtime)."""

    __slots__ = (
        "answer", "calls", "closed", "config", "environment", "left", "request", "request_id", "secrets"
    )  # fmt: skip

    def __init__(
        self, request_id: str, environment: str, config: str, secrets: tuple[str, ...], max_bytes: int
    ) -> None:
        self.request_id = request_id
        self.environment = environment
        self.config = config
        self.secrets = secrets  # replaced by the writer process (writer.secret_bytes)
        # Nothing allocated until used: one object per trial is what the collector has to walk.
        self.request: bytes | Mapping[str, Any] | None = None
        self.answer: bytes | Mapping[str, Any] | None = None
        self.calls: list[ModelCall] | None = None
        self.left = max_bytes
        self.closed = False  # once its trial ended: the writer reads it, nothing changes it

    def run_request(self, body: bytes | Mapping[str, Any]) -> None:
        """The body the environment's /run got (or, from a runtime that never encodes it, the document)."""
        if not self.closed:
            self.request = _exact(body) if isinstance(body, bytes) else body

    def run_answer(self, body: bytes | Mapping[str, Any]) -> None:
        """The environment's answer to /run (its output items and the verifier's fields)."""
        if not self.closed:
            self.answer = body

    def model_call(
        self,
        resource: str,
        request: bytes,
        *,
        status: int,
        answer: bytes | None,
        streamed: bool,
        seconds: float,
        attempts: int,
        error: str | None = None,
    ) -> None:
        """One bridged call: the body as sent upstream and the answer's bytes (the SSE text if streamed)."""
        if self.closed:
            return  # answered after its trial ended: the trajectory is already on its way
        size = len(request) + (len(answer) if answer is not None else 0)
        kept = size <= self.left
        if kept:
            self.left -= size
        if self.calls is None:
            self.calls = []
        self.calls.append(
            (resource, _exact(request) if kept else None, answer if kept else None, size, status, streamed,
             seconds, attempts, error)
        )  # fmt: skip

    def record(self, status: str, ended_at: float) -> Record:
        """What the writer process gets: plain values only."""
        return (self.request_id, self.environment, self.config, self.secrets, self.request, self.answer,
                self.calls, self.left, status, ended_at)  # fmt: skip


def _exact(data: bytes) -> bytes:
    """A copy of `data` in an allocation of its own size, to keep for a trial's length.

    orjson's bytes (jsonutil.dumps: what the bridge sends upstream) sit in the larger buffer they were
    written into; kept by the thousand, those grow the heap by a page every few calls, which cost more
    than the rest of the capture (bench/bridge_python.py: it added ~5 us a call, ~2 us with the copy).
    """
    return bytes(memoryview(data))


def _parsed(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return data.decode("utf-8", "replace")


def _decoded_record(record: bytes) -> dict[str, Any] | None:
    """decode() of what the writer will store for a record (writer.dump's bytes), or None where the writer
    would keep nothing."""
    try:
        return decode(writer.encode(marshal.loads(record)))  # noqa: S302 - our own record, in memory
    except Exception as exc:  # noqa: BLE001 - the writer skips such a record the same way
        logger.warning("a trajectory not yet written cannot be read (%s)", type(exc).__name__)
        return None


def decode(blob: bytes) -> dict[str, Any]:
    """The document a reader gets: bodies parsed, streamed answers folded, usage per call."""
    head, _, rest = blob.partition(b"\n")
    header: dict[str, Any] = json.loads(head)
    offset = 0
    model_calls = []
    for entry in header.pop("calls"):
        call = {key: entry[key] for key in ("resource", "status", "seconds", "attempts") if key in entry}
        for key in ("streamed", "error"):
            if key in entry:
                call[key] = entry[key]
        if "request" not in entry:
            call["request"] = call["response"] = cut_marker(entry["size"])
        else:
            call["request"] = _parsed(rest[offset : offset + entry["request"]])
            offset += entry["request"]
        if "answer" in entry:
            answer = rest[offset : offset + entry["answer"]]
            offset += entry["answer"]
            streamed = entry.get("streamed", False)
            call["response"] = (
                fold_stream(call["resource"], answer.decode("utf-8", "replace"))
                if streamed
                else _parsed(answer)
            )
            call["usage"] = usage_of(call["response"])
        model_calls.append(call)
    header["model_calls"] = model_calls
    run = header["run"]
    for key in ("request", "answer"):
        size = run.get(key)
        if isinstance(size, int):
            run[key] = _parsed(rest[offset : offset + size])
            offset += size
    return header


type _Finished = tuple[str, int, bytes]  # request id, place in the queue, the record (writer.dump)


class TrajectoryStore:
    """Every trial's trajectory: recorders while trials run, rows of `trajectories.sqlite3` once they end.

    Everything here runs on the event loop, and no thread: a trial that ends joins the batch, and every
    BATCH_S (at once on flush()) the batch is written to the writer process's pipe; the
    process encodes and commits it in one transaction and answers with the batch's last sequence
    number. The Python that costs (headers, secret replacement, SQLite) runs on another core, and the
    loop never hands its GIL to a thread of ours. start() starts the process with the gateway (else the
    first batch does); one that died loses the batches it had not answered, and the next batch starts
    a new one. `root` None keeps the file in a private temporary directory that goes with the store (a
    gateway whose trials live in memory).
    """

    def __init__(
        self,
        root: Path | None,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        retention_s: float = 600.0,
        max_retained: int = 100_000,
        sweep_every: int = SWEEP_EVERY,
    ) -> None:
        self._temporary: tempfile.TemporaryDirectory[str] | None = None
        if root is None:
            self._temporary = tempfile.TemporaryDirectory(prefix="relax-gym-trajectories-")
            root = Path(self._temporary.name)
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.path = root / "trajectories.sqlite3"
        self.max_bytes = max_bytes
        self._writer_args = [str(self.path), repr(retention_s), str(max_retained), str(sweep_every)]
        self._recorders: dict[str, Recorder] = {}
        self._pending: dict[str, _Finished] = {}  # request id -> its entry in a batch, until written
        self._queued = 0
        self._written = 0
        self._wake = asyncio.Event()
        self._batch: list[_Finished] = []
        self._send_at: asyncio.TimerHandle | None = None
        self._sending: set[asyncio.Task[None]] = set()
        self._start_lock = asyncio.Lock()
        self._in_flight: collections.deque[list[_Finished]] = collections.deque()  # sent, not yet answered
        self.process: asyncio.subprocess.Process | None = None  # the writer process, once started
        self._answers: asyncio.Task[None] | None = None
        descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)  # 0600 before SQLite makes it
        os.close(descriptor)
        self._readers = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="relax-gym-trajectory-read"
        )
        self._reader: sqlite3.Connection | None = None

    async def start(self) -> None:
        """Start the writer process now, with the gateway, rather than with the first trial's batch."""
        await self._started()

    # ---- while a trial runs -------------------------------------------------------------------------

    def begin(self, request_id: str, environment: str, config: str, secrets: tuple[str, ...]) -> Recorder:
        recorder = Recorder(request_id, environment, config, secrets, self.max_bytes)
        self._recorders[request_id] = recorder
        return recorder

    def recorder(self, request_id: str) -> Recorder | None:
        return self._recorders.get(request_id)

    def finished(self, request_id: str, status: TrialStatus) -> None:
        """A trial ended (the trial book's on_terminal): its trajectory joins the next batch."""
        recorder = self._recorders.pop(request_id, None)
        if recorder is None:
            return  # it never ran (aborted while queued), or ran before a restart
        recorder.closed = True
        self._queued = sequence = self._queued + 1
        # Serialized now, so nothing of the trial outlives this call: kept for a batch interval, the
        # recorders' containers reached the collector's oldest generation and every full collection
        # (it walks all of a busy gateway's trials) came sooner (about a tenth of the loop, in-process).
        entry = (request_id, sequence, writer.dump(recorder.record(status.value, time.time())))
        self._pending[request_id] = entry
        self._batch.append(entry)
        if self._send_at is None:
            self._send_at = asyncio.get_running_loop().call_later(BATCH_S, self._send_soon)

    # ---- to the writer process ------------------------------------------------------------------------

    def _send_soon(self) -> None:
        if self._send_at is not None:
            self._send_at.cancel()
            self._send_at = None
        if self._batch:
            task = asyncio.get_running_loop().create_task(self._send(self._batch))
            self._batch = []
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[_Finished]) -> None:
        """One batch to the writer process; its answer (_receive) tells the readers."""
        try:
            payload = marshal.dumps((batch[-1][1], [record for _, _, record in batch]))
            process = await self._started()
            assert process.stdin is not None
            self._in_flight.append(batch)
            process.stdin.write(FRAME.pack(len(payload)) + payload)
            await process.stdin.drain()  # at once unless the writer is that far behind
        except Exception as exc:  # noqa: BLE001 - whatever failed, the batch is lost and readers go on
            logger.warning("%d trajectories not written (%s: %s)", len(batch), type(exc).__name__, exc)
            if batch in self._in_flight:
                self._in_flight.remove(batch)
            self._settle(batch)

    async def _started(self) -> asyncio.subprocess.Process:
        async with self._start_lock:
            if self.process is None or self.process.returncode is not None:
                # -I -S: the writer imports only the standard library; no setting of this environment applies.
                self.process = await asyncio.create_subprocess_exec(
                    sys.executable, "-I", "-S", writer.__file__, *self._writer_args,
                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                )  # fmt: skip
                self._answers = asyncio.get_running_loop().create_task(self._receive(self.process))
            return self.process

    async def _receive(self, process: asyncio.subprocess.Process) -> None:
        """The writer's answers, one per batch in the order sent; when it ends, what it had not answered
        is lost."""
        assert process.stdout is not None
        try:
            while True:
                await process.stdout.readexactly(FRAME.size)
                if self._in_flight:
                    self._settle(self._in_flight.popleft())
        except (asyncio.IncompleteReadError, OSError):
            pass
        code = await process.wait()
        if self._in_flight:
            lost = sum(len(batch) for batch in self._in_flight)
            logger.warning("%d trajectories not written (writer process exit code %s)", lost, code)
        while self._in_flight:
            self._settle(self._in_flight.popleft())

    def _settle(self, batch: list[_Finished]) -> None:
        """These are written (or given up): readers find them in the file now, and flush() goes on."""
        for entry in batch:
            if self._pending.get(entry[0]) is entry:
                del self._pending[entry[0]]
        self._written = max(self._written, batch[-1][1])
        self._wake.set()
        self._wake = asyncio.Event()

    # ---- reading --------------------------------------------------------------------------------------

    async def read(self, request_id: str) -> dict[str, Any] | None:
        """The document of a trial that ended, or None: from its record while it waits for the writer
        (the same bytes the writer stores), else from the file."""
        entry = self._pending.get(request_id)
        if entry is not None:
            return await asyncio.wrap_future(self._readers.submit(_decoded_record, entry[2]))
        return await asyncio.wrap_future(self._readers.submit(self._read, request_id))

    async def flush(self) -> None:
        """Send what has ended so far and wait until the writer has written it (or it was given up), at
        most FLUSH_WAIT_S: a stuck writer costs a caller this much, never more."""
        target = self._queued
        self._send_soon()
        loop = asyncio.get_running_loop()
        give_up = loop.time() + FLUSH_WAIT_S
        while self._written < target and loop.time() < give_up:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), give_up - loop.time())

    def _read(self, request_id: str) -> dict[str, Any] | None:
        if self._reader is None:
            self._reader = connect(str(self.path))
        rows = self._reader.execute(
            "SELECT compressed, data FROM trajectories WHERE request_id = ?", (request_id,)
        ).fetchall()  # to the end: no read snapshot stays open
        if not rows:
            return None
        compressed, data = rows[0]
        return decode(zlib.decompress(data) if compressed else data)

    async def close(self) -> None:
        """Write what is left, stop the writer process (its input closes: it finishes and exits; killed
        if it does not within STOP_WAIT_S); a temporary root goes with the store."""
        self._send_soon()
        if self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)
        process, self.process = self.process, None
        if process is not None:
            assert process.stdin is not None
            process.stdin.close()
            try:
                await asyncio.wait_for(process.wait(), STOP_WAIT_S)
            except TimeoutError:
                logger.warning("the trajectory writer (pid %d) did not stop: killed", process.pid)
                process.kill()
                await process.wait()
            if self._answers is not None:
                await self._answers  # it settles whatever the writer had not answered
        if self._reader is not None:
            reader, self._reader = self._reader, None
            await asyncio.wrap_future(self._readers.submit(reader.close))
        self._readers.shutdown(wait=True)
        if self._temporary is not None:
            self._temporary.cleanup()
