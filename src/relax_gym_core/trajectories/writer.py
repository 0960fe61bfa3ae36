"""The trajectory writer process: finished trials' records in, rows of `trajectories.sqlite3` out.

A process, not a thread: encoding a record (its header, the secret replacement) and inserting it is
Python that would hold the GIL the gateway's event loop runs on. The gateway (store.py) marshals each
record when its trial ends (plain values only), sends them a batch at a time on this process's stdin,
and reads back on its stdout the batch's last sequence number once the batch is committed (or given
up). It exits when stdin closes, so it never outlives its gateway. Standard library only, and started
with `-I -S`: nothing of the package is imported here, so it starts in a few tens of milliseconds.

Frames both ways are an 8-byte little-endian length (or, from here, the sequence number) and the bytes.
"""

from __future__ import annotations

import json
import marshal
import os
import signal
import sqlite3
import struct
import sys
import time
import zlib
from collections.abc import Iterable
from typing import Any

FORMAT = "relax-gym/trajectory-v1"
REDACTED_BYTES = b"[redacted]"
MIN_SECRET_CHARS = 8  # shorter values ("EMPTY", "x") are no secret, and replacing them would mangle text
COMPRESS_ABOVE = 16 * 1024  # smaller records are stored as they are: zlib would cost more than it saves
FRAME = struct.Struct("<Q")
_JSON = json.JSONEncoder(ensure_ascii=False, default=str)  # one encoder: json.dumps makes one per call

# One bridged call as recorded (a plain tuple: it crosses to this process as it is):
# resource, request, answer, size, status, streamed, seconds, attempts, error. request/answer are None
# when the trial's cap was spent: `size` says how much was left out.
type ModelCall = tuple[str, bytes | None, bytes | None, int, int, bool, float, int, str | None]
# One finished trial: request_id, environment, config, secrets, the /run request and answer (bytes, a
# document to encode, or None), calls (None: none), bytes left under the cap, status, ended_at.
type Record = tuple[str, str, str, tuple[str, ...], Any, Any, list[ModelCall] | None, int, str, float]

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


def connect(path: str) -> sqlite3.Connection:
    connection = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=NORMAL")  # a trajectory is not acknowledged data
    connection.execute(SCHEMA)
    return connection


def cut_marker(size: int) -> dict[str, Any]:
    """The marker that stands for a body past the cap (stored for the run's bodies, shown for a call's)."""
    return {"truncated": True, "bytes": size}


def dump(record: Record) -> bytes:
    """A record as the writer gets it: marshal (this interpreter's own format, faster than pickle), or,
    for a run document holding something marshal refuses, that document as JSON first."""
    try:
        return marshal.dumps(record)
    except ValueError:
        run = tuple(None if body is None else _bytes(body) for body in record[4:6])
        return marshal.dumps((*record[:4], *run, *record[6:]))


def secret_bytes(secrets: Iterable[str]) -> tuple[bytes, ...]:
    """What to replace: each secret long enough to be one, also as JSON writes it (a `"` or `\\` in it is
    escaped there), longest first so that none hides inside another."""
    kept: set[bytes] = set()
    for secret in secrets:
        if len(secret) >= MIN_SECRET_CHARS:
            raw = secret.encode()
            kept.add(raw)
            if b'"' in raw or b"\\" in raw:
                kept.add(_JSON.encode(secret)[1:-1].encode())
    return tuple(sorted(kept, key=len, reverse=True))


def _redacted(data: bytes, secrets: tuple[bytes, ...]) -> bytes:
    for secret in secrets:
        data = data.replace(secret, REDACTED_BYTES)
    return data


def _bytes(body: Any) -> bytes:
    return body if isinstance(body, bytes) else _JSON.encode(body).encode()


def encode(record: Record) -> bytes:
    """One trial's record as stored: a JSON header line, then each kept body's bytes as they came.
    Nothing is parsed or folded here — that waits for a reader — and each part has the trial's secrets
    replaced before its length is taken."""
    request_id, environment, config, secrets, run_request, run_answer, calls, left, status, _ = record
    calls = calls or []
    replaced = secret_bytes(secrets)
    bodies: list[bytes] = []
    entries = []
    for resource, request, answer, size, code, streamed, seconds, attempts, error in calls:
        entry: dict[str, Any] = {"resource": resource, "status": code, "size": size}
        entry |= {"seconds": round(seconds, 6), "attempts": attempts}
        if streamed:
            entry["streamed"] = True
        if error is not None:
            entry["error"] = error
        for part, body in (("request", request), ("answer", answer)):
            if body is not None:
                kept = _redacted(body, replaced)
                entry[part] = len(kept)
                bodies.append(kept)
        entries.append(entry)
    run_doc: dict[str, Any] = {}
    cut = sum(call[3] for call in calls if call[1] is None)
    for key, body in (("request", run_request), ("answer", run_answer)):
        if body is not None:
            kept = _redacted(_bytes(body), replaced)
            if len(kept) <= left:
                left -= len(kept)
                run_doc[key] = len(kept)
                bodies.append(kept)
            else:
                cut += len(kept)
                run_doc[key] = cut_marker(len(kept))
    header = {
        "format": FORMAT,
        "request_id": request_id,
        "environment": environment,
        "config": config,
        "status": status,
        "run": run_doc,
        "calls": entries,
        **({"truncated_bytes": cut} if cut else {}),
    }
    head = _redacted(_JSON.encode(header).encode(), replaced)
    return head + b"\n" + b"".join(bodies)  # the header holds no newline: json.dumps escapes them


def commit(connection: sqlite3.Connection, records: list[Record]) -> int:
    """Write a batch in one transaction; how many rows were written."""
    index: list[tuple[str, float, bool, int, int]] = []  # id, ended_at, compressed, offset (from 1), size
    blobs: list[bytes] = []
    offset = 1
    for record in records:
        try:
            data = encode(record)
            compressed = len(data) > COMPRESS_ABOVE
            if compressed:
                data = zlib.compress(data, 1)
        except Exception as exc:  # noqa: BLE001 - one bad record must not lose the batch
            _warn(f"trajectory of request_id={record[0]} not kept: {type(exc).__name__}: {exc}")
            continue
        index.append((record[0], record[9], compressed, offset, len(data)))
        blobs.append(data)
        offset += len(data)
    if index:
        with connection:
            connection.execute("BEGIN")
            connection.execute(INSERT_BATCH, (b"".join(blobs), json.dumps(index)))
    return len(index)


def sweep(connection: sqlite3.Connection, now: float, retention_s: float, max_retained: int) -> None:
    """Forget trajectories past the retention (their trials are forgotten), then the oldest beyond
    max_retained."""
    with connection:
        connection.execute("BEGIN")
        connection.execute("DELETE FROM trajectories WHERE ended_at <= ?", (now - retention_s,))
        connection.execute(
            "DELETE FROM trajectories WHERE request_id IN (SELECT request_id FROM trajectories "
            "ORDER BY ended_at DESC LIMIT -1 OFFSET ?)",
            (max_retained,),
        )


def _warn(message: str) -> None:
    sys.stderr.write(f"relax-gym trajectories: {message}\n")
    sys.stderr.flush()


def _read_exactly(source: int, size: int) -> bytes | None:
    parts = []
    while size:
        part = os.read(source, size)  # a frame as it arrives, not through a buffer
        if not part:
            return None  # stdin closed: the gateway is done (or gone)
        parts.append(part)
        size -= len(part)
    return b"".join(parts)


def _read_frame(source: int) -> bytes | None:
    head = _read_exactly(source, FRAME.size)
    return None if head is None else _read_exactly(source, FRAME.unpack(head)[0])


def serve(path: str, retention_s: float, max_retained: int, sweep_every: int) -> None:
    source, sink = sys.stdin.fileno(), sys.stdout.buffer
    connection = connect(path)
    written = 0
    while (frame := _read_frame(source)) is not None:
        # From the gateway that started us (the same interpreter), over a pipe only it holds.
        sequence, blobs = marshal.loads(frame)  # noqa: S302
        records = [marshal.loads(blob) for blob in blobs]  # noqa: S302
        try:
            written += commit(connection, records)
            if written >= sweep_every:
                written = 0
                sweep(connection, time.time(), retention_s, max_retained)
        except sqlite3.Error as exc:
            _warn(f"{len(records)} trajectories not written: {exc}")
        sink.write(FRAME.pack(sequence))  # after the sweep too: a reader then sees what the batch left
        sink.flush()
    connection.close()


if __name__ == "__main__":
    # The terminal's Ctrl-C reaches the whole process group: the gateway stops us by closing stdin,
    # after its last batch, so the interrupt must not cut that batch short.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    serve(sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
