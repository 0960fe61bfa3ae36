"""Files of the INSTALLED nemo-gym package (example rows, prompts), read in place, never copied.

A file is found through this interpreter when NeMo Gym is importable here (inside the NeMo Gym
environment), else by asking the NeMo Gym environment's python (gym_python()) where it is. Plugins use
this for the real rows their probes and tests are built from, and gym_python() to run something of their
own in that environment.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from relax_gym_core.errors import ConfigError, InstalledFileUnavailable

PYTHON_VAR = "RELAX_GYM_NEMO_GYM_PYTHON"  # relax_gym_core.gym.processes reads it (imported lazily: this
# module also runs inside the NeMo Gym environment, which has no relax-gym-core dependencies)

_LOCATE = (
    "import importlib.resources, sys\n"
    "sys.stdout.write(str(importlib.resources.files(sys.argv[1]).joinpath(sys.argv[2])))\n"
)


def _unavailable(what: str, reason: str) -> InstalledFileUnavailable:
    return InstalledFileUnavailable(
        f"{what} comes from the installed nemo-gym package, but {reason}. Install the NeMo Gym "
        f"environment with `make gym`, or `pip install nemo-gym==0.4.0` into an environment and set "
        f"{PYTHON_VAR} to its python"
    )


def local_path(package: str, relative: str) -> Path | None:
    """The file through this interpreter's own NeMo Gym, if it has one."""
    try:
        resource = importlib.resources.files(package).joinpath(relative)
    except ModuleNotFoundError:
        return None
    path = Path(str(resource))
    return path if path.is_file() else None


@functools.lru_cache(maxsize=32)
def path_via(python: str, package: str, relative: str) -> Path:
    """The file as the NeMo Gym environment's `python` locates it (one subprocess, then cached)."""
    what = f"{package}/{relative}"
    try:
        done = subprocess.run(  # noqa: S603 - the configured NeMo Gym interpreter, a fixed script
            [python, "-c", _LOCATE, package, relative],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise _unavailable(what, f"{python} could not be run ({exc})") from exc
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["no error output"]
        raise _unavailable(what, f"{python} cannot locate {package} ({tail[0]})")
    path = Path(done.stdout.strip())
    if not path.is_file():
        raise _unavailable(what, f"{python} reports {path}, which is not a file")
    return path


def gym_python(environ: Mapping[str, str] = os.environ) -> str:
    """The NeMo Gym environment's python ($RELAX_GYM_NEMO_GYM_PYTHON, else .gym/venv/bin/python), or a
    ConfigError naming what was tried and how to get one: relax_gym_core.gym.processes's rule."""
    from relax_gym_core.gym.processes import gym_python as find  # noqa: PLC0415 - see PYTHON_VAR

    return find(environ)


def installed_file(package: str, relative: str) -> Path:
    """Where `relative` (e.g. "data/example.jsonl") of the installed `package` is."""
    local = local_path(package, relative)
    if local is not None:
        return local
    try:
        python = gym_python()
    except ConfigError as exc:
        raise _unavailable(f"{package}/{relative}", str(exc)) from None
    return path_via(python, package, relative)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every row of a JSONL file (fresh objects on every call); a non-object row names file:line."""
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row, dict):
            raise InstalledFileUnavailable(f"{path}:{number}: a row must be a JSON object")
        rows.append(row)
    return rows


def example_rows(package: str, relative: str = "data/example.jsonl") -> list[dict[str, Any]]:
    """The rows an installed NeMo Gym server ships (upstream's example.jsonl by default)."""
    return read_jsonl(installed_file(package, relative))
