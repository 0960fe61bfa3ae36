"""The distributions install the way users install them: core + one plugin in a fresh venv."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def uv() -> str:
    found = os.environ.get("RELAX_GYM_UV") or shutil.which("uv") or str(ROOT / ".tools/bin/uv")
    if not Path(found).is_file():
        pytest.fail("uv not found: run the tests through `make test`")
    return found


def test_core_plus_workplace_lists_exactly_workplace(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "VIRTUAL_ENV": str(venv)}
    env.pop("UV_PROJECT_ENVIRONMENT", None)
    interpreter = Path(sys.executable).resolve()  # the 3.12 interpreter behind this test run
    subprocess.run([uv(), "venv", "--quiet", "--python", str(interpreter), str(venv)], check=True, env=env)
    packages = [str(ROOT), str(ROOT / "plugins/workplace")]
    subprocess.run(
        [uv(), "pip", "install", "--quiet", "--python", str(venv / "bin/python"), *packages],
        check=True,
        env=env,
        timeout=600,
    )
    result = subprocess.run(
        [str(venv / "bin/relax-gym"), "plugins", "--json"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    document = json.loads(result.stdout)
    assert [plugin["distribution"] for plugin in document["plugins"]] == ["relax-gym-workplace"]
    environments = [env["name"] for plugin in document["plugins"] for env in plugin["environments"]]
    assert environments == ["workplace_assistant"]
    # Only the light core was installed: no web server came along.
    missing = subprocess.run(
        [str(venv / "bin/python"), "-c", "import starlette"], capture_output=True, check=False
    )
    assert missing.returncode != 0
