"""`relax-gym probe`: every verifier probe of an environment scored by its REAL resources server (started in
the NeMo Gym environment), mismatches and broken probes reported, exit codes that scripts can trust.

The CLI starts its own server here once (that is what it is for); the scoring and the report are checked
against the session's shared workplace verifier, as are the other plugins' `probe --verifier-url` runs."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest

from relax_gym_core.commands.probe import format_outcomes
from relax_gym_core.gym.probe import score
from relax_gym_core.plugin import VerifierProbe
from relax_gym_core.plugin.host import make_plugin_manager
from relax_gym_core.testing.gym import Verifier

pytest.importorskip("relax_gym_workplace")

pytestmark = [pytest.mark.e2e, pytest.mark.nemo_gym("workplace_assistant")]

ENV = "workplace_assistant"
CLI = [str(Path(sys.executable).with_name("relax-gym"))]
SAFETY_S = 300  # guards against hangs only


@pytest.mark.slow  # starts its own resources server
def test_the_cli_scores_every_workplace_probe_as_expected() -> None:
    result = subprocess.run(
        [*CLI, "probe", ENV, "--json"], capture_output=True, text=True, timeout=SAFETY_S, check=False
    )
    assert result.returncode == 0, result.stderr
    outcomes = json.loads(result.stdout)
    assert len(outcomes) == 25
    assert all(outcome["ok"] and outcome["reward"] == outcome["expected"] for outcome in outcomes)


def test_mismatches_and_rejected_probes_are_reported(relax_gym_verifier: Callable[..., Verifier]) -> None:
    honest = list(make_plugin_manager().environments.get(ENV).verifier_probes())
    # Probes that lie: the first claims 0.0 (it scores 1.0), the last has a row the verifier rejects.
    flipped = attrs.evolve(honest[0], name="flipped", expected_reward=0.0)
    broken = VerifierProbe(name="broken", row={"no": "params"}, output=(), expected_reward=1.0)
    verifier = relax_gym_verifier(ENV)
    outcomes = [score(probe, verifier.post) for probe in [flipped, *honest[1:3], broken]]
    assert [(o.name, o.ok) for o in outcomes] == [
        ("flipped", False),
        (honest[1].name, True),
        (honest[2].name, True),
        ("broken", False),
    ]
    assert (outcomes[0].reward, outcomes[0].error) == (1.0, None)  # the real verifier's answer, kept
    assert outcomes[3].reward is None and outcomes[3].error is not None
    assert outcomes[3].error.startswith("/verify answered HTTP 4")
    report = format_outcomes(ENV, outcomes)
    assert "MISMATCH" in report and "2/4 probes scored as expected" in report


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["probe", "no_such_env"], "no installed plugin provides environment 'no_such_env'"),
        (["probe", ENV, "--verifier-url", "ftp://127.0.0.1:1"], "--verifier-url 'ftp://127.0.0.1:1' must be"),
        (["probe", ENV, "--verifier-url", "http://127.0.0.1:1"], "no server answers at --verifier-url"),
    ],
)
def test_bad_input_is_one_clear_line(args: list[str], message: str) -> None:
    result = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=SAFETY_S, check=False)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
