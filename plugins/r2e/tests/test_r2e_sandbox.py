"""The sandbox for real: bubblewrap under a per-rollout uid, the tools, the evaluation, and containment of
what an agent may run (no network, read-only system, private /tmp, time, processes, memory, file size,
output), with every process and directory proven gone afterwards. No NeMo Gym server is needed."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from relax_gym_r2e.sandbox import processes_of
from relax_gym_r2e.workspace import Host, Settings, Workspace, evaluate

from .conftest import UID_BASE, UID_COUNT

FORK_LIMIT = 32  # conftest.SMALL_LIMITS.processes


async def until(condition: Callable[[], bool], within_s: float = 60.0) -> None:
    """Poll a condition of the machine (bounded only against hangs: no duration is asserted)."""
    async with asyncio.timeout(within_s):
        while True:
            if condition():
                return
            await asyncio.sleep(0.01)


async def workspace_of(host: Host, name: str = "pager", key: str = "rollout-under-test") -> Workspace:
    return await Workspace.create(host, host.prepare(name), key)


def test_the_agent_sees_only_its_checkout_at_the_base_commit(make_host: Callable[..., Host]) -> None:
    host = make_host()

    async def scenario() -> list[str]:
        workspace = await workspace_of(host)
        answers = [
            await workspace.bash("id -u; git log --all --format=%H; git status --porcelain; ls -A /"),
            await workspace.bash(f"ls {host.root} /root 2>&1"),
            await workspace.view("pager/core.py", 8, 8),
        ]
        assert await workspace.destroy()
        return answers

    listing, host_paths, line = asyncio.run(scenario())
    uid, base, *rest = listing.splitlines()
    assert int(uid) >= 1000  # never root: the kernel would not enforce the process limit for root
    assert base == host.prepare("pager").built.base_commit  # the only commit: the fix is not reachable
    # A clean checkout (no status lines), then the sandbox's own root: nothing of the host but /usr.
    root = ["bin", "dev", "etc", "lib", "lib64", "opt", "proc", "sbin", "tmp", "usr", "workspace"]
    assert rest == [*root, "[exit code 0]"]
    assert "No such file or directory" in host_paths  # neither the state directory nor /root exist inside
    assert line.strip() == "8\t    return total // per_page"


def test_no_network_no_writes_outside_the_workspace_and_a_private_tmp(make_host: Callable[..., Host]) -> None:
    host = make_host()
    tmp_marker = Path("/tmp") / f"relax-gym-r2e-test-{os.getpid()}"
    outside = ["/planted", "/usr/bin/planted", "/opt/relax-gym/planted", "/dev/planted"]

    async def scenario() -> str:
        workspace = await workspace_of(host)
        answer = await workspace.bash(
            "python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 80), 2)' 2>&1 | tail -1\n"
            + "".join(f"touch {path} 2>&1\n" for path in outside)
            + f"echo hidden > {tmp_marker} && cat {tmp_marker}\n"
            + "echo kept > /workspace/repo/NOTES && echo written\n"
        )
        assert await workspace.destroy()
        return answer

    answer = asyncio.run(scenario())
    assert "Network is unreachable" in answer
    for path in outside:
        assert f"touch: cannot touch '{path}': Read-only file system" in answer
    assert "hidden" in answer and "written" in answer  # /tmp and the workspace are writable...
    assert not tmp_marker.exists() and not Path("/usr/bin/planted").exists()  # ...and /tmp is private


def test_an_endless_command_is_killed_with_everything_it_started(make_host: Callable[..., Host]) -> None:
    host = make_host()

    async def scenario() -> tuple[str, list[int], int]:
        workspace = await workspace_of(host)
        answer = await workspace.bash("sleep 300 & while :; do :; done", 1)
        left = processes_of(workspace.uid)
        timeouts = workspace.command_timeouts
        assert await workspace.destroy()
        return answer, left, timeouts

    answer, left, timeouts = asyncio.run(scenario())
    assert answer.endswith("[timed out after 1 s: the command and every process it started were killed]")
    assert left == [] and timeouts == 1


def test_a_bounded_fork_bomb_hits_the_process_limit(make_host: Callable[..., Host]) -> None:
    """At most 200 children (safe even if the limit failed); the limit stops it far earlier."""
    host = make_host()
    bomb = textwrap.dedent("""\
        import os, time
        started = failed = 0
        for _ in range(200):
            try:
                pid = os.fork()
            except OSError:
                failed += 1
                continue
            if pid == 0:
                time.sleep(120)
                os._exit(0)
            started += 1
        print("started", started, "failed", failed)
    """)

    async def scenario() -> tuple[str, list[int]]:
        workspace = await workspace_of(host)
        answer = await workspace.bash(f"python3 -c '{bomb}'", 60)
        left = processes_of(workspace.uid)  # the children die with the sandbox when the command ends
        assert await workspace.destroy()
        return answer, left

    answer, left = asyncio.run(scenario())
    words = answer.split()
    started, failed = int(words[words.index("started") + 1]), int(words[words.index("failed") + 1])
    assert started < FORK_LIMIT and failed == 200 - started
    assert left == []


def test_memory_file_size_and_output_are_bounded(make_host: Callable[..., Host]) -> None:
    host = make_host(max_output_bytes=2000)

    async def scenario() -> list[str]:
        workspace = await workspace_of(host)
        answers = [
            await workspace.bash("python3 -c 'bytearray(1 << 30)' 2>&1 | tail -1"),
            await workspace.bash("head -c 4000000 /dev/zero > big; echo rc=$?; stat -c %s big"),
            await workspace.bash("yes flood | head -c 3000000"),
        ]
        assert await workspace.destroy()
        return answers

    memory, file_size, flood = asyncio.run(scenario())
    assert "MemoryError" in memory
    assert "File size limit exceeded" in file_size and "1048576" in file_size
    assert "more bytes of output not shown]" in flood and len(flood) < 2500


def test_destroy_kills_a_running_command_and_removes_the_workspace(make_host: Callable[..., Host]) -> None:
    host = make_host()

    async def scenario() -> tuple[str, bool, list[int], bool]:
        workspace = await workspace_of(host)
        command = asyncio.ensure_future(workspace.bash("sleep 120", 200))
        await until(lambda: bool(processes_of(workspace.uid)) and workspace.running)
        proven = await workspace.destroy()
        answer = await command
        return answer, proven, processes_of(workspace.uid), workspace.directory.exists()

    answer, proven, left, exists = asyncio.run(scenario())
    assert proven and left == [] and not exists
    assert "[exit code" in answer  # the call returned (killed), it did not wait out its 200 s
    assert host.uids.in_use == set()  # the uid went back to the pool, proven empty


def test_str_replace_needs_exactly_one_occurrence_and_the_diff_has_it(make_host: Callable[..., Host]) -> None:
    host = make_host()

    async def scenario() -> tuple[list[str], bytes]:
        workspace = await workspace_of(host, "acl")
        answers = [
            await workspace.str_replace("acl/rules.py", "nowhere to be found", "x"),
            await workspace.str_replace("acl/rules.py", "    ", "  "),
            await workspace.str_replace("acl/rules.py", "user.is_admin and", "user.is_admin or"),
            await workspace.bash("python3 -c 'import acl' && echo imported"),  # no bytecode in the diff
        ]
        patch, _ = await workspace.diff()
        assert await workspace.destroy()
        return answers, patch

    (missing, ambiguous, done, imported), patch = asyncio.run(scenario())
    assert missing.startswith("Error: old_str does not occur")
    assert ambiguous.startswith("Error: old_str occurs") and "exactly once" in ambiguous
    assert done == "Replaced 1 occurrence in /workspace/repo/acl/rules.py."
    assert "imported" in imported
    assert b"+    return user.is_admin or document.owner == user.name" in patch
    assert b"__pycache__" not in patch and patch.count(b"diff --git") == 1


@pytest.mark.parametrize(
    ("which", "resolved", "applied", "f2p"),
    [("golden", True, True, (2, 2)), ("wrong", False, True, (1, 2)), ("garbage", False, False, (0, 2))],
)
def test_evaluation_applies_the_patch_to_a_fresh_checkout(
    make_host: Callable[..., Host], which: str, resolved: bool, applied: bool, f2p: tuple[int, int]
) -> None:
    host = make_host()
    built = host.prepare("tagger").built
    patch = {"golden": built.golden_patch, "wrong": built.wrong_patch, "garbage": "diff --git a/x b/x\nno\n"}
    outcome = asyncio.run(evaluate(host, host.prepare("tagger"), patch[which].encode()))
    assert (outcome.resolved, outcome.patch_exists, outcome.patch_applied) == (resolved, True, applied)
    assert outcome.fail_to_pass == f2p
    assert outcome.released and outcome.directory is not None and not outcome.directory.exists()
    assert host.uids.in_use == set()


def test_a_hanging_test_run_times_out_and_is_cleaned_up(make_host: Callable[..., Host]) -> None:
    host = make_host(tests_timeout_s=2)
    prepared = host.prepare("pager")
    hang = prepared.built.golden_patch.replace(
        "+    return (total + per_page - 1) // per_page", "+    while True: pass"
    )
    assert hang != prepared.built.golden_patch
    outcome = asyncio.run(evaluate(host, prepared, hang.encode()))
    assert outcome.timed_out and not outcome.resolved and outcome.patch_applied
    assert set(outcome.results.values()) <= {"missing", "failed"}
    assert outcome.released and outcome.uid is not None and processes_of(outcome.uid) == []


def argv0(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return b""


CHILD = """
import asyncio, sys
from pathlib import Path
from relax_gym_r2e.workspace import Host, Settings, Workspace

async def main():
    host = Host.create(uid_base=2_100_000, uid_count=65_536, settings=Settings(), bwrap=Path(sys.argv[1]))
    workspace = await Workspace.create(host, host.prepare("pager"), "orphan")
    print(workspace.uid, host.root, flush=True)
    await workspace.bash("sleep 300", 300)

asyncio.run(main())
"""


def test_the_sandbox_dies_with_the_server(bwrap: Path) -> None:
    """SIGKILL the process that started a sandbox: nothing of the sandbox survives it (--die-with-parent)."""
    with subprocess.Popen(
        [sys.executable, "-c", CHILD, str(bwrap)], stdout=subprocess.PIPE, text=True
    ) as server:
        assert server.stdout is not None
        uid_text, root = server.stdout.readline().split()
        uid = int(uid_text)
        try:
            # Until the command itself runs: bwrap's own start-up (before --die-with-parent takes hold
            # in the sandbox's init) is a window in which a killed parent leaves an orphan, which the
            # next holder of the uid block ends (UidPool.claim).
            while not any(argv0(pid) == b"sleep" for pid in processes_of(uid)):
                assert server.poll() is None
                time.sleep(0.01)
            server.send_signal(signal.SIGKILL)  # the process this test started, by PID
            server.wait(timeout=60)
            asyncio.run(until(lambda: not processes_of(uid)))
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
            shutil.rmtree(root, ignore_errors=True)  # the killed server could not remove its directory


def test_two_hosts_never_share_sandbox_uids(make_host: Callable[..., Host]) -> None:
    first, second = make_host(), make_host()  # e.g. `relax-gym up` and `relax-gym probe` side by side
    assert not first.uids.all_uids() & second.uids.all_uids()


def test_a_host_on_an_earlier_state_directory_removes_its_workspaces(bwrap: Path) -> None:
    state = Path(tempfile.mkdtemp(prefix="relax-gym-r2e-test-"))
    try:
        for leftover in (state / "rollouts" / "old", state / "evaluations" / "old"):
            leftover.mkdir(parents=True)
        host = Host.create(
            state_dir=str(state), uid_base=UID_BASE, uid_count=UID_COUNT, settings=Settings(), bwrap=bwrap
        )
        assert host.run_dirs() == []  # their sessions died with the server that made them
        asyncio.run(host.close())
        assert state.is_dir()  # a configured state directory is not ours to remove
    finally:
        shutil.rmtree(state)
