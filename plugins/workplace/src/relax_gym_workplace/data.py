"""The upstream example rows, read from the INSTALLED nemo-gym package (never copied into this repo).

``resources_servers/workplace_assistant/data/example.jsonl`` holds 5 rows without a trailing newline
(``wc -l`` says 4). Found in this interpreter when NeMo Gym is importable here, else by asking the NeMo
Gym environment's python ($RELAX_GYM_NEMO_GYM_PYTHON, else ``.gym/venv/bin/python`` under the working
directory or a parent of this checkout) where the file is.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import os
import subprocess
from pathlib import Path
from typing import Any

PACKAGE = "resources_servers.workplace_assistant"
EXAMPLE_FILE = "data/example.jsonl"
PYTHON_VAR = "RELAX_GYM_NEMO_GYM_PYTHON"
_GYM_PYTHON = Path(".gym/venv/bin/python")
_LOCATE = (
    "import importlib.resources, sys\n"
    "sys.stdout.write(str(importlib.resources.files(sys.argv[1]).joinpath(sys.argv[2])))\n"
)


class ExampleRowsUnavailable(RuntimeError):
    """NeMo Gym (with its workplace_assistant data) is not installed where we can reach it."""


def _unavailable(reason: str) -> ExampleRowsUnavailable:
    return ExampleRowsUnavailable(
        f"the workplace_assistant example rows come from the installed nemo-gym package, but {reason}. "
        f"Install the NeMo Gym environment with `make gym`, or `pip install nemo-gym==0.4.0` into an "
        f"environment and set {PYTHON_VAR} to its python"
    )


def _local_path() -> Path | None:
    """The file through this interpreter's own NeMo Gym, if it has one."""
    try:
        resource = importlib.resources.files(PACKAGE).joinpath(EXAMPLE_FILE)
    except ModuleNotFoundError:
        return None
    path = Path(str(resource))
    return path if path.is_file() else None


def _gym_python() -> Path:
    configured = os.environ.get(PYTHON_VAR)
    if configured:  # an explicit choice is used or reported, never second-guessed
        if not Path(configured).is_file():
            raise _unavailable(f"{PYTHON_VAR}={configured} is not a file")
        return Path(configured)
    here = Path(__file__).resolve()
    for base in (Path.cwd(), *here.parents):
        if (base / _GYM_PYTHON).is_file():
            return base / _GYM_PYTHON
    raise _unavailable(
        f"`resources_servers` is not importable here, {PYTHON_VAR} is unset and no {_GYM_PYTHON} was found"
    )


@functools.lru_cache(maxsize=8)
def _path_via(python: str) -> Path:
    try:
        done = subprocess.run(  # noqa: S603 - the configured NeMo Gym interpreter, a fixed script
            [python, "-c", _LOCATE, PACKAGE, EXAMPLE_FILE],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise _unavailable(f"{python} could not be run ({exc})") from exc
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["no error output"]
        raise _unavailable(f"{python} cannot locate {PACKAGE} ({tail[0]})")
    path = Path(done.stdout.strip())
    if not path.is_file():
        raise _unavailable(f"{python} reports {path}, which is not a file")
    return path


def example_path() -> Path:
    """Where the installed example.jsonl is."""
    return _local_path() or _path_via(str(_gym_python()))


def example_rows() -> list[dict[str, Any]]:
    """The 5 upstream example rows, raw (fresh objects on every call)."""
    path = example_path()
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row, dict):
            raise TypeError(f"{path}:{number}: a row must be a JSON object")
        rows.append(row)
    return rows
