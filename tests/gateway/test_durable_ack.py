"""Nothing is acknowledged before it is on disk: with the ledger file locked by another SQLite connection
(a write that cannot land), the 202 of a create or an abort does not come; it comes once the lock goes,
and what it acknowledged is in the file by then. The real app, its real SQLite ledger."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from relax_gym_core.gateway import GatewaySettings, create_app, parse_environments
from relax_gym_core.trials import ledger as ledger_module

SAFETY_S = 60.0  # guards against hangs only
STUCK_S = 1.0  # how long an answer must stay missing while the file is locked (it never comes early)
SPECS = {"echo": {"environment": "echo", "runtime": "echo", "max_concurrency": 2, "queue_capacity": 2}}


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[TestClient, Path]]:
    envs = parse_environments(json.dumps(SPECS), source="test")
    state_dir = tmp_path / "state"
    app = create_app(GatewaySettings(environments=envs, state_dir=str(state_dir)))
    with TestClient(app) as client:
        yield client, state_dir / "ledger.sqlite3"


class FileLock:
    """Another writer holding the ledger file's write lock, as a stuck disk would hold the batch."""

    def __init__(self, path: Path) -> None:
        self._connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)

    def __enter__(self) -> FileLock:
        self._connection.execute("BEGIN IMMEDIATE")
        return self

    def __exit__(self, *_exc: object) -> None:
        self._connection.execute("ROLLBACK")
        self._connection.close()


def in_thread(call: Any) -> tuple[threading.Event, list[httpx.Response]]:
    answered, answers = threading.Event(), []

    def run() -> None:
        answers.append(call())
        answered.set()

    threading.Thread(target=run, daemon=True).start()
    return answered, answers


def phase_in_file(path: Path, request_id: str) -> str | None:
    with sqlite3.connect(path) as reader:
        row = reader.execute("SELECT phase FROM trials WHERE request_id = ?", (request_id,)).fetchone()
    return None if row is None else str(row[0])


def test_create_and_abort_answer_only_once_written(gateway: tuple[TestClient, Path], make_body: Any) -> None:
    client, ledger = gateway
    body = make_body(echo={"sleep_s": 600})
    request_id = body["request_id"]
    with FileLock(ledger):
        answered, answers = in_thread(lambda: client.post("/v1/trials", json=body))
        assert not answered.wait(STUCK_S)  # the trial exists in memory, but nobody is told
    assert answered.wait(SAFETY_S)
    assert answers[0].status_code == 202
    assert phase_in_file(ledger, request_id) == "active"  # what the 202 said is in the file

    deadline = time.monotonic() + SAFETY_S
    while client.get(f"/v1/trials/{request_id}").json()["status"] != "running":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    with FileLock(ledger):
        answered, answers = in_thread(lambda: client.post(f"/v1/trials/{request_id}/abort"))
        assert not answered.wait(STUCK_S)
    assert answered.wait(SAFETY_S)
    assert answers[0].status_code == 202
    assert phase_in_file(ledger, request_id) in ("cancelling", "terminal")  # the abort is on record


def test_a_write_that_cannot_land_is_answered_503_and_the_retried_create_is_acknowledged(
    tmp_path: Path, make_body: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A ledger that cannot be written (here: its lock held past the write's busy timeout) is an operating
    condition, not a bug: 503 with Retry-After, nothing acknowledged; the client's retry of the same
    create is acknowledged once the write lands."""
    monkeypatch.setattr(ledger_module, "BUSY_TIMEOUT_S", 0.2)
    envs = parse_environments(json.dumps(SPECS), source="test")
    state_dir = tmp_path / "state"
    body = make_body(echo={"sleep_s": 600})
    with TestClient(create_app(GatewaySettings(environments=envs, state_dir=str(state_dir)))) as client:
        ledger = state_dir / "ledger.sqlite3"
        with FileLock(ledger):
            refused = client.post("/v1/trials", json=body)
            assert (refused.status_code, refused.headers.get("retry-after")) == (503, "1")
            assert refused.json() == {"detail": "the trial ledger could not be written"}
            assert phase_in_file(ledger, body["request_id"]) is None  # nothing acknowledged is missing
        retried = client.post("/v1/trials", json=body)
        assert retried.status_code == 202
        assert phase_in_file(ledger, body["request_id"]) == "active"
        # The run waited for its write-ahead record instead of failing for it.
        assert client.get(f"/v1/trials/{body['request_id']}").json()["status"] in ("queued", "running")
    assert "unhandled error" not in caplog.text  # not logged as a bug of ours
