"""Every catalogued environment proven the way `relax-gym probe` proves it: NeMo Gym's recorded rollouts
replayed through the real agent loop (real upstream servers, the tool outputs and observations live) give
the recorded rewards; what cannot be replayed here is skipped with its reason, never counted as passing.

The environments start in a few server sets (the fork server makes each server cheap to start), not one
each. code_gen is proven by hand (README): it runs its tests as Ray tasks, so its server starts a private
Ray cluster whose daemons outlive it by a minute, strays on a shared test machine.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from relax_gym_core.gym.probe import probe_environments
from relax_gym_core.testing import make_plugin_manager

from relax_gym_catalogue.catalogue import ENTRIES, Entry
from relax_gym_catalogue.upstream import installed

pytestmark = pytest.mark.e2e

BY_HAND = {"code_gen"}
PROVEN = [entry for entry in ENTRIES if entry.name not in BY_HAND]
BATCHES = [PROVEN[index::4] for index in range(4)]
SAFETY_S = 600


@pytest.mark.parametrize("batch", BATCHES, ids=[f"set{index}" for index in range(len(BATCHES))])
def test_replayed_recordings_score_as_recorded(batch: list[Entry]) -> None:
    batch = [entry for entry in batch if installed(entry.name)]  # CI's 0.4.0 lacks later releases' servers
    results = probe_environments(make_plugin_manager(), [entry.name for entry in batch])
    for entry in batch:
        outcomes = results[entry.name]
        assert len(outcomes) == 5, entry.name  # upstream ships five recordings of each
        for outcome in outcomes:
            where = f"{entry.name}/{outcome.name}"
            if entry.skip is not None:  # the table's reason, or the recording's own (no reward recorded)
                assert outcome.skipped is not None and outcome.reward is None, where
            else:
                assert outcome.skipped is None, where
                assert outcome.ok, (
                    f"{where}: expected {outcome.expected}, got {outcome.reward} ({outcome.error})"
                )


def test_the_command_names_skips_and_fails_an_environment_it_cannot_prove() -> None:
    """blackjack: five recordings, none replayable here (nothing starts): skipped by name, not a pass."""
    done = subprocess.run(
        [sys.executable, "-m", "relax_gym_core.cli", "probe", "blackjack", "--json"],
        capture_output=True,
        text=True,
        timeout=SAFETY_S,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    outcomes = json.loads(done.stdout)
    assert [o["skipped"] for o in outcomes] == ["its dealer draws from an unseeded random generator"] * 5
    assert not any(o["ok"] for o in outcomes) and {o["environment"] for o in outcomes} == {"blackjack"}
    table = subprocess.run(
        [sys.executable, "-m", "relax_gym_core.cli", "probe", "blackjack"],
        capture_output=True,
        text=True,
        timeout=SAFETY_S,
        check=False,
    )
    assert table.returncode == 1
    assert "blackjack: 0/0 probes scored as expected by the real verifier; 5 skipped" in table.stdout
    assert "nothing here proves its verifier" in table.stdout


def test_a_missing_package_stops_its_server_at_start_in_one_line() -> None:
    """The launcher, as the NeMo Gym environment runs it, given asr_with_pc's class where jiwer is not
    installed (this interpreter): one line naming the package, instead of a 500 from every /verify (upstream
    imports it only there)."""
    from relax_gym_core.gym.launch import server_class  # noqa: PLC0415 - the launcher runs in NeMo Gym

    assert importlib.util.find_spec("jiwer") is None  # not in this interpreter: the case under test
    with pytest.raises(SystemExit) as stopped:
        server_class("relax_gym_catalogue.servers:asr_with_pc")
    message = str(stopped.value)
    assert "\n" not in message
    assert "asr_with_pc needs the PyPI package jiwer in the NeMo Gym environment" in message
