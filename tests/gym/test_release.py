"""Which NeMo Gym the servers run, and --nemo-gym-observability: both branches of the installed version.

The wheel branch is the real NeMo Gym 0.4.0 of .gym/venv. The source-tree branch (NeMo Gym >= 0.5 from a
checkout, as the Relax image has it at /opt/nemo-gym) is an installation laid out as an editable install
leaves it: a dist-info whose direct_url.json names the tree, a git checkout, a global config that names
observability_enabled. The real pinned commit is checked outside CI (README: verified NeMo Gym versions).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from relax_gym_core.errors import ConfigError
from relax_gym_core.gym.config import merged_config
from relax_gym_core.gym.processes import gym_python
from relax_gym_core.gym.release import (
    NemoGymRelease,
    nemo_gym_release,
    observability_config,
    observability_wanted,
)


def source_tree_python(tmp_path: Path, *, observability: bool) -> tuple[str, str]:
    """An interpreter that sees a NeMo Gym 0.5.0rc0 installed editable from a git checkout; its commit."""
    tree = tmp_path / "nemo-gym"
    (tree / "nemo_gym").mkdir(parents=True)
    (tree / "nemo_gym" / "__init__.py").write_text('__version__ = "0.5.0rc0"\n')
    key = 'OBSERVABILITY_ENABLED_KEY_NAME = "observability_enabled"\n' if observability else ""
    (tree / "nemo_gym" / "global_config.py").write_text(key)
    git = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@localhost"}
    git |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@localhost"}
    for command in (["init", "-q"], ["add", "."], ["commit", "-qm", "pin"]):
        subprocess.run(["git", "-C", str(tree), *command], check=True, env=git)
    commit = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    site = tmp_path / "site"
    info = site / "nemo_gym-0.5.0rc0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nemo-gym\nVersion: 0.5.0rc0\n")
    (info / "direct_url.json").write_text(json.dumps({"url": tree.as_uri(), "dir_info": {"editable": True}}))
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{site}:{tree}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return str(python), commit


def installed() -> NemoGymRelease:
    release = nemo_gym_release(gym_python())
    if release.source != "index":
        pytest.skip(f"the NeMo Gym environment is {release.describe()}, not the PyPI wheel CI runs")
    return release


def test_the_pypi_wheel_is_0_4_0_without_observability() -> None:
    release = installed()
    assert release == NemoGymRelease(version="0.4.0", source="index", commit=None, observability=False)
    with pytest.raises(ConfigError, match="has no observability"):
        observability_config(release, "python")


def test_a_source_tree_names_its_path_its_commit_and_observability(tmp_path: Path) -> None:
    python, commit = source_tree_python(tmp_path, observability=True)
    release = nemo_gym_release(python)
    assert release == NemoGymRelease(
        version="0.5.0rc0", source=(tmp_path / "nemo-gym").as_uri(), commit=commit, observability=True
    )
    assert observability_config(release, python) == {"observability_enabled": True}
    assert commit in release.describe() and "has observability" in release.describe()


def test_a_tree_without_the_key_has_no_observability(tmp_path: Path) -> None:
    python, _commit = source_tree_python(tmp_path, observability=False)
    assert nemo_gym_release(python).observability is False


def test_no_nemo_gym_is_one_line_naming_the_interpreter() -> None:
    with pytest.raises(ConfigError) as info:
        nemo_gym_release(sys.executable)  # the project's venv: no nemo-gym installed here
    assert sys.executable in str(info.value) and "make gym" in str(info.value)


@pytest.mark.parametrize(
    ("flag", "value", "wanted"),
    [(True, "", True), (False, "", False), (False, "1", True), (False, "true", True), (False, "0", False)],
)
def test_the_flag_or_the_variable_turns_it_on(flag: bool, value: str, wanted: bool) -> None:
    assert observability_wanted(flag, {"RELAX_GYM_NEMO_GYM_OBSERVABILITY": value}) is wanted


def test_a_bad_variable_value_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="RELAX_GYM_NEMO_GYM_OBSERVABILITY must be 1 or 0"):
        observability_wanted(False, {"RELAX_GYM_NEMO_GYM_OBSERVABILITY": "maybe"})


def test_the_key_is_a_top_level_key_of_the_merged_config() -> None:
    config = merged_config(
        [],
        host="127.0.0.1",
        ports={},
        gateway_host="127.0.0.1",
        gateway_port=9,
        global_config={"observability_enabled": True},
    )
    assert config["observability_enabled"] is True  # where nemo_gym.global_config reads it
    assert "observability_enabled" not in merged_config(
        [], host="h", ports={}, gateway_host="h", gateway_port=9
    )


@pytest.mark.parametrize(
    ("args", "env"),
    [(("--nemo-gym-observability",), {}), ((), {"RELAX_GYM_NEMO_GYM_OBSERVABILITY": "1"})],
    ids=["flag", "variable"],
)
def test_up_refuses_observability_on_0_4_0_before_any_server_starts(
    args: tuple[str, ...], env: dict[str, str]
) -> None:
    installed()
    command = [sys.executable, "-m", "relax_gym_core.cli", "up", "calendar", "--port", "0", *args]
    result = subprocess.run(
        [*command, "--callback-network", "127.0.0.1/32", "--state-dir", ":memory:"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
        check=False,
    )
    assert result.returncode == 2
    assert "--nemo-gym-observability: NeMo Gym 0.4.0 (PyPI/index wheel; no observability)" in result.stderr
    assert "starting NeMo Gym servers" not in result.stderr and "Traceback" not in result.stderr


def test_relax_gym_plugins_says_which_nemo_gym_the_servers_run() -> None:
    python = gym_python()
    release = nemo_gym_release(python)
    cli = [sys.executable, "-m", "relax_gym_core.cli", "plugins"]
    table = subprocess.run(cli, capture_output=True, text=True, timeout=120, check=True).stdout
    assert table.splitlines()[-1] == f"Servers run {release.describe()} at {python}"
    document = json.loads(
        subprocess.run([*cli, "--json"], capture_output=True, text=True, timeout=120, check=True).stdout
    )
    assert document["nemo_gym"] == {"python": python, **release.to_json()}
    missing = subprocess.run(
        cli,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={**os.environ, "RELAX_GYM_NEMO_GYM_PYTHON": "/nonexistent/python"},
    ).stdout
    assert missing.splitlines()[-1].startswith("NeMo Gym: none (NeMo Gym environment not found")
