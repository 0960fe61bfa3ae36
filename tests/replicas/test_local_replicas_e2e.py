"""`relax-gym up workplace_assistant --replicas 2`: one gateway spreading trials over two local replicas.

One `up` for the module (this test kills one of its replicas, so it is the test's own): real NeMo Gym
servers (two copies of the resources server and agent), the real gateway, the thin client, and a scripted
policy standing in for Relax's model API. Each replica's workplace server counts its live sessions
(GET /relax_gym/sessions), which shows where trials ran and that their cleanup reached that replica.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import os
import re
import signal
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from relax_gym_core.client import ClientOptions, GatewayClient
from relax_gym_core.environments import make_plugin_manager
from relax_gym_core.protocol import PROTOCOL_VERSION, CreateTrialRequest, TrialSnapshot, parse_create_request
from relax_gym_core.testing import (
    Gate,
    RecordedRequest,
    ScriptedReply,
    ToolCall,
    reply_text,
    reply_tool_calls,
)
from relax_gym_core.testing.web import GatewayProcess, ScriptedPolicy

relax_gym_workplace = pytest.importorskip("relax_gym_workplace")
from relax_gym_workplace.data import example_rows  # noqa: E402

ENVIRONMENT = "workplace_assistant"
RESOURCES = "workplace_assistant"  # the resources server's name (the agent is workplace_assistant_agent)
CONCURRENT = 20
SAFETY_S = 240.0  # a bound on waiting for something that must happen, not a timing assertion
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
OPTIONS = ClientOptions(poll_interval_s=0.05)
REPLY_BODY = "Thanks for the update - I will get back to you tomorrow."
_tokens = itertools.count()


def tool_outputs(request: RecordedRequest) -> int:
    items = request.body.get("input", []) if isinstance(request.body, dict) else []
    return sum(1 for item in items if isinstance(item, dict) and item.get("type") == "function_call_output")


def solve_task_0(gate: Gate) -> Callable[[RecordedRequest], ScriptedReply]:
    """Search, reply to the right email, say done (reward 1.0); every answer waits for `gate`."""

    def script(request: RecordedRequest) -> ScriptedReply:
        step = tool_outputs(request)
        if step == 0:
            reply = reply_tool_calls(
                ToolCall("email_search_emails", {"query": "Task Update on Develop prototype"})
            )
        elif step == 1:
            reply = reply_tool_calls(
                ToolCall("email_reply_email", {"email_id": "00000057", "body": REPLY_BODY})
            )
        else:
            reply = reply_text("Done.")
        return reply.held(gate)

    return script


class Policy:
    def __init__(self) -> None:
        self.behaviours: dict[str, Callable[[RecordedRequest], ScriptedReply]] = {}
        self.server = ScriptedPolicy(self.answer)

    def answer(self, request: RecordedRequest) -> ScriptedReply:
        behaviour = self.behaviours.get(request.bearer or "")
        return behaviour(request) if behaviour is not None else reply_text("Done.")

    def first_calls(self, tokens: list[str]) -> int:
        """How many of these trials have made their first model call (so their session is seeded)."""
        seen = {r.bearer for r in self.server.model_requests("responses")}
        return sum(token in seen for token in tokens)


@pytest.fixture(scope="module")
def policy() -> Iterator[Policy]:
    holder = Policy()
    with holder.server:
        yield holder


def replicas_of(gateway: GatewayProcess) -> dict[str, dict[str, tuple[str, int]]]:
    """replica name -> server name -> (url, pid), from the lines `relax-gym up` printed."""
    found: dict[str, dict[str, tuple[str, int]]] = {}
    for line in gateway.output:
        match = re.match(r"NeMo Gym server (\S+) at (\S+) \(pid (\d+)\) \[replica (\S+)\]", line)
        if match:
            server, url, pid, replica = match.groups()
            found.setdefault(replica, {})[server] = (url, int(pid))
    return found


def trial(policy: Policy, gate: Gate) -> CreateTrialRequest:
    token = f"agentic_session_shard_0.session-replicas{next(_tokens):04d}"
    policy.behaviours[token] = solve_task_0(gate)
    converted = make_plugin_manager().convert_row(ENVIRONMENT, example_rows()[0])
    body = {
        "protocol_version": PROTOCOL_VERSION,
        "request_id": f"relax-replicas-{token}",
        "session": {"session_id": token, "group_id": "replicas", "rollout_mode": "eval"},
        "environment": {
            "name": ENVIRONMENT,
            "config": "workplace-assistant-v1",
            "task": {"messages": converted["input"], "metadata": converted["metadata"]},
        },
        "model_endpoint": {"base_url": policy.server.base_url, "api_key": token, "model": "policy-alias"},
        "interrupt_policy": "protected",
        "deadline_s": 600,
        "lease_s": 600,
    }
    return parse_create_request(json.dumps(body))


def token_of(request: CreateTrialRequest) -> str:
    return request.session.session_id


async def sessions(resources_url: str) -> int:
    async with httpx.AsyncClient(trust_env=False, timeout=30) as http:
        count: int = (await http.get(f"{resources_url}/relax_gym/sessions")).json()["sessions"]
    return count


async def placed(gateway: GatewayProcess) -> dict[str, int]:
    """Runs placed per replica, from the gateway's /metrics."""
    async with httpx.AsyncClient(trust_env=False, timeout=30) as http:
        text = (await http.get(f"{gateway.url}/metrics")).text
    pattern = r'relax_gym_replica_runs_total\{environment="workplace_assistant",replica="([^"]+)"\} (\S+)'
    return {name: int(float(value)) for name, value in re.findall(pattern, text)}


async def replicas_ready(gateway: GatewayProcess) -> dict[str, Any]:
    async with httpx.AsyncClient(trust_env=False, timeout=30) as http:
        counts: dict[str, Any] = (await http.get(f"{gateway.url}/readyz")).json()["replicas"][ENVIRONMENT]
    return counts


async def until(predicate: Callable[[], Any], what: str) -> None:
    stop = asyncio.get_running_loop().time() + SAFETY_S
    while not await _value(predicate()):
        assert asyncio.get_running_loop().time() < stop, what
        await asyncio.sleep(0.1)


async def settle_all(client: GatewayClient, requests: list[CreateTrialRequest]) -> list[TrialSnapshot]:
    return list(await asyncio.gather(*(client.settled(r.request_id, timeout_s=SAFETY_S) for r in requests)))


async def test_two_replicas_spread_clean_up_where_they_ran_and_survive_a_lost_replica(
    policy: Policy, relax_gym_fresh_up: GatewayProcess
) -> None:
    gateway = relax_gym_fresh_up
    replicas = replicas_of(gateway)
    assert sorted(replicas) == ["workplace_assistant#0", "workplace_assistant#1"]
    first, second = (replicas[name] for name in sorted(replicas))
    assert first[RESOURCES][0] != second[RESOURCES][0]  # two independent copies
    assert await replicas_ready(gateway) == {"wanted": 2, "healthy": 2, "starting": 0, "lost": 0}

    async with GatewayClient(gateway.url, options=OPTIONS) as client:
        # ---- 20 concurrent trials, all held at their first model call: both replicas carry sessions ----
        gate = Gate()
        batch = [trial(policy, gate) for _ in range(CONCURRENT)]
        await asyncio.gather(*(client.create(request) for request in batch))
        tokens = [token_of(r) for r in batch]
        await until(lambda: policy.first_calls(tokens) == CONCURRENT, "every trial's first model call")
        live = [await sessions(first[RESOURCES][0]), await sessions(second[RESOURCES][0])]
        assert all(count > 0 for count in live), live
        assert sum(live) == CONCURRENT  # each trial's session is on exactly one replica
        assert await placed(gateway) == {"workplace_assistant#0": 10, "workplace_assistant#1": 10}

        # Half are aborted mid-run (cleanup by rollout id: only the replica that ran it holds the session),
        # the other half finish and score.
        aborted, finished = batch[::2], batch[1::2]
        await asyncio.gather(*(client.abort(r.request_id) for r in aborted))
        gate.open()
        for snapshot in await settle_all(client, aborted):
            assert (snapshot.status.value, snapshot.cleanup) == ("aborted", "confirmed")
        for snapshot in await settle_all(client, finished):
            assert (snapshot.status.value, snapshot.reward, snapshot.cleanup) == (
                "completed",
                1.0,
                "confirmed",
            )
        assert [await sessions(first[RESOURCES][0]), await sessions(second[RESOURCES][0])] == [0, 0]

        # ---- a replica dies mid-run: its trials fail typed, the survivor's go on ----------------------
        gate = Gate()
        doomed_batch = [trial(policy, gate) for _ in range(4)]
        await asyncio.gather(*(client.create(request) for request in doomed_batch))
        tokens = [token_of(r) for r in doomed_batch]
        await until(lambda: policy.first_calls(tokens) == 4, "the four trials' first model calls")
        assert [await sessions(first[RESOURCES][0]), await sessions(second[RESOURCES][0])] == [2, 2]
        for _server, (_url, pid) in first.items():
            os.kill(pid, signal.SIGKILL)  # a process this test's `up` started (its printed PID)
        snapshots: dict[str, TrialSnapshot] = {}

        async def two_failed() -> bool:
            for request in doomed_batch:
                snapshots[request.request_id] = await client.get(request.request_id)
            return sum(s.status.value == "failed" for s in snapshots.values()) == 2

        await until(two_failed, "the lost replica's two trials to fail")
        assert sorted(s.status.value for s in snapshots.values()) == [
            "failed",
            "failed",
            "running",
            "running",
        ]
        for request in doomed_batch:
            if snapshots[request.request_id].status.value == "failed":
                # Its processes are gone, but not proven to have held everything of the run: unverified.
                snapshot = await client.settled(request.request_id, timeout_s=SAFETY_S)
                assert snapshot.cleanup == "unverified"
                assert snapshot.error == {
                    "code": "cleanup_unverified",
                    "type": "CleanupError",
                    "cause": "agent_error",
                    "kind": "replica_lost",  # a typed infrastructure failure
                }
                assert snapshot.reward is None  # never a score
        assert await replicas_ready(gateway) == {"wanted": 2, "healthy": 1, "starting": 1, "lost": 1}

        # ---- later trials all go to the survivor, while the replacement is on its way ---------------
        before = await placed(gateway)
        later = [trial(policy, gate) for _ in range(4)]
        await asyncio.gather(*(client.create(request) for request in later))
        tokens = [token_of(r) for r in later]
        await until(lambda: policy.first_calls(tokens) == 4, "the later trials' first model calls")
        after = await placed(gateway)
        assert after["workplace_assistant#0"] == before["workplace_assistant#0"]
        assert after["workplace_assistant#1"] == before["workplace_assistant#1"] + 4
        assert await sessions(second[RESOURCES][0]) == 2 + 4
        gate.open()
        survivors = [r for r in doomed_batch if snapshots[r.request_id].status.value != "failed"] + later
        for snapshot in await settle_all(client, survivors):
            assert (snapshot.status.value, snapshot.reward, snapshot.cleanup) == (
                "completed",
                1.0,
                "confirmed",
            )

    # ---- a replacement comes up --------------------------------------------------------------------
    async def replaced() -> bool:
        return (await replicas_ready(gateway))["healthy"] == 2

    await until(replaced, "a replacement replica")
    assert await replicas_ready(gateway) == {"wanted": 2, "healthy": 2, "starting": 0, "lost": 1}
    now = replicas_of(gateway)
    assert "workplace_assistant#2" in now
    assert await sessions(second[RESOURCES][0]) == 0
    assert await sessions(now["workplace_assistant#2"][RESOURCES][0]) == 0

    # ---- drain: SIGTERM aborts the live trial (its cleanup proven on its replica), then stops every
    # replica it started, the replacement included ---------------------------------------------------
    gate = Gate()
    held = trial(policy, gate)
    async with GatewayClient(gateway.url, options=OPTIONS) as client:
        await client.create(held)
        await until(lambda: policy.first_calls([token_of(held)]) == 1, "the held trial's first model call")
    pids = [pid for servers in now.values() for _url, pid in servers.values()]
    gateway.process.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(gateway.process.wait, SAFETY_S) != 0
    gate.open()
    assert any("1 trial(s) aborted, 1 cleanup(s) confirmed" in line for line in gateway.output), (
        gateway.output
    )
    assert [pid for pid in pids if alive(pid)] == []


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as status:
            return "State:\tZ" not in status.read()  # a zombie has exited
    except FileNotFoundError:
        return False


async def _value(result: Any) -> Any:
    return await result if inspect.isawaitable(result) else result
