"""The trajectory store and its writer process: a trial that ends is written once, read back with its
secrets replaced (the same document before and after its write), kept within max_retained, a reader
never waits for the writer, flush() never waits forever for a write that failed, and a writer process
that died is replaced."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import pytest

from relax_gym_core.protocol import TrialStatus
from relax_gym_core.trajectories.store import TrajectoryStore

pytestmark = pytest.mark.anyio
SECRET = "sk-store-secret-000111"


def run(store: TrajectoryStore, request_id: str) -> None:
    recorder = store.begin(request_id, "echo", "echo", (SECRET, "short"))
    recorder.run_request(json.dumps({"task": "say hi", "echoed": SECRET}).encode())
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi short"}]}).encode()
    answer = json.dumps({"choices": [{"message": {"content": "hi"}}], "usage": {"prompt_tokens": 3}}).encode()
    recorder.model_call(
        "chat/completions", body, status=200, answer=answer, streamed=False, seconds=0.1, attempts=1
    )
    recorder.run_answer(b'{"reward": 1.0}')
    store.finished(request_id, TrialStatus.COMPLETED)


async def test_a_trial_is_written_once_it_ends_and_read_back(tmp_path: Path) -> None:
    store = TrajectoryStore(tmp_path)
    try:
        run(store, "t-1")
        before_written = await store.read("t-1")  # from the record in hand: the batch is not sent yet
        assert store._pending
        await store.flush()
        assert not store._pending
        document = await store.read("t-1")  # from the file
        assert document is not None
        assert before_written == document
        assert document["run"]["request"] == {"task": "say hi", "echoed": "[redacted]"}
        # Short values are no secrets: "short" stays in the text it is part of.
        assert document["model_calls"][0]["request"]["messages"][0]["content"] == "hi short"
        assert document["model_calls"][0]["usage"] == {"input_tokens": 3}
        assert await store.read("never-ran") is None
    finally:
        await store.close()
    assert SECRET.encode() not in stored_bytes(tmp_path)


def stored_bytes(directory: Path) -> bytes:
    return b"".join(path.read_bytes() for path in directory.iterdir())


async def test_only_the_newest_max_retained_are_kept(tmp_path: Path) -> None:
    store = TrajectoryStore(tmp_path, max_retained=1, sweep_every=1)  # sweep after every batch
    try:
        run(store, "old")
        await store.flush()
        assert await store.read("old") is not None
        run(store, "new")
        await store.flush()
        assert await store.read("new") is not None
        assert await store.read("old") is None
    finally:
        await store.close()


def writer_pid(store: TrajectoryStore) -> int:
    assert store.process is not None  # started by start() or the first batch
    return store.process.pid


async def started_writer(store: TrajectoryStore) -> int:
    """The pid of the writer process, started by a first trajectory that was written and read back."""
    run(store, "first")
    await store.flush()
    assert await store.read("first") is not None
    return writer_pid(store)


async def test_start_spawns_the_writer_before_any_trial_and_the_first_trial_uses_it(tmp_path: Path) -> None:
    """The gateway starts its writer with itself: the first batch does not pay for a process spawn."""
    store = TrajectoryStore(tmp_path)
    try:
        await store.start()
        pid = writer_pid(store)
        os.kill(pid, 0)  # alive, before any trial ran
        assert await started_writer(store) == pid
    finally:
        await store.close()
    assert store.process is None


async def test_a_writer_that_died_is_replaced(tmp_path: Path) -> None:
    store = TrajectoryStore(tmp_path)
    try:
        first = await started_writer(store)
        os.kill(first, signal.SIGKILL)
        assert store.process is not None
        await store.process.wait()  # gone before the next batch (one sent meanwhile would be lost)
        run(store, "after")
        await store.flush()
        assert await store.read("after") is not None
        assert writer_pid(store) != first
    finally:
        await store.close()
    assert store.process is None


async def test_a_writer_that_died_with_a_batch_loses_it_and_nobody_waits_on_it(tmp_path: Path) -> None:
    store = TrajectoryStore(tmp_path)
    try:
        pid = await started_writer(store)
        os.kill(pid, signal.SIGSTOP)  # it takes nothing from its pipe now
        run(store, "lost")
        flushing = asyncio.create_task(store.flush())
        while not store._in_flight:  # noqa: ASYNC110 - nothing signals "sent": wait until it is in the pipe
            await asyncio.sleep(0.01)
        assert await store.read("lost") is not None  # a reader does not wait on the stuck writer
        os.kill(pid, signal.SIGKILL)
        await flushing  # ends once the batch is given up, not waited on forever
        assert await store.read("lost") is None  # lost with its writer (404 upstream)
        run(store, "after")
        await store.flush()
        assert await store.read("after") is not None
    finally:
        await store.close()


async def test_the_writer_ignores_the_terminals_interrupt(tmp_path: Path) -> None:
    """Ctrl-C reaches the whole process group; the gateway, not the signal, ends its writer (after the
    last batch)."""
    store = TrajectoryStore(tmp_path)
    try:
        pid = await started_writer(store)
        os.kill(pid, signal.SIGINT)
        run(store, "after")
        await store.flush()
        assert await store.read("after") is not None
        assert writer_pid(store) == pid
    finally:
        await store.close()
