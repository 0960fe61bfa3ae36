"""Trajectories: what each trial's run was asked and answered, and every model call it made, in order.

A trial's Recorder is fed while the trial runs — by its runtime (the /run body and the environment's
answer) and by the bridge (each model call: the body as sent upstream, the answer, status, time,
attempts). Feeding it is cheap because the bridge calls it on every model call: it keeps references to
bytes it was given and counts them against the per-trial cap, past which it keeps only their sizes.
When the trial ends (the TERMINAL transition: this store is an observer), it is queued; one writer
thread takes everything queued every BATCH_S and stores each trial as one row of
`<state dir>/trajectories/trajectories.sqlite3` (0600): a header, then the bodies as they came, each
with every secret of the trial (API key, session id, rollout id, header values) replaced — bodies past
the cap were never kept, and a marker says how much. Nothing is parsed or folded until a reader asks
(decode). A trial that was running when the gateway died has none. Rows go with their trial's record:
the sweep deletes those past the ledger's retention, and the oldest beyond max_retained.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import queue
import sqlite3
import tempfile
import threading
import time
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

from relax_gym_core.observe import CallbackOutcome, Transition, TrialEvent
from relax_gym_core.trajectories.fold import fold_stream, usage_of

logger = logging.getLogger("relax_gym.trajectories")

FORMAT = "relax-gym/trajectory-v1"
REDACTED = "[redacted]"
REDACTED_BYTES = REDACTED.encode()
MIN_SECRET_CHARS = 8  # shorter values ("EMPTY", "x") are no secret, and replacing them would mangle text
DEFAULT_MAX_BYTES = 8 * 1024 * 1024  # a long SWE trajectory (hundreds of calls over a 32K context) fits
SWEEP_EVERY = 4096  # trajectories written between two sweeps of expired ones
READ_WAIT_S = 30.0  # how long a read waits for its trajectory to be written
BATCH_S = 0.05  # a finished trial's trajectory is written within this (a read waits for it)


def trajectory_path(request_id: str) -> str:
    """Where the trial API serves a trial's trajectory (its snapshot's artifact_ref)."""
    return f"/v1/trials/{request_id}/trajectory"  # request ids are URL-safe (protocol/types.py)


class ModelCall(NamedTuple):
    """One bridged call as recorded (a tuple: the bridge makes one per call). request/answer are None
    when the trial's cap was spent: `size` says how much was left out."""

    resource: str
    request: bytes | None
    answer: bytes | None
    size: int
    status: int
    streamed: bool
    seconds: float
    attempts: int
    error: str | None


class Recorder:
    """One trial's trajectory while it runs (RunContext.trajectory for its runtime)."""

    __slots__ = ("_closed", "_left", "_run", "calls", "config", "environment", "request_id", "secrets")

    def __init__(
        self, request_id: str, environment: str, config: str, secrets: Iterable[str], max_bytes: int
    ) -> None:
        self.request_id = request_id
        self.environment = environment
        self.config = config
        self.secrets = tuple(secrets)  # made into what is replaced by the writer thread (secret_bytes)
        self.calls: list[ModelCall] = []
        self._run: dict[str, bytes] = {}
        self._left = max_bytes
        self._closed = False

    def run_request(self, body: bytes) -> None:
        """The body the environment's /run got."""
        self._run["request"] = body

    def run_answer(self, body: bytes) -> None:
        """The environment's answer to /run (its output items and the verifier's fields)."""
        self._run["answer"] = body

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
        if self._closed:
            return  # answered after its trial ended: the trajectory is already written
        size = len(request) + (len(answer) if answer is not None else 0)
        kept = size <= self._left
        if kept:
            self._left -= size
        self.calls.append(
            ModelCall(resource, request if kept else None, answer if kept else None, size, status, streamed,
                      seconds, attempts, error)
        )  # fmt: skip

    def close(self) -> tuple[dict[str, bytes], list[ModelCall], int]:
        """What was recorded, frozen: later calls are ignored (the writer thread reads it)."""
        self._closed = True
        return dict(self._run), list(self.calls), self._left


def _cut(size: int) -> dict[str, Any]:
    return {"truncated": True, "bytes": size}  # the marker that stands for a body past the cap


def _parsed(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return data.decode("utf-8", "replace")


def secret_bytes(secrets: Iterable[str]) -> tuple[bytes, ...]:
    """What to replace: each secret long enough to be one, also as JSON writes it (a `"` or `\\` in it is
    escaped there), longest first so that none hides inside another."""
    kept = {secret.encode() for secret in secrets if len(secret) >= MIN_SECRET_CHARS}
    kept |= {json.dumps(s.decode())[1:-1].encode() for s in kept if b'"' in s or b"\\" in s}
    return tuple(sorted(kept, key=len, reverse=True))


def _redacted(data: bytes, secrets: tuple[bytes, ...]) -> bytes:
    for secret in secrets:
        data = data.replace(secret, REDACTED_BYTES)
    return data


def encode(
    recorder: Recorder, run: dict[str, bytes], calls: list[ModelCall], left: int, status: str
) -> bytes:
    """One trial's record as stored: a JSON header line, then each kept body's bytes as they came (the
    writer thread). Nothing is parsed or folded here — that waits for a reader — and each part has the
    trial's secrets replaced before its length is taken."""
    secrets = secret_bytes(recorder.secrets)
    bodies: list[bytes] = []
    entries = []
    for call in calls:
        entry: dict[str, Any] = {"resource": call.resource, "status": call.status, "size": call.size}
        entry |= {"seconds": round(call.seconds, 6), "attempts": call.attempts}
        if call.streamed:
            entry["streamed"] = True
        if call.error is not None:
            entry["error"] = call.error
        for part, body in (("request", call.request), ("answer", call.answer)):
            if body is not None:
                kept = _redacted(body, secrets)
                entry[part] = len(kept)
                bodies.append(kept)
        entries.append(entry)
    run_doc: dict[str, Any] = {}
    cut = sum(call.size for call in calls if call.request is None)
    for key in ("request", "answer"):
        if key in run:
            kept = _redacted(run[key], secrets)
            if len(kept) <= left:
                left -= len(kept)
                run_doc[key] = len(kept)
                bodies.append(kept)
            else:
                cut += len(kept)
                run_doc[key] = _cut(len(kept))
    header = {
        "format": FORMAT,
        "request_id": recorder.request_id,
        "environment": recorder.environment,
        "config": recorder.config,
        "status": status,
        "run": run_doc,
        "calls": entries,
        **({"truncated_bytes": cut} if cut else {}),
    }
    head = _redacted(json.dumps(header, ensure_ascii=False, default=str).encode(), secrets)
    return head + b"\n" + b"".join(bodies)  # the header holds no newline: json.dumps escapes them


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
            call["request"] = call["response"] = _cut(entry["size"])
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


SCHEMA = """
CREATE TABLE IF NOT EXISTS trajectories (
    request_id TEXT PRIMARY KEY,
    ended_at REAL NOT NULL,
    compressed INTEGER NOT NULL,
    data BLOB NOT NULL
)
"""
# One batch as one statement: its rows' ids, times, flags and places in one concatenated blob, from JSON.
INSERT_BATCH = (
    "INSERT OR REPLACE INTO trajectories SELECT value->>0, value->>1, value->>2, substr(?, value->>3, "
    "value->>4) FROM json_each(?)"
)
COMPRESS_ABOVE = 16 * 1024  # smaller records are stored as they are: zlib would cost more than it saves


class TrajectoryStore:
    """Every trial's trajectory: recorders while trials run, rows of `trajectories.sqlite3` once they end
    (an Observer).

    The event loop only hands a finished recorder to a queue; one writer thread takes everything queued
    so far, encodes it and commits it in one transaction (a trajectory is not acknowledged data: WAL,
    synchronous=NORMAL), so the cost per trial stays far below a trial's own. `root` None keeps the file
    in a private temporary directory that goes with the store (a gateway whose trials live in memory).
    """

    def __init__(
        self,
        root: Path | None,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        retention_s: float = 600.0,
        max_retained: int = 100_000,
    ) -> None:
        self._temporary: tempfile.TemporaryDirectory[str] | None = None
        if root is None:
            self._temporary = tempfile.TemporaryDirectory(prefix="relax-gym-trajectories-")
            root = Path(self._temporary.name)
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.path = root / "trajectories.sqlite3"
        self.max_bytes = max_bytes
        self._retention_s = retention_s
        self._max_retained = max_retained
        self._recorders: dict[str, Recorder] = {}
        self._pending: dict[str, int] = {}  # request id -> its place in the queue, until written
        self._queued = 0
        self._written = 0  # (read on the loop only; the writer reports through _advance)
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: queue.SimpleQueue[_Finished | None] = queue.SimpleQueue()
        descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)  # 0600 before SQLite makes it
        os.close(descriptor)
        self._writer = threading.Thread(target=self._write_loop, args=(self._connect(),), daemon=True)
        self._writer.name = "relax-gym-trajectories"
        self._writer.start()
        self._readers = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="relax-gym-trajectory-read"
        )
        self._reader: sqlite3.Connection | None = None

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=NORMAL")
        connection.execute(SCHEMA)
        return connection

    # ---- while a trial runs -------------------------------------------------------------------------

    def begin(self, request_id: str, environment: str, config: str, secrets: Iterable[str]) -> Recorder:
        recorder = Recorder(request_id, environment, config, secrets, self.max_bytes)
        self._recorders[request_id] = recorder
        return recorder

    def recorder(self, request_id: str) -> Recorder | None:
        return self._recorders.get(request_id)

    # ---- Observer: a trial that ends is written ---------------------------------------------------

    def transition(self, event: Transition) -> None:
        if event.event is not TrialEvent.TERMINAL:
            return
        recorder = self._recorders.pop(event.request_id, None)
        if recorder is None:
            return  # it never ran (aborted while queued), or ran before a restart
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        self._queued += 1
        self._pending[event.request_id] = self._queued
        self._queue.put(_Finished(recorder, *recorder.close(), event.status.value, time.time(), self._queued))

    def callback(self, outcome: CallbackOutcome) -> None:
        return None

    # ---- the writer thread ----------------------------------------------------------------------------

    def _write_loop(self, connection: sqlite3.Connection) -> None:
        writes = 0
        while True:
            batch = [self._queue.get()]
            if batch[0] is not None:
                # Let the batch grow first: one wake-up and one transaction per interval, not per trial
                # (woken per trial, this thread took the GIL from the event loop for every one).
                time.sleep(BATCH_S)
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            finished = [item for item in batch if item is not None]
            try:
                if finished:
                    self._commit(connection, finished)
                    writes += len(finished)
                    if writes >= SWEEP_EVERY:
                        writes = 0
                        self._sweep(connection, time.time())
            except Exception:
                logger.warning("%d trajectories not written", len(finished), exc_info=True)
            if finished:
                self._done(finished)  # after the sweep too: a reader then sees what the batch left
            if None in batch:
                connection.close()
                return

    def _commit(self, connection: sqlite3.Connection, finished: list[_Finished]) -> None:
        index: list[tuple[str, float, bool, int, int]] = []  # id, ended_at, compressed, offset (from 1), size
        blobs: list[bytes] = []
        offset = 1
        for item in finished:
            try:
                data = encode(item.recorder, item.run, item.calls, item.left, item.status)
                compressed = len(data) > COMPRESS_ABOVE
                if compressed:
                    data = zlib.compress(data, 1)
            except Exception:
                logger.warning(
                    "trajectory of request_id=%s not kept", item.recorder.request_id, exc_info=True
                )
                continue
            index.append((item.recorder.request_id, item.ended_at, compressed, offset, len(data)))
            blobs.append(data)
            offset += len(data)
        if not index:
            return
        try:
            with connection:
                connection.execute("BEGIN")
                # The whole batch in one statement: executemany would release and retake the GIL for every
                # row, and each retake waits on the event loop's thread (it halved the loop's throughput).
                connection.execute(INSERT_BATCH, (b"".join(blobs), json.dumps(index)))
        except sqlite3.Error:
            logger.warning("%d trajectories not written", len(index), exc_info=True)

    def _done(self, finished: list[_Finished]) -> None:
        """Tell the loop these are written (or given up): readers waiting for them go on."""
        last = finished[-1].sequence
        for item in finished:
            if self._pending.get(item.recorder.request_id) == item.sequence:
                self._pending.pop(item.recorder.request_id, None)
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting
                self._loop.call_soon_threadsafe(self._advance, last)

    def _advance(self, written: int) -> None:
        """On the loop: everything queued up to `written` is in the file; wake the readers waiting."""
        self._written = max(self._written, written)
        self._wake.set()
        self._wake = asyncio.Event()

    def _sweep(self, connection: sqlite3.Connection, now: float) -> None:
        """Forget trajectories past the retention (their trials are forgotten), then the oldest beyond
        max_retained."""
        with contextlib.suppress(sqlite3.Error), connection:
            connection.execute("BEGIN")
            connection.execute("DELETE FROM trajectories WHERE ended_at <= ?", (now - self._retention_s,))
            connection.execute(
                "DELETE FROM trajectories WHERE request_id IN (SELECT request_id FROM trajectories "
                "ORDER BY ended_at DESC LIMIT -1 OFFSET ?)",
                (self._max_retained,),
            )

    # ---- reading --------------------------------------------------------------------------------------

    async def read(self, request_id: str) -> dict[str, Any] | None:
        """The document of a trial that ended (after its write, if that is under way), or None."""
        sequence = self._pending.get(request_id)
        loop = asyncio.get_running_loop()
        give_up = loop.time() + READ_WAIT_S
        while sequence is not None and self._written < sequence and loop.time() < give_up:
            with contextlib.suppress(TimeoutError):  # a stuck writer costs a reader this much, never more
                await asyncio.wait_for(self._wake.wait(), give_up - loop.time())
        return await asyncio.wrap_future(self._readers.submit(self._read, request_id))

    def _read(self, request_id: str) -> dict[str, Any] | None:
        if self._reader is None:
            self._reader = self._connect()
        rows = self._reader.execute(
            "SELECT compressed, data FROM trajectories WHERE request_id = ?", (request_id,)
        ).fetchall()  # to the end: no read snapshot stays open
        if not rows:
            return None
        compressed, data = rows[0]
        return decode(zlib.decompress(data) if compressed else data)

    async def close(self) -> None:
        """Finish every write under way; a temporary root goes with the store."""
        self._queue.put(None)
        await asyncio.to_thread(self._writer.join)
        if self._reader is not None:
            reader, self._reader = self._reader, None
            await asyncio.wrap_future(self._readers.submit(reader.close))
        self._readers.shutdown(wait=True)
        if self._temporary is not None:
            self._temporary.cleanup()


class _Finished(NamedTuple):
    recorder: Recorder
    run: dict[str, bytes]
    calls: list[ModelCall]
    left: int
    status: str
    ended_at: float
    sequence: int
