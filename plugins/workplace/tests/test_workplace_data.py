"""example_rows(): upstream's example rows read from the installed nemo-gym, never from this repository."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from relax_gym_core.errors import InstalledFileUnavailable
from relax_gym_core.gym import installed
from relax_gym_core.gym.processes import PYTHON_VAR, gym_python

from relax_gym_workplace import plugin

GYM_PYTHON = os.environ.get("RELAX_GYM_NEMO_GYM_PYTHON", "")


def test_the_five_rows_of_the_installed_file_are_read() -> None:
    path = plugin.example_path()
    assert path.parts[-4:] == ("resources_servers", "workplace_assistant", "data", "example.jsonl")
    assert Path(plugin.__file__).resolve().parents[2] not in path.parents  # not a copy in the plugin
    text = path.read_text(encoding="utf-8")
    assert text.count("\n") == 4  # 5 rows, no trailing newline: counting lines would lose one
    rows = plugin.example_rows()
    assert [row["id"] for row in rows] == [0, 1, 2, 3, 4]
    assert all(isinstance(row["ground_truth"], list) for row in rows)
    assert rows[0]["ground_truth"][0]["name"] == "email_reply_email"
    rows[0]["id"] = 99
    assert plugin.example_rows()[0]["id"] == 0  # fresh objects every call


def test_this_interpreter_asks_the_nemo_gym_environment() -> None:
    if importlib.util.find_spec("resources_servers") is not None:
        pytest.skip("NeMo Gym is importable here; the subprocess path is not used")
    assert installed.local_path(plugin.PACKAGE, plugin.EXAMPLE_FILE) is None
    assert plugin.example_path() == installed.path_via(gym_python(), plugin.PACKAGE, plugin.EXAMPLE_FILE)


def test_inside_the_nemo_gym_environment_the_package_is_read_directly() -> None:
    if not Path(GYM_PYTHON).is_file():
        pytest.skip("RELAX_GYM_NEMO_GYM_PYTHON is not set (make test sets it)")
    # relax_gym_workplace.plugin does not import there (no cattrs): the same lookup, by its package and file.
    script = (
        "import json, sys\n"
        "from relax_gym_core.gym import installed\n"
        "local = installed.local_path(sys.argv[1], sys.argv[2])\n"
        "print(json.dumps([str(local), len(installed.example_rows(sys.argv[1], sys.argv[2]))]))\n"
    )
    command = [GYM_PYTHON, "-c", script, plugin.PACKAGE, plugin.EXAMPLE_FILE]
    done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=120)
    local, count = json.loads(done.stdout)
    assert local.endswith("resources_servers/workplace_assistant/data/example.jsonl")
    assert count == 5


def test_a_missing_environment_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    if importlib.util.find_spec("resources_servers") is not None:
        pytest.skip("NeMo Gym is importable here")
    monkeypatch.setenv(PYTHON_VAR, str(tmp_path / "no-python"))
    with pytest.raises(InstalledFileUnavailable) as caught:
        plugin.example_rows()
    message = str(caught.value)
    assert "make gym" in message
    assert "pip install nemo-gym==0.4.0" in message
    assert PYTHON_VAR in message


def test_a_python_without_nemo_gym_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec("resources_servers") is not None:
        pytest.skip("NeMo Gym is importable here")
    monkeypatch.setenv(PYTHON_VAR, sys.executable)
    with pytest.raises(InstalledFileUnavailable, match="cannot locate resources_servers"):
        plugin.example_rows()
