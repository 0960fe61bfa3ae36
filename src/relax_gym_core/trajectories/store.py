"""Trajectories: what each trial's run was asked and answered, and every model call it made, in order.

A trial's Recorder is fed while the trial runs — by its runtime (the /run body and the environment's
answer) and by the bridge (each model call: the body as sent upstream, the answer, status, time,
attempts). Feeding it is cheap because the bridge calls it on every model call: it keeps references to
bytes it was given and counts them against the per-trial cap, past which it keeps only their sizes.
When the trial ends (the TERMINAL transition: this store is an observer) one writer thread builds the
document — streamed answers folded, bodies cut to the cap with a marker saying how much, every secret
of the trial (API key, session id, rollout id) replaced — and writes it gzipped, 0600, by atomic
rename, under the state directory's `trajectories/`. A trial that was running when the gateway died has
none. Files go with their trial's record: the sweep deletes those past the ledger's retention.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import gzip
import hashlib
import json
import logging
import os
import tempfile
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from relax_gym_core.observe import CallbackOutcome, Transition, TrialEvent
from relax_gym_core.protocol import jsonutil
from relax_gym_core.trajectories.fold import fold_stream, usage_of

logger = logging.getLogger("relax_gym.trajectories")

FORMAT = "relax-gym/trajectory-v1"
REDACTED = "[redacted]"
MIN_SECRET_CHARS = 8  # shorter values ("EMPTY", "x") are no secret, and replacing them would mangle text
DEFAULT_MAX_BYTES = 8 * 1024 * 1024  # a long SWE trajectory (hundreds of calls over a 32K context) fits
SWEEP_EVERY = 256  # writes between two sweeps of expired files


def trajectory_path(request_id: str) -> str:
    """Where the trial API serves a trial's trajectory (its snapshot's artifact_ref)."""
    return f"/v1/trials/{urllib.parse.quote(request_id, safe='')}/trajectory"


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
        kept = {secret for secret in secrets if len(secret) >= MIN_SECRET_CHARS}
        self.secrets = tuple(sorted(kept, key=len, reverse=True))  # longest first: none hides in another
        self.calls: list[ModelCall] = []
        self._run: dict[str, Any] = {}
        self._left = max_bytes
        self._closed = False

    def run_request(self, body: Mapping[str, Any]) -> None:
        """The body the environment's /run got."""
        self._run["request"] = body

    def run_answer(self, body: Mapping[str, Any]) -> None:
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

    def close(self) -> tuple[dict[str, Any], list[ModelCall], int]:
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


def _model_call(recorded: ModelCall) -> dict[str, Any]:
    resource, request, answer, size, status, streamed, seconds, attempts, error = recorded
    call: dict[str, Any] = {"resource": resource, "status": status, "seconds": round(seconds, 6)}
    call["attempts"] = attempts
    if request is None:
        call["request"] = call["response"] = _cut(size)
    else:
        call["request"] = _parsed(request)
        if answer is not None:
            text = answer.decode("utf-8", "replace")
            call["response"] = fold_stream(resource, text) if streamed else _parsed(answer)
            call["usage"] = usage_of(call["response"])
    if streamed:
        call["streamed"] = True
    if error is not None:
        call["error"] = error
    return call


def build_document(
    recorder: Recorder, run: dict[str, Any], calls: list[ModelCall], left: int, status: str
) -> bytes:
    """The stored document of one trial, as JSON bytes with its secrets replaced (the writer thread)."""
    model_calls = [_model_call(call) for call in calls]
    cut_bytes = sum(call.size for call in calls if call.request is None)
    run_doc: dict[str, Any] = {}
    for key in ("request", "answer"):
        if key in run:
            data = jsonutil.dumps(run[key])
            if len(data) <= left:
                left -= len(data)
                run_doc[key] = run[key]
            else:
                cut_bytes += len(data)
                run_doc[key] = _cut(len(data))
    document: dict[str, Any] = {
        "format": FORMAT,
        "request_id": recorder.request_id,
        "environment": recorder.environment,
        "config": recorder.config,
        "status": status,
        "run": run_doc,
        "model_calls": model_calls,
    }
    if cut_bytes:
        document["truncated_bytes"] = cut_bytes
    text = json.dumps(document, ensure_ascii=False, allow_nan=False, default=str)
    for secret in recorder.secrets:
        text = text.replace(secret, REDACTED)
        escaped = json.dumps(secret, ensure_ascii=False)[1:-1]
        if escaped != secret:
            text = text.replace(escaped, REDACTED)
    return text.encode()


class TrajectoryStore:
    """Every trial's trajectory: recorders while trials run, gzipped files once they end (an Observer).

    `root` None keeps them in a private temporary directory that goes with the store (a gateway whose
    trials live in memory). Only the event loop calls begin/recorder/transition/read; the writes and
    the sweep run in one worker thread.
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
        self.root: Path = root
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self._retention_s = retention_s
        self._max_retained = max_retained
        self._recorders: dict[str, Recorder] = {}
        self._pending: dict[str, concurrent.futures.Future[None]] = {}
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="relax-gym-trajectories")
        self._writes = 0

    def kept(self, request_id: str) -> bool:
        """A trajectory of this trial is written or being written."""
        return request_id in self._pending or self.path(request_id).is_file()

    def path(self, request_id: str) -> Path:
        digest = hashlib.sha256(request_id.encode()).hexdigest()
        return self.root / digest[:2] / f"{digest}.json.gz"

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
        frozen_state = recorder.close()
        future = self._writer.submit(self._write, recorder, *frozen_state, event.status.value)
        self._pending[event.request_id] = future
        future.add_done_callback(functools.partial(self._forget, event.request_id))

    def callback(self, outcome: CallbackOutcome) -> None:
        return None

    def _forget(self, request_id: str, future: concurrent.futures.Future[None]) -> None:
        # Called in the writer thread: a dict pop is atomic, and a newer future for the id is kept.
        if self._pending.get(request_id) is future:
            self._pending.pop(request_id, None)

    # ---- the writer thread ----------------------------------------------------------------------------

    def _write(
        self, recorder: Recorder, run: dict[str, Any], calls: list[ModelCall], left: int, status: str
    ) -> None:
        try:
            data = gzip.compress(build_document(recorder, run, calls, left, status), compresslevel=3)
            path = self.path(recorder.request_id)
            path.parent.mkdir(mode=0o700, exist_ok=True)
            temporary = path.with_suffix(f".{os.getpid()}.tmp")
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(data)
            os.replace(temporary, path)
        except Exception:
            logger.warning("trajectory of request_id=%s not written", recorder.request_id, exc_info=True)
        self._writes += 1
        if self._writes % SWEEP_EVERY == 0:
            self.sweep()

    def sweep(self, now: float | None = None) -> int:
        """Delete files past the retention (their trials are forgotten), then the oldest beyond
        max_retained. Returns how many went."""
        horizon = (now if now is not None else time.time()) - self._retention_s
        files: list[tuple[float, Path]] = []
        for path in self.root.glob("*/*.json.gz"):
            with contextlib.suppress(OSError):
                files.append((path.stat().st_mtime, path))
        files.sort()
        excess = max(0, len(files) - self._max_retained)
        gone = 0
        for index, (mtime, path) in enumerate(files):
            if mtime > horizon and index >= excess:
                break
            with contextlib.suppress(OSError):
                path.unlink()
                gone += 1
        return gone

    # ---- reading --------------------------------------------------------------------------------------

    async def read(self, request_id: str) -> dict[str, Any] | None:
        """The stored document of a trial that ended (after its write, if that is under way), or None."""
        pending = self._pending.get(request_id)
        if pending is not None:
            await asyncio.wrap_future(pending)
        return await asyncio.to_thread(self._read, request_id)

    def _read(self, request_id: str) -> dict[str, Any] | None:
        try:
            data = gzip.decompress(self.path(request_id).read_bytes())
        except FileNotFoundError:
            return None
        document: dict[str, Any] = json.loads(data)
        return document

    async def close(self) -> None:
        """Finish every write under way; a temporary root goes with the store."""
        await asyncio.to_thread(self._writer.shutdown, wait=True)
        if self._temporary is not None:
            self._temporary.cleanup()
