"""Shared by the replica tests (tests/replicas local, tests/ray on a Ray cluster) and the workplace e2e:
workplace_assistant trials solved by a scripted policy whose answers a gate holds, and what the tests read
back (sessions per replica, the gateway's replica counts, the replicas `relax-gym up` printed).

Imported relatively (`from ..replicas.support import ...`): pytest's importlib mode puts tests/ on the
import path as the namespace package `tests`. pytest does not rewrite the asserts of a module it does not
collect, so each assert here says what it saw.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from attrs import frozen

from relax_gym_core.client import ClientOptions, GatewayClient
from relax_gym_core.plugin.host import converted_row, make_plugin_manager
from relax_gym_core.policies.oracle import tool_results
from relax_gym_core.protocol import PROTOCOL_VERSION, CreateTrialRequest, TrialSnapshot, parse_create_request
from relax_gym_core.testing import (
    Gate,
    RecordedRequest,
    ScriptedReply,
    ToolCall,
    reply_text,
    reply_tool_calls,
)
from relax_gym_core.testing.web import GatewayProcess, PolicyByToken

pytest.importorskip("relax_gym_workplace")
from relax_gym_workplace.plugin import example_rows

ENVIRONMENT = "workplace_assistant"
RESOURCES = "workplace_assistant"  # the resources server's name (the agent is workplace_assistant_agent)
REPLY_BODY = "Thanks for the update - I will get back to you tomorrow."  # what task 0's verifier expects
SAFETY_S = 300.0  # a bound on waiting for something that must happen, not a timing assertion
OPTIONS = ClientOptions(poll_interval_s=0.05)
_tokens = itertools.count()


def tool_outputs(request: RecordedRequest) -> int:
    """How many tool results the model call carries (which step of its trial it is)."""
    return tool_results(request.body) if isinstance(request.body, dict) else 0


def solve_task_0(
    email_id: str = "00000057", gate: Gate | None = None
) -> Callable[[RecordedRequest], ScriptedReply]:
    """Search (read-only), reply to `email_id`, say done: one step per tool output. 00000057 is the right
    email (reward 1.0). With a gate, every answer waits for it (a trial is held at its first model call)."""

    def script(request: RecordedRequest) -> ScriptedReply:
        step = tool_outputs(request)
        if step == 0:
            reply = reply_tool_calls(
                ToolCall("email_search_emails", {"query": "Task Update on Develop prototype"})
            )
        elif step == 1:
            reply = reply_tool_calls(
                ToolCall("email_reply_email", {"email_id": email_id, "body": REPLY_BODY})
            )
        else:
            reply = reply_text("Done.")
        return reply.held(gate) if gate is not None else reply

    return script


class HeldPolicy(PolicyByToken):
    """One scripted policy for a module's trials: each solves task 0, its answers held by its gate."""

    def __init__(self, tag: str) -> None:
        super().__init__(default=lambda _request: reply_text("Done."))
        self.tag = tag  # in tokens and request ids: whose trials these are

    def trial(self, gate: Gate) -> CreateTrialRequest:
        token = f"agentic_session_shard_0.session-{self.tag}{next(_tokens):04d}"
        self.behaviours[token] = solve_task_0(gate=gate)
        converted = converted_row(make_plugin_manager().environments.get(ENVIRONMENT), example_rows()[0])
        body = {
            "protocol_version": PROTOCOL_VERSION,
            "request_id": f"relax-{self.tag}-{token}",
            "session": {"session_id": token, "group_id": self.tag, "rollout_mode": "eval"},
            "environment": {
                "name": ENVIRONMENT,
                "config": "workplace-assistant-v1",
                "task": {"messages": converted["input"], "metadata": converted["metadata"]},
            },
            "model_endpoint": {"base_url": self.server.base_url, "api_key": token, "model": "policy-alias"},
            "interrupt_policy": "protected",
            "deadline_s": 600,
            "lease_s": 600,
        }
        return parse_create_request(json.dumps(body))

    def first_calls(self, requests: list[CreateTrialRequest]) -> int:
        """How many of these trials have made their first model call (so their session is seeded)."""
        seen = {r.bearer for r in self.server.model_requests(self.resource)}
        return sum(request.session.session_id in seen for request in requests)

    async def start_held(self, client: GatewayClient, gate: Gate, count: int) -> list[CreateTrialRequest]:
        """`count` trials created at once, returned once each waits at its first model call."""
        batch = [self.trial(gate) for _ in range(count)]
        await asyncio.gather(*(client.create(request) for request in batch))
        await eventually(lambda: self.first_calls(batch) == count, f"{count} trial(s)' first model call")
        return batch


async def eventually(predicate: Callable[[], Any], what: str) -> None:
    """Wait until `predicate()` (or the awaitable it returns) is true: it must come; the bound only keeps a
    broken build from hanging."""
    stop = asyncio.get_running_loop().time() + SAFETY_S
    while not await _value(predicate()):
        assert asyncio.get_running_loop().time() < stop, f"never happened: {what}"
        await asyncio.sleep(0.1)


async def _value(result: Any) -> Any:
    return await result if inspect.isawaitable(result) else result


async def sessions(resources_url: str) -> int:
    """The live sessions of one replica's workplace resources server."""
    async with httpx.AsyncClient(trust_env=False, timeout=30) as http:
        count: int = (await http.get(f"{resources_url}/relax_gym/sessions")).json()["sessions"]
    return count


async def replica_counts(gateway: GatewayProcess) -> dict[str, Any]:
    """wanted / healthy / starting / lost replicas of the environment, from the gateway's /readyz."""
    async with httpx.AsyncClient(trust_env=False, timeout=30) as http:
        counts: dict[str, Any] = (await http.get(f"{gateway.url}/readyz")).json()["replicas"][ENVIRONMENT]
    return counts


@frozen
class PrintedServer:
    url: str
    where: str  # "pid PID" (a local replica) or "on NODE_ID" (a Ray replica)

    @property
    def pid(self) -> int:
        return int(self.where.removeprefix("pid "))

    @property
    def node(self) -> str:
        return self.where.removeprefix("on ")


def replicas_of(gateway: GatewayProcess) -> dict[str, dict[str, PrintedServer]]:
    """replica name -> server name -> where it runs, from the lines `relax-gym up` printed."""
    found: dict[str, dict[str, PrintedServer]] = {}
    for line in gateway.output:
        match = re.match(r"NeMo Gym server (\S+) at (\S+) \(((?:pid|on) \S+)\) \[replica (\S+)\]", line)
        if match:
            server, url, where, replica = match.groups()
            found.setdefault(replica, {})[server] = PrintedServer(url, where)
    return found


async def settle_completed(client: GatewayClient, requests: list[CreateTrialRequest]) -> None:
    """Each trial ends completed, scored 1.0, its cleanup confirmed."""
    settled = await asyncio.gather(*(client.settled(r.request_id, timeout_s=SAFETY_S) for r in requests))
    for r, snapshot in zip(requests, settled, strict=True):
        outcome = (snapshot.status.value, snapshot.reward, snapshot.cleanup)
        assert outcome == ("completed", 1.0, "confirmed"), (r.request_id, outcome, snapshot.error)


async def lose_two_of_four(
    client: GatewayClient, batch: list[CreateTrialRequest]
) -> list[CreateTrialRequest]:
    """Four trials, two on each replica, one replica just lost: its two trials fail typed, never scored, the
    other two still run. Returns the two still running."""
    snapshots: dict[str, TrialSnapshot] = {}

    async def two_failed() -> bool:
        for request in batch:
            snapshots[request.request_id] = await client.get(request.request_id)
        return sum(s.status.value == "failed" for s in snapshots.values()) == 2

    await eventually(two_failed, "the lost replica's two trials to fail")
    statuses = sorted(s.status.value for s in snapshots.values())
    assert statuses == ["failed", "failed", "running", "running"], statuses
    for request in batch:
        if snapshots[request.request_id].status.value == "failed":
            # Its processes are gone, but not proven to have held everything of the run: unverified.
            snapshot = await client.settled(request.request_id, timeout_s=SAFETY_S)
            assert snapshot.cleanup == "unverified", snapshot.cleanup
            assert snapshot.error == {
                "code": "cleanup_unverified",
                "type": "CleanupError",
                "cause": "agent_error",
                "kind": "replica_lost",  # a typed infrastructure failure
            }, snapshot.error
            assert snapshot.reward is None, snapshot.reward  # never a score
    return [r for r in batch if snapshots[r.request_id].status.value != "failed"]


def process_stat(pid: int) -> tuple[int, str] | None:
    """(parent PID, start time) of a live, non-zombie process; None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None
    return int(fields[1]), fields[19]


def parent_of(pid: int) -> int:
    """The parent PID of a live process (0 when it is gone)."""
    stat = process_stat(pid)
    return stat[0] if stat is not None else 0


def alive(pid: int) -> bool:
    return process_stat(pid) is not None  # a zombie has exited
