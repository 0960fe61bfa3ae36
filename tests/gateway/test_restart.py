"""A gateway killed with SIGKILL and started again on the same state directory (real `relax-gym serve`
processes, the echo environment): finished trials are still answered, live ones end with cause
service_restart, replays return what was recorded, the directory is locked to one gateway, and no token
reaches the disk or the logs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import select
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from relax_gym_core.client import stable_request_id
from relax_gym_core.testing.web import GatewayProcess, start_gateway

SAFETY_S = 60.0  # guards against hangs only; nothing here is timed
SPECS = {
    "fast": {"environment": "echo", "runtime": "echo", "max_concurrency": 4, "queue_capacity": 4},
    "hold": {"environment": "echo", "runtime": "echo", "max_concurrency": 3, "queue_capacity": 4},
    "wide": {"environment": "echo", "runtime": "echo", "max_concurrency": 32, "queue_capacity": 32},
}
LOOPBACK = "http://127.0.0.1:9/agentic_api/"  # model endpoint: allowed, never called by these runs


def body(request_id: str, token: str, *, config: str, echo: dict[str, Any]) -> dict[str, Any]:
    return {
        "protocol_version": "relax-nemo-gym/v1",
        "request_id": request_id,
        "session": {"session_id": token, "group_id": "g1", "rollout_mode": "train"},
        "environment": {
            "name": "echo",
            "config": config,
            "task": {"messages": [{"role": "user", "content": "hi"}], "metadata": {"echo": echo}},
        },
        "model_endpoint": {"base_url": LOOPBACK, "api_key": token, "model": "policy"},
        "interrupt_policy": "protected",
        "deadline_s": 600,
        "lease_s": 120,
    }


def poll(http: httpx.Client, request_id: str, done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    return poll_all(http, [request_id], done)[request_id]


def poll_all(
    http: httpx.Client, request_ids: list[str], done: Callable[[dict[str, Any]], bool]
) -> dict[str, dict[str, Any]]:
    """The snapshots once each satisfies `done` (or as they are when the safety timeout passes)."""
    stop = time.monotonic() + SAFETY_S
    while True:
        snapshots = {rid: http.get(f"/v1/trials/{rid}").json() for rid in request_ids}
        if all(done(s) for s in snapshots.values()) or time.monotonic() > stop:
            return snapshots
        time.sleep(0.02)


def settled(snapshot: dict[str, Any]) -> bool:
    return snapshot.get("cleanup") not in (None, "pending")


def kill(gateway: GatewayProcess) -> None:
    os.kill(gateway.pid, signal.SIGKILL)  # our own gateway process, by PID
    gateway.process.wait(timeout=SAFETY_S)


def secrets_in(state_dir: Path, outputs: list[str], needles: list[str]) -> list[str]:
    """Where any needle occurs: files of the state directory, and the gateways' printed lines."""
    found = []
    for path in sorted(p for p in state_dir.rglob("*") if p.is_file()):
        data = path.read_bytes()
        found += [f"{path.name}: {needle[:8]}..." for needle in needles if needle.encode() in data]
    text = "\n".join(outputs)
    return found + [f"log: {needle[:8]}..." for needle in needles if needle in text]


def test_sigkill_then_restart_ends_live_trials_keeps_finished_ones_and_leaks_no_token(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    token = f"sk-ledger-{secrets.token_hex(16)}"
    finished = [f"fin-{i}" for i in range(2)]
    held = [f"hold-{i}" for i in range(5)]  # 3 running, 2 queued behind them
    debug = ("--log-level", "debug")
    with start_gateway(SPECS, state_dir=state_dir, extra_args=debug) as first:
        port = urlsplit(first.url).port
        assert port is not None
        with httpx.Client(base_url=first.url, trust_env=False, timeout=SAFETY_S) as http:
            for request_id in finished:
                body_ = body(request_id, token, config="fast", echo={"reward": 0.5})
                assert http.post("/v1/trials", json=body_).status_code == 202
                assert settled(poll(http, request_id, settled))
            for request_id in held:
                body_ = body(request_id, token, config="hold", echo={"sleep_s": 3600})
                assert http.post("/v1/trials", json=body_).status_code == 202
            running = poll_all(http, held[:3], lambda s: s["status"] == "running")
            assert [s["status"] for s in running.values()] == ["running"] * 3
            assert [http.get(f"/v1/trials/{rid}").json()["status"] for rid in held[3:]] == ["queued"] * 2
        kill(first)
    # What a crash leaves behind (the WAL with every page the first gateway wrote) holds no token.
    assert secrets_in(state_dir, first.output, [token]) == []

    with (
        start_gateway(SPECS, state_dir=state_dir, port=port, extra_args=debug) as second,
        httpx.Client(base_url=second.url, trust_env=False, timeout=SAFETY_S) as http,
    ):
        after = poll_all(http, finished + held, settled)
        for request_id in finished:  # answered from the ledger, result intact
            snapshot = after[request_id]
            assert (snapshot["status"], snapshot["reward"], snapshot["cleanup"]) == (
                "completed",
                0.5,
                "confirmed",
            )
        for request_id in held:  # running or queued: their runs died with the process
            snapshot = after[request_id]
            assert (snapshot["status"], snapshot["error"], snapshot["reward"]) == (
                "aborted",
                {"code": "service_restart"},
                None,
            )
            assert snapshot["cleanup"] == "confirmed"  # echo proves it by rollout id

        # A replayed create returns the recorded trial and runs nothing; another body is a conflict.
        replay = http.post("/v1/trials", json=body(held[0], token, config="hold", echo={"sleep_s": 3600}))
        assert (replay.status_code, replay.json()) == (202, after[held[0]])
        changed = http.post("/v1/trials", json=body(held[0], token, config="hold", echo={"sleep_s": 1}))
        assert changed.status_code == 409
        health = http.get("/healthz").json()
        assert (health["active_trials"], health["trials"]) == (0, 0)  # nothing was started again

        # One state directory, one gateway: a second one is refused with a clear reason.
        spec_file = tmp_path / "envs.json"
        spec_file.write_text(json.dumps(SPECS))
        refused = subprocess.run(
            [
                *(sys.executable, "-m", "relax_gym_core.cli", "serve", "--port", "0"),
                *("--environments", str(spec_file), "--state-dir", str(state_dir)),
            ],
            capture_output=True,
            text=True,
            timeout=SAFETY_S,
            env={**os.environ, "NEMO_GYM_CALLBACK_ALLOWED_NETWORKS": "127.0.0.1/32"},
            check=False,
        )
        assert refused.returncode != 0
        assert f"state directory {state_dir} is in use by another relax-gym gateway" in refused.stderr
        assert f"(pid {second.pid})" in refused.stderr
        outputs = first.output + second.output

    assert secrets_in(state_dir, outputs, [token]) == []
    assert (state_dir / "fingerprint.key").stat().st_mode & 0o777 == 0o600


@pytest.fixture
def client_session(tmp_path: Path) -> Callable[[str], tuple[dict[str, str], str, Path]]:
    """A Relax-like session of the thin client on the hold config: (environ, request_id, io_dir)."""

    def make(gateway_url: str) -> tuple[dict[str, str], str, Path]:
        io_dir = tmp_path / "relax-agentic-command-1"
        io_dir.mkdir()
        session_id = f"agentic_session_shard_0.session-{secrets.token_hex(16)}"
        session_input = {
            "messages": [{"role": "user", "content": "hi"}],
            "metadata": {"echo": {"sleep_s": 3600}},
        }
        (io_dir / "in.json").write_text(json.dumps(session_input))
        base = {k: v for k, v in os.environ.items() if not k.startswith(("RELAX_", "NEMO_GYM_", "OPENAI_"))}
        environ = {
            **base,
            "NEMO_GYM_URL": gateway_url,
            "NEMO_GYM_ENVIRONMENT": "echo",
            "NEMO_GYM_CONFIG": "hold",
            "NEMO_GYM_POLL_INTERVAL_S": "0.05",
            "NEMO_GYM_LEASE_S": "120",
            "RELAX_SESSION_ID": session_id,
            "RELAX_SESSION_IO_DIR": str(io_dir),
            "RELAX_BASE_URL": LOOPBACK,
            "RELAX_INPUT_JSON": str(io_dir / "in.json"),
            "RELAX_OUTPUT_JSON": str(io_dir / "out.json"),
        }
        return environ, stable_request_id(session_id, 1, invocation_id=str(io_dir)), io_dir

    return make


def test_thin_client_polling_through_a_restart_reports_it_and_exports_nothing(
    tmp_path: Path, client_session: Callable[[str], tuple[dict[str, str], str, Path]]
) -> None:
    state_dir = tmp_path / "state"
    with start_gateway(SPECS, state_dir=state_dir) as first:
        port = urlsplit(first.url).port
        assert port is not None
        environ, request_id, io_dir = client_session(first.url)
        client = subprocess.Popen(  # our own client process; stopped by PID below if it outlives the test
            [sys.executable, "-m", "relax_gym_core.client"],
            env=environ,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            with httpx.Client(base_url=first.url, trust_env=False, timeout=SAFETY_S) as http:
                stop = time.monotonic() + SAFETY_S
                while http.get(f"/v1/trials/{request_id}").status_code == 404 and time.monotonic() < stop:
                    time.sleep(0.02)
                assert poll(http, request_id, lambda s: s["status"] == "running")["status"] == "running"
            kill(first)
            # The client keeps polling (transport errors are retried within its lease) while the
            # gateway comes back on the same port and state directory.
            with start_gateway(SPECS, state_dir=state_dir, port=port):
                _, stderr = client.communicate(timeout=SAFETY_S)
        finally:
            if client.poll() is None:
                client.kill()
                client.wait()
    assert client.returncode == 1  # non-zero: Relax drops the group
    assert "lost to a gateway restart (error code 'service_restart')" in stderr
    assert "not found" not in stderr  # the trial was still there after the restart, ended
    assert not (io_dir / "out.json").exists()  # never a reward


def test_every_acknowledged_create_survives_a_sigkill_that_follows_it(tmp_path: Path) -> None:
    """The 202 of a create waits for the batch holding it: kill the gateway the moment the last 202
    arrives, and every acknowledged trial is still there after the restart. (Writes land at once here,
    so a 202 sent before its write would usually survive too: the next test holds the write back.)"""
    state_dir = tmp_path / "state"
    ids = [f"acked-{i}" for i in range(64)]

    async def create_all(url: str) -> list[int]:
        async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=SAFETY_S) as http:
            answers = await asyncio.gather(
                *(
                    http.post("/v1/trials", json=body(rid, "sk-x", config="wide", echo={"sleep_s": 3600}))
                    for rid in ids
                )
            )
        return [answer.status_code for answer in answers]

    with start_gateway(SPECS, state_dir=state_dir) as first:
        port = urlsplit(first.url).port
        assert port is not None
        assert asyncio.run(create_all(first.url)) == [202] * len(ids)
        kill(first)
    with (
        start_gateway(SPECS, state_dir=state_dir, port=port) as second,
        httpx.Client(base_url=second.url, trust_env=False, timeout=SAFETY_S) as http,
    ):
        found = [http.get(f"/v1/trials/{rid}").status_code for rid in ids]
    assert found == [200] * len(ids)


@contextlib.contextmanager
def write_lock(ledger: Path) -> Iterator[Callable[[], None]]:
    """Another SQLite connection holding the ledger's write lock (as a stalled disk holds a batch): no
    batch of the gateway can land until the returned release() is called (or the block ends)."""
    connection = sqlite3.connect(ledger, isolation_level=None, timeout=SAFETY_S)
    connection.execute("BEGIN IMMEDIATE")

    def release() -> None:
        if connection.in_transaction:
            connection.execute("ROLLBACK")

    try:
        yield release
    finally:
        release()
        connection.close()


def send_create(url: str, payload: dict[str, Any]) -> socket.socket:
    """One whole create request on a connection of its own; the answer is left to read."""
    host, port = urlsplit(url).hostname, urlsplit(url).port
    assert host is not None and port is not None
    data = json.dumps(payload).encode()
    head = (
        f"POST /v1/trials HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    )
    sock = socket.create_connection((host, port), timeout=SAFETY_S)
    sock.sendall(head.encode() + data)
    return sock


def answered(sockets: list[socket.socket], timeout_s: float) -> list[socket.socket]:
    """The connections that have received anything (an answer's first bytes) within `timeout_s`."""
    readable, _, _ = select.select(sockets, [], [], timeout_s)
    return readable


def read_all(sock: socket.socket) -> bytes:
    """Whatever arrived before the connection closed (the gateway is dead by then: EOF or reset)."""
    data = b""
    with contextlib.suppress(OSError):
        while chunk := sock.recv(65536):
            data += chunk
    sock.close()
    return data


def test_no_create_is_acknowledged_ahead_of_its_write_across_a_sigkill(tmp_path: Path) -> None:
    """The creates arrive while another connection holds the ledger's write lock, so none of their
    writes can land. Once the gateway holds every one of them (its health counts them), an answer already
    on its way would be an acknowledgement ahead of the write: the gateway is killed then, with the
    writes still held back. Otherwise the lock goes, and the gateway is killed the moment the first
    answer arrives. Either way, every create answered 202 must be in the restarted gateway."""
    state_dir = tmp_path / "state"
    ids = [f"held-back-{i}" for i in range(16)]
    with start_gateway(SPECS, state_dir=state_dir) as first:
        port = urlsplit(first.url).port
        assert port is not None
        sockets: list[socket.socket] = []
        try:
            with write_lock(state_dir / "ledger.sqlite3") as release:
                for rid in ids:
                    payload = body(rid, "sk-x", config="wide", echo={"sleep_s": 3600})
                    sockets.append(send_create(first.url, payload))
                with httpx.Client(base_url=first.url, trust_env=False, timeout=SAFETY_S) as http:
                    stop = time.monotonic() + SAFETY_S
                    while http.get("/healthz").json()["trials"] < len(ids):
                        assert time.monotonic() < stop, "the gateway never received every create"
                        time.sleep(0.01)
                # Every answer the gateway wrote before its health answer is on this machine by now.
                early = answered(sockets, 0)
                if early:
                    kill(first)  # the writes are still held back: whatever was acknowledged is lost
                else:
                    release()
                    assert answered(sockets, SAFETY_S), "no create was answered once the ledger was free"
                    kill(first)
            answers = {rid: read_all(sock) for rid, sock in zip(ids, sockets, strict=True)}
        finally:
            for sock in sockets:
                sock.close()
    acknowledged = [rid for rid, answer in answers.items() if answer.startswith(b"HTTP/1.1 202")]
    assert acknowledged, "no create was acknowledged at all"
    with (
        start_gateway(SPECS, state_dir=state_dir, port=port) as second,
        httpx.Client(base_url=second.url, trust_env=False, timeout=SAFETY_S) as http,
    ):
        found = {rid: http.get(f"/v1/trials/{rid}").status_code for rid in acknowledged}
    lost = sorted(rid for rid, status in found.items() if status != 200)
    assert lost == [], f"{len(lost)} of {len(acknowledged)} acknowledged creates were lost: {lost}"
    assert early == [], "a create was answered while its write could not land"
