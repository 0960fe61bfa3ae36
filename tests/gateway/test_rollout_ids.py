"""Rollout ids are unpredictable and never reissued, also across restarts: while its trial is live an id is
the bearer of the trial's model calls, so an id a restarted gateway issued again would let an old agent's
late call spend a new trial's session token (real `relax-gym serve` processes on one state directory)."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from relax_gym_core.testing import reply_text
from relax_gym_core.testing.web import GatewayProcess, ScriptedPolicy, start_gateway
from relax_gym_core.trials.rollouts import random_rollout_id

SAFETY_S = 60.0  # guards against hangs only; nothing here is timed
TRIALS = 8
SPECS = {
    "echo-v1": {"environment": "echo", "runtime": "echo", "max_concurrency": TRIALS, "queue_capacity": 4}
}


def create(gateway: GatewayProcess, policy: ScriptedPolicy, request_id: str, *, sleep_s: float) -> None:
    body = {
        "protocol_version": "relax-nemo-gym/v1",
        "request_id": request_id,
        "session": {"session_id": f"session-{request_id}", "group_id": "g", "rollout_mode": "train"},
        "environment": {
            "name": "echo",
            "config": "echo-v1",
            "task": {"messages": [], "metadata": {"echo": {"sleep_s": sleep_s}}},
        },
        "model_endpoint": {"base_url": policy.base_url, "api_key": f"key-{request_id}", "model": "policy"},
        "interrupt_policy": "protected",
        "deadline_s": 600,
        "lease_s": 600,
    }
    answer = httpx.post(f"{gateway.url}/v1/trials", json=body, trust_env=False, timeout=SAFETY_S)
    assert answer.status_code == 202, answer.text


def statuses(gateway: GatewayProcess, request_ids: list[str]) -> list[str]:
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=SAFETY_S) as http:
        return [http.get(f"/v1/trials/{rid}").json()["status"] for rid in request_ids]


def until(gateway: GatewayProcess, request_ids: list[str], wanted: set[str]) -> None:
    stop = time.monotonic() + SAFETY_S
    while not set(statuses(gateway, request_ids)) <= wanted:
        assert time.monotonic() < stop, f"trials did not reach {wanted}"
        time.sleep(0.02)


def recorded(state_dir: Path) -> dict[str, str]:
    """request_id -> rollout_id, as the ledger holds them (read-only: a gateway may have it open)."""
    uri = f"file:{state_dir / 'ledger.sqlite3'}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
        return dict(db.execute("SELECT request_id, rollout_id FROM trials").fetchall())


def test_a_restarted_gateway_issues_no_earlier_id_and_refuses_every_one(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    first_ids = [f"before-{index}" for index in range(TRIALS)]
    later_ids = [f"after-{index}" for index in range(TRIALS)]
    with ScriptedPolicy(lambda _request: reply_text("never")) as policy:
        with start_gateway(SPECS, state_dir=state_dir) as first:
            for request_id in first_ids:
                create(first, policy, request_id, sleep_s=0)
            until(first, first_ids, {"completed"})
        before = recorded(state_dir)
        with start_gateway(SPECS, state_dir=state_dir) as second:
            for request_id in later_ids:  # live while the old ids are tried: an id reissued would be live
                create(second, policy, request_id, sleep_s=600)
            until(second, later_ids, {"running"})
            after = {rid: rollout for rid, rollout in recorded(state_dir).items() if rid in later_ids}
            assert len(after) == TRIALS
            assert not set(after.values()) & set(before.values()), "a restarted gateway reissued a rollout id"
            late: list[Any] = []
            with httpx.Client(base_url=second.url, trust_env=False, timeout=SAFETY_S) as http:
                for rollout_id in before.values():
                    call = {"model": "m", "input": "late", "metadata": {"relax_gym_rollout": rollout_id}}
                    late.append(http.post(f"/ng-rollout/{rollout_id}/v1/responses", json=call).status_code)
                    late.append(http.post("/v1/responses", json=call).status_code)
                for request_id in later_ids:
                    http.post(f"/v1/trials/{request_id}/abort")
            assert late == [410] * (2 * TRIALS)
        assert policy.model_requests() == []  # no late call reached any session
    assert len(set(before.values()) | set(after.values())) == 2 * TRIALS


def test_ids_are_random_in_every_position_and_differ_between_processes() -> None:
    ids = [random_rollout_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    hexes = [rollout_id.rpartition("-")[0] for rollout_id in ids]
    assert all(len(part) == 32 and int(part, 16) >= 0 for part in hexes)
    # A counter, a clock or a seeded generator would leave positions fixed or repeat across processes.
    assert all(len({part[position] for part in hexes}) > 1 for position in range(32))
    script = (
        "from relax_gym_core.trials.rollouts import random_rollout_id as r; print(*(r() for _ in range(200)))"
    )
    minted = [
        set(
            subprocess.run(
                [sys.executable, "-c", script], capture_output=True, text=True, check=True
            ).stdout.split()
        )
        for _ in range(2)
    ]
    assert len(minted[0]) == len(minted[1]) == 200
    assert not minted[0] & minted[1] and not minted[0] & set(ids)
