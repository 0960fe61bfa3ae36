"""One Claude Code trial on the host: its directories, its processes, and the proof that both are gone.

A trial lives in ``<root>/<rollout>.<random>/`` with ``config/`` (CLAUDE_CONFIG_DIR), ``workspace/`` (the
CLI's cwd and HOME), ``tmp/`` (TMPDIR) and ``sandbox/`` (the bwrap shell). Its processes are the CLI's
process group (the CLI is started in a new session) and every process carrying the rollout marker in its
environment (the CLI's children inherit it; the sandbox sets it again after --clearenv). Both are found
from the rollout id alone, by scanning /proc and the root, so cleanup is confirmed by checking, also for
a trial whose run this agent process no longer remembers.

Standard library (and relax_gym_core.ingym, which is too) only: it runs in the NeMo Gym environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from relax_gym_core.ingym.processes import alive

MARKER = "RELAX_GYM_CC_ROLLOUT"  # environment variable naming the rollout in every process of a trial
_SAFE = re.compile(r"[^A-Za-z0-9_-]")
_REAP_WAIT_S = 10.0  # SIGKILLed processes are gone in milliseconds; this is a bound, not a pause


def dir_prefix(rollout_id: str) -> str:
    """The directory-name prefix of a rollout's trials (file-name safe, unambiguous with the suffix)."""
    return _SAFE.sub(lambda m: f"%{ord(m.group()):02x}", rollout_id) + "."


@dataclass(frozen=True)
class TrialDirs:
    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config"

    @property
    def workspace(self) -> Path:
        return self.root / "workspace"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def sandbox(self) -> Path:
        return self.root / "sandbox"

    @property
    def snapshots(self) -> Path:
        return self.config / "shell-snapshots"

    @classmethod
    def create(cls, trials_root: Path, rollout_id: str) -> TrialDirs:
        trials_root.mkdir(mode=0o700, parents=True, exist_ok=True)
        root = trials_root / f"{dir_prefix(rollout_id)}{secrets.token_hex(4)}"
        root.mkdir(mode=0o700)
        dirs = cls(root)
        for path in (dirs.config, dirs.workspace, dirs.tmp, dirs.snapshots):
            path.mkdir(mode=0o700)
        return dirs


def directories_of(trials_root: Path, rollout_id: str) -> list[Path]:
    prefix = dir_prefix(rollout_id)
    try:
        return [entry for entry in trials_root.iterdir() if entry.name.startswith(prefix)]
    except FileNotFoundError:
        return []


def remove_directories(trials_root: Path, rollout_id: str) -> bool:
    """Remove every directory of the rollout; True when none is left (checked)."""
    for path in directories_of(trials_root, rollout_id):
        shutil.rmtree(path, ignore_errors=True)
    return not directories_of(trials_root, rollout_id)


# ---- processes ---------------------------------------------------------------------------------------------


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _marked(pid: int, marker: bytes) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone, or not ours (then it is no process of our trials either)
        return False
    return environ.startswith(marker) or b"\0" + marker in environ


def marker_bytes(rollout_id: str) -> bytes:
    return f"{MARKER}={rollout_id}\0".encode()


def processes_of(rollout_id: str, pgids: frozenset[int] = frozenset()) -> list[int]:
    """Live processes of the rollout: members of its process groups, or carrying its marker."""
    marker = marker_bytes(rollout_id)
    me = os.getpid()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        if ((pgids and _pgid(pid) in pgids) or _marked(pid, marker)) and alive(pid):
            found.append(pid)
    return found


def kill_group(pgid: int) -> None:
    """SIGKILL a process group; only while its leader is not yet reaped (then the id cannot be reused)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _kill(pid: int, rollout_id: str, pgids: frozenset[int]) -> None:
    """SIGKILL `pid` if it is still a process of the rollout (re-checked through a pidfd, so a recycled
    pid is never signalled)."""
    try:
        handle = os.pidfd_open(pid)
    except OSError:
        return
    try:
        if _pgid(pid) in pgids or _marked(pid, marker_bytes(rollout_id)):
            signal.pidfd_send_signal(handle, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    finally:
        os.close(handle)


async def reap(
    rollout_id: str, pgids: frozenset[int] = frozenset(), *, within_s: float = _REAP_WAIT_S
) -> bool:
    """Kill the rollout's processes (its groups' members, its marked processes), one by one through a
    pidfd, until none is left; True when none is (checked, not assumed)."""
    stop = time.monotonic() + within_s
    delay = 0.005
    while True:
        left = processes_of(rollout_id, pgids)
        if not left:
            return True
        for pid in left:
            _kill(pid, rollout_id, pgids)
        if time.monotonic() > stop:
            return False
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.1)
