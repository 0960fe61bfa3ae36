"""The trajectory store in-process: a trial that ends is written once, read back with its secrets replaced,
kept within max_retained, and a reader never waits forever for a write that failed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from relax_gym_core.observe import Transition, TrialEvent
from relax_gym_core.protocol import CleanupState, TrialStatus
from relax_gym_core.trajectories import store as trajectories
from relax_gym_core.trajectories.store import TrajectoryStore

pytestmark = pytest.mark.anyio
SECRET = "sk-store-secret-000111"


def ended(request_id: str) -> Transition:
    return Transition(
        event=TrialEvent.TERMINAL,
        request_id=request_id,
        environment="echo",
        config="echo",
        status=TrialStatus.COMPLETED,
        cleanup=CleanupState.PENDING,
        at=0.0,
        age_s=0.0,
        previous=TrialEvent.RUNNING,
        phase_s=0.0,
    )


def run(store: TrajectoryStore, request_id: str) -> None:
    recorder = store.begin(request_id, "echo", "echo", [SECRET, "short"])
    recorder.run_request(json.dumps({"task": "say hi", "echoed": SECRET}).encode())
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi short"}]}).encode()
    answer = json.dumps({"choices": [{"message": {"content": "hi"}}], "usage": {"prompt_tokens": 3}}).encode()
    recorder.model_call(
        "chat/completions", body, status=200, answer=answer, streamed=False, seconds=0.1, attempts=1
    )
    recorder.run_answer(b'{"reward": 1.0}')
    store.transition(ended(request_id))


async def test_a_trial_is_written_once_it_ends_and_read_back(tmp_path: Path) -> None:
    store = TrajectoryStore(tmp_path)
    try:
        run(store, "t-1")
        document = await store.read("t-1")
        assert document is not None
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


async def test_only_the_newest_max_retained_are_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trajectories, "SWEEP_EVERY", 1)  # sweep after every batch
    store = TrajectoryStore(tmp_path, max_retained=1)
    try:
        run(store, "old")
        assert await store.read("old") is not None
        run(store, "new")
        assert await store.read("new") is not None
        assert await store.read("old") is None
    finally:
        await store.close()


async def test_a_failed_write_lets_its_reader_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: object) -> bytes:
        raise OSError("disk gone")

    monkeypatch.setattr(trajectories, "encode", broken)
    store = TrajectoryStore(tmp_path)
    try:
        run(store, "lost")
        assert await store.read("lost") is None  # answered (404 upstream), not waited on
    finally:
        await store.close()
