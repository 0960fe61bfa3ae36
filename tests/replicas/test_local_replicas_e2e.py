"""`relax-gym up workplace_assistant --replicas 2`: one gateway spreading trials over two local replicas.

One `up` for the module (this test kills one of its replicas, so it is the test's own): real NeMo Gym
servers (two copies of the resources server and agent), the real gateway, the thin client, and a scripted
policy standing in for Relax's model API. Each replica's workplace server counts its live sessions
(GET /relax_gym/sessions), which shows where trials ran and that their cleanup reached that replica.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
from collections.abc import Iterator

import httpx
import pytest

from relax_gym_core.client import GatewayClient
from relax_gym_core.testing import Gate
from relax_gym_core.testing.web import GatewayProcess

from .support import (
    ENVIRONMENT,
    OPTIONS,
    RESOURCES,
    SAFETY_S,
    HeldPolicy,
    alive,
    eventually,
    lose_two_of_four,
    replica_counts,
    replicas_of,
    sessions,
    settle_completed,
)

CONCURRENT = 20
pytestmark = [
    pytest.mark.anyio,
    pytest.mark.e2e,
    pytest.mark.slow,  # its own `up` (it kills a replica), started early while other tests run
    pytest.mark.nemo_gym(
        ENVIRONMENT,
        # The replacement waits a few seconds first, so trials created right after a loss provably have
        # only the survivor to go to (and a crash-looping replica is not restarted in a tight loop).
        env={"RELAX_GYM_REPLICA_RESTART_DELAY_S": "8", "RELAX_GYM_REPLICA_PROBE_INTERVAL_S": "0.2"},
        args=("--replicas", "2", "--max-concurrency", "32"),
    ),
]


@pytest.fixture(scope="module")
def policy() -> Iterator[HeldPolicy]:
    with HeldPolicy("replicas") as holder:
        yield holder


async def placed(gateway: GatewayProcess) -> dict[str, int]:
    """Runs placed per replica, from the gateway's /metrics."""
    async with httpx.AsyncClient(trust_env=False, timeout=30) as http:
        text = (await http.get(f"{gateway.url}/metrics")).text
    pattern = r'relax_gym_replica_runs_total\{environment="workplace_assistant",replica="([^"]+)"\} (\S+)'
    return {name: int(float(value)) for name, value in re.findall(pattern, text)}


async def test_two_replicas_spread_clean_up_where_they_ran_and_survive_a_lost_replica(
    policy: HeldPolicy, relax_gym_fresh_up: GatewayProcess
) -> None:
    gateway = relax_gym_fresh_up
    replicas = replicas_of(gateway)
    assert sorted(replicas) == ["workplace_assistant#0", "workplace_assistant#1"]
    first, second = (replicas[name][RESOURCES].url for name in sorted(replicas))
    assert first != second  # two independent copies
    assert await replica_counts(gateway) == {"wanted": 2, "healthy": 2, "starting": 0, "lost": 0}

    async with GatewayClient(gateway.url, options=OPTIONS) as client:
        # ---- 20 concurrent trials, all held at their first model call: both replicas carry sessions ----
        gate = Gate()
        batch = await policy.start_held(client, gate, CONCURRENT)
        live = [await sessions(first), await sessions(second)]
        assert all(count > 0 for count in live), live
        assert sum(live) == CONCURRENT  # each trial's session is on exactly one replica
        assert await placed(gateway) == {"workplace_assistant#0": 10, "workplace_assistant#1": 10}

        # Half are aborted mid-run (cleanup by rollout id: only the replica that ran it holds the session),
        # the other half finish and score.
        aborted, finished = batch[::2], batch[1::2]
        await asyncio.gather(*(client.abort(r.request_id) for r in aborted))
        gate.open()
        for request in aborted:
            snapshot = await client.settled(request.request_id, timeout_s=SAFETY_S)
            assert (snapshot.status.value, snapshot.cleanup) == ("aborted", "confirmed")
        await settle_completed(client, finished)
        assert [await sessions(first), await sessions(second)] == [0, 0]

        # ---- a replica dies mid-run: its trials fail typed, the survivor's go on ----------------------
        gate = Gate()
        doomed_batch = await policy.start_held(client, gate, 4)
        assert [await sessions(first), await sessions(second)] == [2, 2]
        for server in replicas["workplace_assistant#0"].values():
            os.kill(server.pid, signal.SIGKILL)  # a process this test's `up` started (its printed PID)
        running = await lose_two_of_four(client, doomed_batch)
        assert await replica_counts(gateway) == {"wanted": 2, "healthy": 1, "starting": 1, "lost": 1}

        # ---- later trials all go to the survivor, while the replacement is on its way ---------------
        before = await placed(gateway)
        later = await policy.start_held(client, gate, 4)
        after = await placed(gateway)
        assert after["workplace_assistant#0"] == before["workplace_assistant#0"]
        assert after["workplace_assistant#1"] == before["workplace_assistant#1"] + 4
        assert await sessions(second) == 2 + 4
        gate.open()
        await settle_completed(client, running + later)

    # ---- a replacement comes up --------------------------------------------------------------------
    async def replaced() -> bool:
        return (await replica_counts(gateway))["healthy"] == 2

    await eventually(replaced, "a replacement replica")
    assert await replica_counts(gateway) == {"wanted": 2, "healthy": 2, "starting": 0, "lost": 1}
    now = replicas_of(gateway)
    assert "workplace_assistant#2" in now
    assert await sessions(second) == 0
    assert await sessions(now["workplace_assistant#2"][RESOURCES].url) == 0

    # ---- drain: SIGTERM aborts the live trial (its cleanup proven on its replica), then stops every
    # replica it started, the replacement included ---------------------------------------------------
    gate = Gate()
    async with GatewayClient(gateway.url, options=OPTIONS) as client:
        await policy.start_held(client, gate, 1)
    pids = [server.pid for servers in now.values() for server in servers.values()]
    gateway.process.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(gateway.process.wait, SAFETY_S) != 0
    gate.open()
    assert any("1 trial(s) aborted, 1 cleanup(s) confirmed" in line for line in gateway.output), (
        gateway.output
    )
    assert [pid for pid in pids if alive(pid)] == []
