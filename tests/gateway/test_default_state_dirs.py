"""The default state directory is one per set of environments served: two gateways of different recipes
run side by side with no flag, a gateway for the same recipe finds (and is refused by) the running one's,
and a restarted gateway finds its ledger again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from relax_gym_core.testing.web import start_gateway
from relax_gym_core.trials import resolve_state_dir
from relax_gym_core.trials.statedir import state_dir_name


def specs(environment: str) -> dict[str, object]:
    return {f"{environment}-v1": {"environment": environment, "runtime": "echo"}}


def test_two_recipes_run_side_by_side_and_the_same_recipe_twice_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RELAX_GYM_STATE_DIR", raising=False)  # the suite's own default (tests/conftest.py)
    env = {"XDG_DATA_HOME": str(tmp_path / "data")}
    with (
        start_gateway(specs("gsm8k"), env=env, state_dir=None),
        start_gateway(specs("workplace_assistant"), env=env, state_dir=None),
    ):
        root = tmp_path / "data" / "relax-gym"
        assert sorted(path.name for path in root.iterdir()) == ["gsm8k", "workplace_assistant"]
        assert all((root / name / "ledger.sqlite3").is_file() for name in ("gsm8k", "workplace_assistant"))
        # A second gateway for a recipe already served wants the same directory: one clear line, exit 2.
        spec_file = tmp_path / "again.json"
        spec_file.write_text(json.dumps(specs("gsm8k")))
        clash = subprocess.run(
            [
                sys.executable,
                "-m",
                "relax_gym_core.cli",
                "serve",
                "--port",
                "0",
                "--environments",
                str(spec_file),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, **env, "NEMO_GYM_CALLBACK_ALLOWED_NETWORKS": "127.0.0.1/32"},
            check=False,
        )
    assert clash.returncode == 2
    assert f"state directory {root / 'gsm8k'} is in use by another relax-gym gateway" in clash.stderr
    assert "Traceback" not in clash.stderr


def test_the_default_is_the_sorted_set_of_environment_names(tmp_path: Path) -> None:
    environ = {"XDG_DATA_HOME": str(tmp_path)}
    both = resolve_state_dir(None, ["workplace_assistant", "math_with_judge"], environ)
    assert both == str(tmp_path / "relax-gym" / "math_with_judge+workplace_assistant")
    assert (
        resolve_state_dir(None, ["math_with_judge", "workplace_assistant", "math_with_judge"], environ)
        == both
    )
    # The flag, then the variable, win over the default.
    assert resolve_state_dir("/srv/ledger", ["gsm8k"], environ) == "/srv/ledger"
    assert resolve_state_dir(None, ["gsm8k"], {**environ, "RELAX_GYM_STATE_DIR": "/var/x"}) == "/var/x"
    home = resolve_state_dir(None, ["gsm8k"], {})
    assert home == str(Path.home() / ".local" / "share" / "relax-gym" / "gsm8k")


@pytest.mark.parametrize(
    "names",
    [[f"environment_{index:03d}" for index in range(40)], ["../../etc", "a/b", ""], [".."], []],
    ids=["a-catalogue", "path-characters", "dots", "none"],
)
def test_a_name_is_always_one_safe_path_component(names: list[str]) -> None:
    name = state_dir_name(names)
    assert 0 < len(name) <= 96
    assert "/" not in name and name not in {".", ".."}
    assert state_dir_name(list(reversed(names))) == name  # the order given does not matter
