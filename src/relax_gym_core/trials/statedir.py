"""The state directory of one gateway: where its trial ledger lives, and what keeps it its own.

    <state dir>/            created 0700
      ledger.sqlite3        the trial ledger (+ -wal, -shm while open): trials/ledger.py
      fingerprint.key       0600: 32 random bytes keying replay fingerprints, so a create replayed after
                            a restart is compared with the recorded one (no token is derived from it)
      lock                  held (flock) by the gateway using the directory; holds its pid

`:memory:` keeps everything in memory (MemoryStore): nothing survives the process.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import secrets
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

from relax_gym_core.errors import ConfigError
from relax_gym_core.trials.events import Clock
from relax_gym_core.trials.ledger import LedgerStore
from relax_gym_core.trials.store import MemoryStore, TrialStore

logger = logging.getLogger("relax_gym.ledger")

STATE_DIR_VAR: Final = "RELAX_GYM_STATE_DIR"
MEMORY: Final = ":memory:"
LEDGER_FILE: Final = "ledger.sqlite3"
KEY_FILE: Final = "fingerprint.key"
LOCK_FILE: Final = "lock"
KEY_BYTES: Final = 32
_NAME_MAX: Final = 96  # well under any file system's name limit


def state_dir_name(environments: Iterable[str]) -> str:
    """The default directory's name for a gateway serving `environments`: their names, sorted, joined by
    "+" (``gsm8k``, ``math_with_judge+workplace_assistant``); long sets keep a prefix and a digest."""
    names = sorted({re.sub(r"[^A-Za-z0-9_-]", "_", name) for name in environments if name})
    joined = "+".join(names) or "default"
    if len(joined) <= _NAME_MAX:
        return joined
    digest = hashlib.sha256(joined.encode()).hexdigest()[:12]
    return f"{joined[: _NAME_MAX - 13]}-{digest}"


def default_state_dir(environments: Iterable[str] = (), environ: Mapping[str, str] = os.environ) -> Path:
    """$XDG_DATA_HOME/relax-gym/<environments>, else ~/.local/share/relax-gym/<environments>.

    One directory per set of environments served: a gateway per recipe runs beside another with no flag
    (as the reference runs one container per recipe), and a gateway restarted for the same recipe finds
    its ledger, so it can end and clean up what the last one left running. Two gateways for the same set
    need a directory each (the lock says so).
    """
    base = environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "relax-gym" / state_dir_name(environments)


def resolve_state_dir(
    flag: str | None, environments: Iterable[str] = (), environ: Mapping[str, str] = os.environ
) -> str:
    """--state-dir, else $RELAX_GYM_STATE_DIR, else the user's data directory for these environments."""
    return flag or environ.get(STATE_DIR_VAR) or str(default_state_dir(environments, environ))


class StateLock:
    """An exclusive flock on <dir>/lock for the life of the gateway (the kernel drops it if we die)."""

    def __init__(self, directory: Path) -> None:
        path = directory / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise ConfigError(
                f"state directory {directory} is in use by another relax-gym gateway (pid {holder}); "
                "give each gateway its own --state-dir (or $RELAX_GYM_STATE_DIR): by default a gateway "
                "takes one per set of environments served"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def fingerprint_key(directory: Path) -> bytes:
    """The directory's replay-fingerprint key, created (0600) on first use."""
    path = directory / KEY_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            logger.warning("%s was readable by others (mode %o); now 0600", path, mode)
            path.chmod(0o600)
        key = path.read_bytes()
        if len(key) != KEY_BYTES:
            raise ConfigError(f"{path}: not a relax-gym fingerprint key ({len(key)} bytes)") from None
        return key
    key = secrets.token_bytes(KEY_BYTES)
    try:
        os.write(fd, key)
        os.fsync(fd)
    finally:
        os.close(fd)
    return key


def open_store(state_dir: str, *, clock: Clock, tombstone_capacity: int = 100_000) -> TrialStore:
    """The store of a state directory: the SQLite ledger (lock taken, released by its close()), or a
    MemoryStore for `:memory:`. ConfigError names the directory when it cannot be used."""
    if state_dir == MEMORY:
        return MemoryStore(tombstone_capacity=tombstone_capacity)
    directory = Path(state_dir).expanduser()
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock = StateLock(directory)
    except OSError as exc:
        raise ConfigError(f"state directory {directory}: {exc.strerror or exc}") from None
    try:
        return LedgerStore(
            directory / LEDGER_FILE,
            clock=clock,
            tombstone_capacity=tombstone_capacity,
            fingerprint_key=fingerprint_key(directory),
            on_close=lock.release,
        )
    except OSError as exc:
        lock.release()
        raise ConfigError(f"state directory {directory}: {exc.strerror or exc}") from None
    except BaseException:
        with contextlib.suppress(OSError):
            lock.release()
        raise
