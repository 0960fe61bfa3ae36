"""A rollout's directory: which run it holds (run.json), one line per finished trial (trials.jsonl) and the
summary of those lines (summary.json).

trials.jsonl is the source of truth and is only ever appended to: the lines of the trials that ended
together are written by one write() on an O_APPEND descriptor and fsynced before those trials count as
done, so a kill -9 loses at most the lines not yet synced and can tear at most the last one. Opening the
directory again cuts such a torn tail (it has no newline) before anything is appended, and every (row,
repeat) that has a line is skipped.
run.json and summary.json are replaced atomically.
"""

from __future__ import annotations

import gzip
import json
import os
import queue
import secrets
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from attrs import asdict, fields, frozen

from relax_gym_core.errors import ConversionError
from relax_gym_core.jsonl import atomic_output
from relax_gym_core.protocol import jsonutil

RUN_FILE = "run.json"
TRIALS_FILE = "trials.jsonl"
# Each trial's trajectory, as the gateway served it (a JSON line): one gzip member per batch of trials that
# ended together, so appending never rewrites what is there and a kill -9 can tear only the last member
# (readers stop before it; those trials have no line in trials.jsonl yet).
TRAJECTORIES_FILE = "trajectories.jsonl.gz"
TRAJECTORY = "_trajectory"  # the key a record carries its trajectory under, to the writer (never written)
SUMMARY_FILE = "summary.json"

type TrialKey = tuple[int, int]  # (row line, repeat)


@frozen(kw_only=True)
class RunInfo:
    """What makes two invocations the same run: resuming needs the same policy and model."""

    run_id: str
    policy: str  # the policy URL (never a key) or "oracle:P seed S"
    model: str
    data: str  # the data file first used (for people; rows are matched by content, line by line)
    created_at: str

    @classmethod
    def new(cls, *, policy: str, model: str, data: str) -> RunInfo:
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return cls(run_id=secrets.token_hex(6), policy=policy, model=model, data=data, created_at=created)


def _write_json(path: Path, document: Mapping[str, Any]) -> None:
    with atomic_output(path) as sink:
        sink.write(json.dumps(document, indent=2, allow_nan=False).encode() + b"\n")


def read_run(out: Path) -> RunInfo | None:
    """The run `out` holds, None for a new directory; ConversionError if it is not a rollout directory."""
    path = out / RUN_FILE
    if out.exists() and not out.is_dir():
        raise ConversionError(f"--out {out} is not a directory")
    if not path.exists():
        if (out / TRIALS_FILE).exists():
            raise ConversionError(f"{out} has {TRIALS_FILE} but no {RUN_FILE}: not a rollout directory")
        return None
    try:
        document = json.loads(path.read_text())
        return RunInfo(**{field.name: str(document[field.name]) for field in fields(RunInfo)})
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConversionError(f"{path}: not a rollout run file ({type(exc).__name__}: {exc})") from None


def write_run(out: Path, info: RunInfo) -> None:
    _write_json(out / RUN_FILE, asdict(info))


def check_same_run(out: Path, held: RunInfo, *, policy: str, model: str) -> None:
    if (held.policy, held.model) != (policy, model):
        raise ConversionError(
            f"--out {out} holds a run of policy {held.policy!r} (model {held.model!r}), not {policy!r} "
            f"(model {model!r}): choose another --out, or the same --policy and --model to resume it"
        )


def _check_record(path: Path, number: int, record: object) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise ConversionError(f"{path}:{number}: not a trial record (expected an object)")
    for key, kind in (("row", int), ("repeat", int), ("row_digest", str)):
        if not isinstance(record.get(key), kind):
            raise ConversionError(f"{path}:{number}: not a trial record (no {kind.__name__} {key!r})")
    return record


def load_trials(out: Path, *, repair: bool = True) -> tuple[dict[TrialKey, dict[str, Any]], int]:
    """The finished trials of `out` by (row, repeat), and how many bytes of a torn last line were cut.

    Only a tail without its newline counts as torn (what a kill during a write leaves); a complete line
    that is not a record means someone else edited the file, and is an error naming file:line.
    """
    path = out / TRIALS_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}, 0
    except OSError as exc:
        raise ConversionError(f"cannot read {path}: {exc.strerror}") from None
    keep = data.rfind(b"\n") + 1
    torn = len(data) - keep
    if torn and repair:
        os.truncate(path, keep)
    records: dict[TrialKey, dict[str, Any]] = {}
    for number, line in enumerate(data[:keep].splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = _check_record(path, number, json.loads(line))
        except ValueError as exc:
            raise ConversionError(f"{path}:{number}: not a trial record ({exc})") from None
        records.setdefault((record["row"], record["repeat"]), record)
    return records, torn


def check_same_data(
    out: Path, records: Iterable[dict[str, Any]], digests: Mapping[int, str], data: Path
) -> None:
    """Refuse to resume `out` with a data file that holds other rows at the lines already run."""
    for record in records:
        expected = digests.get(record["row"])
        if expected is not None and expected != record["row_digest"]:
            raise ConversionError(
                f"--out {out} holds a run of different data: line {record['row']} of {data} is not the row "
                "run there; choose another --out for this data"
            )


def write_summary(out: Path, summary: Mapping[str, Any]) -> Path:
    path = out / SUMMARY_FILE
    _write_json(path, summary)
    return path


class TrialLog:
    """Appends trial records to trials.jsonl from a writer thread, in group commits: every record waiting is
    written (one write() per line) and then fsynced once, after which `on_durable` is told about each.

    The event loop never blocks on the disk, and a burst of finishing trials costs one fsync, not one each.
    """

    def __init__(self, out: Path, on_durable: Callable[[dict[str, Any]], None]) -> None:
        path = out / TRIALS_FILE
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        except OSError as exc:
            raise ConversionError(f"cannot write {path}: {exc.strerror}") from None
        self._path = path
        self._trajectories: int | None = None  # opened with the first trajectory
        self._on_durable = on_durable
        self._queue: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
        self._handled = threading.Condition()
        self._appended = 0
        self._done = 0  # records written and synced (or given up after a failed write)
        self.failure: OSError | None = None
        self._thread = threading.Thread(target=self._run, name="trials.jsonl writer", daemon=True)
        self._thread.start()

    def append(self, record: dict[str, Any]) -> None:
        with self._handled:
            self._appended += 1
        self._queue.put(record)

    def drain(self) -> None:
        """Block until every record appended so far is on disk (or its write failed)."""
        with self._handled:
            self._handled.wait_for(lambda: self._done >= self._appended)

    def close(self) -> None:
        """Write and sync what is queued, then stop. Raises ConversionError if a write failed."""
        self._queue.put(None)
        self._thread.join()
        os.close(self._fd)
        if self._trajectories is not None:
            os.close(self._trajectories)
        if self.failure is not None:
            raise ConversionError(f"cannot write {self._path}: {self.failure.strerror or self.failure}")

    def _run(self) -> None:
        stop = False
        while not stop:
            batch = [self._queue.get()]
            while not self._queue.empty():
                batch.append(self._queue.get())
            stop = batch[-1] is None
            records = [record for record in batch if record is not None]
            if records and self.failure is None:
                self._write(records)
            with self._handled:
                self._done += len(records)
                self._handled.notify_all()

    def _write(self, records: list[dict[str, Any]]) -> None:
        try:
            # A trial's trajectory goes first: a line in trials.jsonl means its trajectory is there too.
            documents = [document for record in records if (document := record.pop(TRAJECTORY, None))]
            if documents:
                if self._trajectories is None:
                    path = self._path.with_name(TRAJECTORIES_FILE)
                    self._trajectories = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
                # One gzip member a batch: a compressor's set-up cost more than a small trajectory.
                lines = b"".join(jsonutil.dumps(document) + b"\n" for document in documents)
                _write_all(self._trajectories, gzip.compress(lines, compresslevel=6))
                os.fsync(self._trajectories)
            _write_all(self._fd, b"".join(jsonutil.dumps(record) + b"\n" for record in records))
            os.fsync(self._fd)
        except OSError as exc:  # reported by close(); these trials do not count as done
            self.failure = exc
            return
        for record in records:
            self._on_durable(record)


def load_trajectories(out: Path, request_ids: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
    """The trajectories a rollout directory holds, by request id (only `request_ids`, when given). A torn
    last member (a kill -9 while it was written) ends the reading; its trial has no line either."""
    wanted = set(request_ids) if request_ids is not None else None
    found: dict[str, dict[str, Any]] = {}
    path = out / TRAJECTORIES_FILE
    if not path.exists():
        return found
    with gzip.open(path, "rb") as stream:
        while True:
            try:
                line = stream.readline()
            except (EOFError, gzip.BadGzipFile, zlib.error):
                break
            if not line:
                break
            try:
                document = json.loads(line)
            except ValueError:
                break
            request_id = document.get("request_id") if isinstance(document, dict) else None
            if isinstance(request_id, str) and (wanted is None or request_id in wanted):
                found[request_id] = document
    return found


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
