"""Trajectories: what each trial's run was asked and answered, and every model call it made, in order.

A trial's Recorder is fed while the trial runs — by its runtime (the /run body and the environment's
answer) and by the bridge (each model call: the body as sent upstream, the answer, status, time,
attempts). Feeding it is cheap because the bridge calls it on every model call: it keeps references to
bytes it was given and counts them against the per-trial cap, past which it keeps only their sizes.
When the trial ends (the trial book's on_terminal), it is queued; one thread takes everything queued
every BATCH_S and hands it to the writer process (writer.py), which stores each trial as one row of
`<state dir>/trajectories/trajectories.sqlite3` (0600): a header, then the bodies as they came, each
with every secret of the trial (API key, session id, rollout id, header values) replaced — bodies past
the cap were never kept, and a marker says how much. Nothing is parsed or folded until a reader asks
(decode). A trial that was running when the gateway died has none. Rows go with their trial's record:
the writer deletes those past the ledger's retention, and the oldest beyond max_retained.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fcntl
import json
import logging
import os
import pickle
import queue
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from relax_gym_core.protocol import TrialStatus
from relax_gym_core.trajectories import writer
from relax_gym_core.trajectories.fold import fold_stream, usage_of
from relax_gym_core.trajectories.writer import FORMAT, FRAME, ModelCall, Record, connect

logger = logging.getLogger("relax_gym.trajectories")

__all__ = ["FORMAT", "ModelCall"]

REDACTED = writer.REDACTED_BYTES.decode()
DEFAULT_MAX_BYTES = 8 * 1024 * 1024  # a long SWE trajectory (hundreds of calls over a 32K context) fits
SWEEP_EVERY = 4096  # trajectories written between two sweeps of expired ones
READ_WAIT_S = 30.0  # how long a read waits for its trajectory to be written
BATCH_S = 0.05  # a finished trial's trajectory is sent within this (at once when a read waits for it)
PIPE_BYTES = 1 << 20  # the writer's input pipe (Linux's default limit for an unprivileged process)
STOP_WAIT_S = 30.0  # how long close() lets the writer process finish its last batch


def trajectory_path(request_id: str) -> str:
    """Where the trial API serves a trial's trajectory (its snapshot's artifact_ref)."""
    return f"/v1/trials/{request_id}/trajectory"  # request ids are URL-safe (protocol/types.py)


class Recorder:
    """One trial's trajectory while it runs (RunContext.trajectory for its runtime)."""

    __slots__ = ("calls", "closed", "config", "environment", "left", "request_id", "run", "secrets")

    def __init__(
        self, request_id: str, environment: str, config: str, secrets: Iterable[str], max_bytes: int
    ) -> None:
        self.request_id = request_id
        self.environment = environment
        self.config = config
        self.secrets = tuple(secrets)  # replaced by the writer process (writer.secret_bytes)
        self.calls: list[ModelCall] = []
        self.run: dict[str, bytes | Mapping[str, Any]] = {}
        self.left = max_bytes
        self.closed = False  # once its trial ended: the writer reads it, nothing changes it

    def run_request(self, body: bytes | Mapping[str, Any]) -> None:
        """The body the environment's /run got (or, from a runtime that never encodes it, the document)."""
        if not self.closed:
            self.run["request"] = body

    def run_answer(self, body: bytes | Mapping[str, Any]) -> None:
        """The environment's answer to /run (its output items and the verifier's fields)."""
        if not self.closed:
            self.run["answer"] = body

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
        self.calls.append(
            (resource, request if kept else None, answer if kept else None, size, status, streamed, seconds,
             attempts, error)
        )  # fmt: skip

    def record(self, status: str, ended_at: float) -> Record:
        """What the writer process gets: plain values only."""
        return (self.request_id, self.environment, self.config, self.secrets, self.run, self.calls,
                self.left, status, ended_at)  # fmt: skip


def _parsed(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return data.decode("utf-8", "replace")


def _cut(size: int) -> dict[str, Any]:
    return {"truncated": True, "bytes": size}  # the marker that stands for a body past the cap


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


def _exchange(process: subprocess.Popen[bytes], payload: bytes) -> None:
    """Send one frame; wait for the writer's answer that it is committed."""
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(FRAME.pack(len(payload)) + payload)
    process.stdin.flush()
    if len(process.stdout.read(FRAME.size)) < FRAME.size:
        raise EOFError("the writer process closed its output")


type _Finished = tuple[Recorder, str, float, int]  # recorder, status, ended_at, place in the queue


class TrajectoryStore:
    """Every trial's trajectory: recorders while trials run, rows of `trajectories.sqlite3` once they end.

    The event loop only hands a finished recorder to a queue. One thread takes everything queued so far
    and sends it, pickled once, to the writer process, which encodes and commits it in one transaction:
    the Python that costs (headers, secret replacement, SQLite) runs on another core, not under the
    loop's GIL. The process starts with the first batch, and a new one replaces one that died. `root`
    None keeps the file in a private temporary directory that goes with the store (a gateway whose
    trials live in memory).
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
        self._pending: dict[str, int] = {}  # request id -> its place in the queue, until written
        self._queued = 0
        self._written = 0  # (read on the loop only; the sender reports through _advance)
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: queue.SimpleQueue[_Finished | None] = queue.SimpleQueue()
        self._hurry = threading.Event()  # a reader waits for what is queued: send it now
        descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)  # 0600 before SQLite makes it
        os.close(descriptor)
        self.process: subprocess.Popen[bytes] | None = None  # the writer process, once started
        self._sender = threading.Thread(target=self._send_loop, daemon=True, name="relax-gym-trajectories")
        self._sender.start()
        self._readers = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="relax-gym-trajectory-read"
        )
        self._reader: sqlite3.Connection | None = None

    # ---- while a trial runs -------------------------------------------------------------------------

    def begin(self, request_id: str, environment: str, config: str, secrets: Iterable[str]) -> Recorder:
        recorder = Recorder(request_id, environment, config, secrets, self.max_bytes)
        self._recorders[request_id] = recorder
        return recorder

    def recorder(self, request_id: str) -> Recorder | None:
        return self._recorders.get(request_id)

    def finished(self, request_id: str, status: TrialStatus) -> None:
        """A trial ended (the trial book's on_terminal): its trajectory is queued to be written."""
        recorder = self._recorders.pop(request_id, None)
        if recorder is None:
            return  # it never ran (aborted while queued), or ran before a restart
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        recorder.closed = True
        self._queued += 1
        self._pending[request_id] = self._queued
        self._queue.put((recorder, status.value, time.time(), self._queued))

    # ---- the sender thread and the writer process -------------------------------------------------

    def _send_loop(self) -> None:
        while True:
            batch = [self._queue.get()]
            if batch[0] is not None:
                # Let the batch grow: one pickle and one transaction per interval (unless a reader waits).
                self._hurry.wait(BATCH_S)
                self._hurry.clear()
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            finished = [item for item in batch if item is not None]
            if finished:
                self._send(finished)
                self._done(finished)
            if None in batch:
                self._stop_process()
                return

    def _send(self, finished: list[_Finished]) -> None:
        """One batch to the writer process, then wait for it to be committed (or given up)."""
        process = None
        try:
            payload = pickle.dumps(
                (finished[-1][3], [recorder.record(status, at) for recorder, status, at, _ in finished]),
                protocol=pickle.HIGHEST_PROTOCOL,
            )
            process = self.process = self.process or self._start_process()
            _exchange(process, payload)
        except Exception as exc:  # noqa: BLE001 - whatever failed, the batch is lost and readers go on
            code = process.poll() if process is not None else None
            logger.warning(
                "%d trajectories not written (%s: %s; writer process exit code %s)",
                len(finished), type(exc).__name__, exc, code,
            )  # fmt: skip
            if process is not None:
                self._stop_process()  # the next batch starts a new one

    def _start_process(self) -> subprocess.Popen[bytes]:
        # -I -S: the writer imports only the standard library; none of this environment's settings apply.
        command = [sys.executable, "-I", "-S", writer.__file__, *self._writer_args]
        process = subprocess.Popen(  # noqa: S603 - this interpreter and a file of this package
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True
        )
        assert process.stdin is not None
        with contextlib.suppress(OSError):  # a batch in one write, not woken page by page as it drains
            fcntl.fcntl(process.stdin.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        return process

    def _stop_process(self) -> None:
        """Close the writer's input (it finishes and exits); kill it if it does not."""
        process, self.process = self.process, None
        if process is None:
            return
        assert process.stdin is not None and process.stdout is not None
        with contextlib.suppress(OSError):
            process.stdin.close()
        try:
            process.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            logger.warning("the trajectory writer (pid %d) did not stop: killed", process.pid)
            process.kill()
            process.wait()
        process.stdout.close()

    def _done(self, finished: list[_Finished]) -> None:
        """Tell the loop these are written (or given up): readers waiting for them go on."""
        last = finished[-1][3]
        for recorder, _, _, sequence in finished:
            if self._pending.get(recorder.request_id) == sequence:
                self._pending.pop(recorder.request_id, None)
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting
                self._loop.call_soon_threadsafe(self._advance, last)

    def _advance(self, written: int) -> None:
        """On the loop: everything queued up to `written` is in the file; wake the readers waiting."""
        self._written = max(self._written, written)
        self._wake.set()
        self._wake = asyncio.Event()

    # ---- reading --------------------------------------------------------------------------------------

    async def read(self, request_id: str) -> dict[str, Any] | None:
        """The document of a trial that ended (after its write, if that is under way), or None."""
        sequence = self._pending.get(request_id)
        loop = asyncio.get_running_loop()
        give_up = loop.time() + READ_WAIT_S
        if sequence is not None and self._written < sequence:
            self._hurry.set()
        while sequence is not None and self._written < sequence and loop.time() < give_up:
            with contextlib.suppress(TimeoutError):  # a stuck writer costs a reader this much, never more
                await asyncio.wait_for(self._wake.wait(), give_up - loop.time())
        return await asyncio.wrap_future(self._readers.submit(self._read, request_id))

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
        """Finish every write under way and stop the writer process; a temporary root goes with the
        store."""
        self._queue.put(None)
        self._hurry.set()
        await asyncio.to_thread(self._sender.join)
        if self._reader is not None:
            reader, self._reader = self._reader, None
            await asyncio.wrap_future(self._readers.submit(reader.close))
        self._readers.shutdown(wait=True)
        if self._temporary is not None:
            self._temporary.cleanup()
