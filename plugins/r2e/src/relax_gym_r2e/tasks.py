"""The bundled R2E-style tasks: tiny git repositories at their pre-fix commit, hidden tests, a golden patch.

Each ``tasks/<name>.toml`` (package data, written for this project) holds the repository's files before
the fix, the files the fix changes (the golden patch is their diff), a plausible patch that applies but
does not fix the bug, the hidden tests (``r2e_tests/...``, never in the agent's repository) and the test
ids that decide ``resolved`` (FAIL_TO_PASS, PASS_TO_PASS), as R2E-Gym instances have them.

``build()`` makes the repository with git under fixed names and dates, so the base and fix commits (and
so the instance ids ``relaxgym__<name>-<fix commit>``) are the same on every machine: rows computed by the
gateway side name exactly the commits the resources server builds. Standard library only: this module is
used in both environments (gateway and NeMo Gym).
"""

from __future__ import annotations

import functools
import importlib.resources
import os
import re
import shutil
import subprocess
import tempfile
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

OWNER = "relaxgym"  # the docker-image owner of the bundled tasks' (never built) images
DATASET_NAME = "relax-gym/r2e-bundled"
SPLIT = "bundled"
HIDDEN_DIR = "r2e_tests"
# No "-": swe_agents finds an R2E image from the instance id by the repo part up to the first "-".
_NAME = re.compile(r"[a-z][a-z0-9_]*")
_TEST_ID = re.compile(r"(?P<file>[\w/.]+\.py)::(?P<name>[A-Za-z_]\w*)")
_GIT_DATE = "2024-01-01T00:00:00+0000"
_GIT_TIMEOUT_S = 60


class TaskError(ValueError):
    """A bundled task file is inconsistent (names the file and the field)."""


@dataclass(frozen=True)
class Task:
    name: str
    bug_kind: str
    problem_statement: str
    files: Mapping[str, str]  # the repository at its pre-fix commit
    fix: Mapping[str, str]  # changed files after the fix
    wrong_fix: Mapping[str, str]  # changed files after a patch that applies but fails the tests
    hidden_tests: Mapping[str, str]
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]

    @property
    def repo_name(self) -> str:
        return self.name

    @property
    def tests(self) -> tuple[str, ...]:
        return self.fail_to_pass + self.pass_to_pass


@dataclass(frozen=True)
class Built:
    """A task with the commits git made of it and the patches relative to its base commit."""

    task: Task
    base_commit: str
    fix_commit: str
    golden_patch: str
    wrong_patch: str

    @property
    def docker_image(self) -> str:
        return f"{OWNER}/{self.task.name}_final:{self.fix_commit}"

    @property
    def instance_id(self) -> str:
        return f"{OWNER}__{self.task.name}-{self.fix_commit}"


# ---- loading ---------------------------------------------------------------------------------------------


def _text_table(where: str, data: dict[str, Any], key: str, *, required: bool = True) -> dict[str, str]:
    table = data.get(key)
    if table is None and not required:
        return {}
    if not isinstance(table, dict) or not table:
        raise TaskError(f"{where}: [{key}] must be a non-empty table of path = file contents")
    files: dict[str, str] = {}
    for path, content in table.items():
        pure = PurePosixPath(path)
        if pure.is_absolute() or ".." in pure.parts or not pure.parts or path != str(pure):
            raise TaskError(f"{where}: [{key}] path {path!r} must be a plain relative path")
        if pure.parts[0] == ".git":
            raise TaskError(f"{where}: [{key}] path {path!r} is inside .git")
        if not isinstance(content, str):
            raise TaskError(f"{where}: [{key}].{path!r} must be a string")
        files[path] = content if content.endswith("\n") else content + "\n"
    return files


def _test_ids(where: str, data: dict[str, Any], key: str, hidden: Mapping[str, str]) -> tuple[str, ...]:
    ids = data.get(key)
    if not isinstance(ids, list) or not all(isinstance(item, str) for item in ids):
        raise TaskError(f"{where}: {key} must be a list of test ids 'r2e_tests/FILE.py::test_name'")
    for test_id in ids:
        match = _TEST_ID.fullmatch(test_id)
        if match is None or match["file"] not in hidden:
            raise TaskError(f"{where}: {key} names {test_id!r}, which is not a test of [hidden_tests]")
    return tuple(ids)


def parse_task(where: str, data: dict[str, Any]) -> Task:
    name = data.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise TaskError(f"{where}: name must be lower-case letters, digits and '_' (got {name!r})")
    for key in ("bug_kind", "problem_statement"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise TaskError(f"{where}: {key} must be a non-empty string")
    files = _text_table(where, data, "files")
    hidden = _text_table(where, data, "hidden_tests")
    for path in hidden:
        if PurePosixPath(path).parts[0] != HIDDEN_DIR:
            raise TaskError(f"{where}: [hidden_tests] path {path!r} must be under {HIDDEN_DIR}/")
    if any(PurePosixPath(path).parts[0] == HIDDEN_DIR for path in files):
        raise TaskError(f"{where}: [files] must not contain {HIDDEN_DIR}/ (the tests are hidden)")
    fail_to_pass = _test_ids(where, data, "fail_to_pass", hidden)
    if not fail_to_pass:
        raise TaskError(f"{where}: fail_to_pass must name at least one test the fix makes pass")
    task = Task(
        name=name,
        bug_kind=data["bug_kind"].strip(),
        problem_statement=data["problem_statement"].strip(),
        files=files,
        fix=_text_table(where, data, "fix"),
        wrong_fix=_text_table(where, data, "wrong_fix"),
        hidden_tests=hidden,
        fail_to_pass=fail_to_pass,
        pass_to_pass=_test_ids(where, data, "pass_to_pass", hidden),
    )
    for key, changed in (("fix", task.fix), ("wrong_fix", task.wrong_fix)):
        if all(files.get(path) == content for path, content in changed.items()):
            raise TaskError(f"{where}: [{key}] changes nothing")
    return task


@functools.cache
def load_tasks() -> dict[str, Task]:
    """Every bundled task by name (= repo_name), read from the package's tasks/*.toml."""
    tasks: dict[str, Task] = {}
    folder = importlib.resources.files(__package__ or "relax_gym_r2e").joinpath("tasks")
    for entry in sorted(folder.iterdir(), key=lambda item: item.name):
        if not entry.name.endswith(".toml"):
            continue
        where = f"tasks/{entry.name}"
        try:
            data = tomllib.loads(entry.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise TaskError(f"{where}: not valid TOML ({exc})") from None
        task = parse_task(where, data)
        if task.name in tasks:
            raise TaskError(f"{where}: task name {task.name!r} is used twice")
        tasks[task.name] = task
    if not tasks:
        raise TaskError("no bundled tasks found (tasks/*.toml is missing from the package)")
    return tasks


# ---- building ----------------------------------------------------------------------------------------------


def git_binary() -> str:
    found = shutil.which("git") or ("/usr/bin/git" if Path("/usr/bin/git").is_file() else None)
    if found is None:
        raise TaskError("git is not installed: the r2e_gym tasks are git repositories (apt-get install git)")
    return found


def _git(work: Path, home: Path, *args: str) -> str:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LC_ALL": "C",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        # Fixed identities and dates: the same files give the same commits everywhere.
        "GIT_AUTHOR_NAME": "relax-gym",
        "GIT_AUTHOR_EMAIL": "r2e@relax-gym.invalid",
        "GIT_AUTHOR_DATE": _GIT_DATE,
        "GIT_COMMITTER_NAME": "relax-gym",
        "GIT_COMMITTER_EMAIL": "r2e@relax-gym.invalid",
        "GIT_COMMITTER_DATE": _GIT_DATE,
    }
    done = subprocess.run(  # noqa: S603 - git with fixed arguments on our own files
        [git_binary(), "-c", "core.autocrlf=false", "-c", "commit.gpgsign=false", *args],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=_GIT_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise TaskError(f"git {' '.join(args[:2])} failed in {work}: {done.stderr.strip()[-500:]}")
    return done.stdout


def _write(root: Path, files: Mapping[str, str]) -> None:
    for path, content in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        target.chmod(0o644)


def _staged_diff(work: Path, home: Path) -> str:
    _git(work, home, "add", "-A")
    return _git(work, home, "diff", "--cached", "--binary", "--no-color", "--no-ext-diff")


def build(task: Task, *, source_repo: Path | None = None) -> Built:
    """Commit the task's files (the base), diff the wrong fix and the fix against it, commit the fix.

    With `source_repo`, also write there a bare repository holding ONLY the base commit (what agents
    clone: the fix commit must not be reachable from their checkout).
    """
    with tempfile.TemporaryDirectory(prefix="relax-gym-r2e-task-") as scratch:
        work, home = Path(scratch) / "repo", Path(scratch) / "home"
        work.mkdir()
        home.mkdir()
        _git(work, home, "init", "-q", "-b", "main")
        _write(work, task.files)
        _git(work, home, "add", "-A")
        _git(work, home, "commit", "-q", "-m", f"{task.name}: the code before the fix")
        base = _git(work, home, "rev-parse", "HEAD").strip()
        if source_repo is not None:
            _git(work, home, "clone", "-q", "--bare", "--no-local", str(work), str(source_repo))
        _write(work, task.wrong_fix)
        wrong = _staged_diff(work, home)
        _git(work, home, "reset", "-q", "--hard", base)
        _git(work, home, "clean", "-q", "-fdx")
        _write(work, task.fix)
        golden = _staged_diff(work, home)
        _git(work, home, "commit", "-q", "-m", f"{task.name}: fix the {task.bug_kind} bug")
        fix = _git(work, home, "rev-parse", "HEAD").strip()
    return Built(task=task, base_commit=base, fix_commit=fix, golden_patch=golden, wrong_patch=wrong)


@functools.cache
def built_tasks() -> dict[str, Built]:
    """Every bundled task built once per process (commits and patches; no repository is kept)."""
    return {name: build(task) for name, task in load_tasks().items()}


def write_hidden_tests(task: Task, destination: Path) -> None:
    """The hidden tests as files under `destination` (which then holds r2e_tests/...)."""
    _write(destination, task.hidden_tests)
