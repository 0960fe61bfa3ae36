"""A gateway SIGKILLed while 20 real Workplace Assistant trials run, then restarted on the same state
directory: no trial is lost, no environment state leaks, no late model call is forwarded.

The arrangement: the session's shared NeMo Gym servers (resources server + simple_agent, started once by
the relax_gym_servers fixture), in front of them our own `relax-gym serve` process, so SIGKILL hits the
gateway and nothing else. The servers' policy_model is the session's model slot, where this test installs
a relay: each model call of an agent is forwarded to whichever gateway is current, and the rollout id it
carries is noted (the environment's id of the trial: the ledger records it, and only a live trial's id
is a bridge key). Behind the gateway, a scripted policy holds
every reply on a gate, so all 20 trials stay running until the kill.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from relax_gym_core.client import ClientOptions, GatewayClient, RemoteTrialError, run_trial
from relax_gym_core.plugin.host import converted_row, make_plugin_manager
from relax_gym_core.plugin.specs import environments_document, specs_for
from relax_gym_core.protocol import PROTOCOL_VERSION, parse_create_request
from relax_gym_core.testing import Gate, RecordedRequest, ScriptedReply, reply_text
from relax_gym_core.testing.web import ScriptedPolicy, start_gateway

pytestmark = [pytest.mark.anyio, pytest.mark.nemo_gym("workplace_assistant")]

relax_gym_workplace = pytest.importorskip("relax_gym_workplace")
from relax_gym_workplace.plugin import example_rows  # noqa: E402

ENVIRONMENT = "workplace_assistant"
CONFIG = "workplace-assistant-v1"
TRIALS = 20
TAG = "relax_gym_rollout"  # where NeMo Gym 0.4.0's simple_agent carries the rollout id (README: the bridge)
OPTIONS = ClientOptions(poll_interval_s=0.1)
SAFETY_S = 180.0  # guards against hangs only; nothing here is timed


class Relay:
    """The servers' policy_model for this test: forwards each model call to the current gateway."""

    def __init__(self) -> None:
        self.target: str | None = None
        self.rollout_ids: list[str] = []  # in the order first seen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        raw = await request.body()
        try:
            metadata = json.loads(raw).get("metadata") or {}
        except (ValueError, AttributeError):
            metadata = {}
        rollout_id = metadata.get(TAG) if isinstance(metadata, dict) else None
        if isinstance(rollout_id, str) and rollout_id not in self.rollout_ids:
            self.rollout_ids.append(rollout_id)
        headers = {k: v for k, v in request.headers.items() if k not in ("host", "content-length")}
        response: Response
        try:
            async with httpx.AsyncClient(trust_env=False, timeout=None) as http:
                answer = await http.request(
                    request.method, f"{self.target}{scope['path']}", content=raw, headers=headers
                )
            response = Response(
                answer.content, answer.status_code, media_type=answer.headers.get("content-type")
            )
        except httpx.HTTPError:
            response = JSONResponse({"detail": "no gateway"}, 502)  # the gateway was killed mid-call
        await response(scope, receive, send)


def session_input(row: dict[str, Any]) -> dict[str, Any]:
    converted = converted_row(make_plugin_manager().environments.get(ENVIRONMENT), row)
    return {"messages": converted["input"], "metadata": converted["metadata"]}


def create_body(policy: ScriptedPolicy, token: str, session: str, index: int) -> dict[str, Any]:
    rows = example_rows()
    return {
        "protocol_version": PROTOCOL_VERSION,
        "request_id": f"restart-{token[-12:]}",
        "session": {"session_id": session, "group_id": "restart-e2e", "rollout_mode": "train"},
        "environment": {
            "name": ENVIRONMENT,
            "config": CONFIG,
            "task": session_input(rows[index % len(rows)]),
        },
        "model_endpoint": {"base_url": policy.base_url, "api_key": token, "model": "policy-alias"},
        "interrupt_policy": "protected",
        "deadline_s": 900,
        "lease_s": 120,
    }


def gateway_specs(servers: Any) -> dict[str, Any]:
    """The environments file `relax-gym up` would write for these servers, as many slots as trials."""
    hooks = make_plugin_manager()
    specs = specs_for([hooks.environments.get(ENVIRONMENT)], dict(servers.urls), max_concurrency=TRIALS)
    return environments_document(specs)


async def sessions(resources: str) -> tuple[int, int]:
    async with httpx.AsyncClient(trust_env=False, timeout=30) as http:
        counts = (await http.get(f"{resources}/relax_gym/sessions")).json()
    return counts["sessions"], counts["rollouts"]


async def until(predicate: Callable[[], bool], what: str) -> None:
    stop = asyncio.get_running_loop().time() + SAFETY_S
    while not predicate():
        assert asyncio.get_running_loop().time() < stop, what
        await asyncio.sleep(0.1)


def found_in(state_dir: Path | None, lines: list[str], needles: list[str]) -> list[str]:
    hits = []
    files = [] if state_dir is None else sorted(p for p in state_dir.rglob("*") if p.is_file())
    for path in files:
        data = path.read_bytes()
        hits += [f"{path.name}: {n[:10]}..." for n in needles if n.encode() in data]
    text = "\n".join(lines)
    return hits + [f"log: {n[:10]}..." for n in needles if n in text]


async def test_sigkill_with_twenty_live_trials_then_restart(relax_gym_servers: Any, tmp_path: Path) -> None:
    servers = relax_gym_servers(ENVIRONMENT)
    state_dir = tmp_path / "state"
    gate = Gate()

    def hold(_request: RecordedRequest) -> ScriptedReply:
        return reply_text("Done.").held(gate)  # every reply waits: the trials stay running

    relay = Relay()
    # The session's token (the api key the bridge sends upstream) and its id, each its own value.
    keys = [f"agentic_session_shard_0.session-{secrets.token_hex(16)}" for _ in range(TRIALS)]
    session_ids = [f"relax-session-{secrets.token_hex(16)}" for _ in range(TRIALS)]
    tokens = keys + session_ids
    baseline = await sessions(servers.resources)
    specs = gateway_specs(servers)
    debug = ("--log-level", "debug")
    with ScriptedPolicy(hold) as policy, servers.model.serving(relay):
        pairs = enumerate(zip(keys, session_ids, strict=True))
        bodies = [create_body(policy, key, session, index) for index, (key, session) in pairs]
        requests = [parse_create_request(json.dumps(body)) for body in bodies]
        with start_gateway(specs, state_dir=state_dir, extra_args=debug) as first:
            port = urlsplit(first.url).port
            relay.target = first.url
            # Relax's side: one run_trial per session, polling the gateway's address throughout.
            clients = [
                asyncio.create_task(run_trial(r, gateway_url=first.url, options=OPTIONS)) for r in requests
            ]
            await until(lambda: len(relay.rollout_ids) == TRIALS, "every agent calls its model")
            await until(lambda: len(policy.model_requests()) >= TRIALS, "every call reaches the policy")
            leaked = await sessions(servers.resources)
            assert leaked[0] >= baseline[0] + TRIALS  # each running trial holds tool databases
            os.kill(first.pid, signal.SIGKILL)  # the gateway process only, by PID
            first.process.wait(timeout=SAFETY_S)
        assert await sessions(servers.resources) == leaked  # nothing releases them but the gateway
        # What the crash left on disk (the WAL holds every page the first gateway wrote): no secret.
        assert found_in(state_dir, first.output, tokens) == []
        assert found_in(None, first.output, relay.rollout_ids) == []  # nor a live bridge key in a log

        with start_gateway(specs, state_dir=state_dir, port=port or 0, extra_args=debug) as second:
            relay.target = second.url
            outcomes = await asyncio.wait_for(asyncio.gather(*clients, return_exceptions=True), SAFETY_S)
            # Every client polling through the restart saw its trial ended, never a 404.
            for outcome in outcomes:
                assert isinstance(outcome, RemoteTrialError), outcome
                assert "lost to a gateway restart" in str(outcome)
                assert outcome.snapshot.error == {"code": "service_restart"}

            async with GatewayClient(second.url, options=OPTIONS) as client:
                settled = [await client.settled(r.request_id, timeout_s=SAFETY_S) for r in requests]
            assert [(s.status.value, s.error, s.reward) for s in settled] == [
                ("aborted", {"code": "service_restart"}, None)
            ] * TRIALS  # 0 lost: each one terminal, with its cause
            assert [s.cleanup.value for s in settled if s.cleanup] == ["confirmed"] * TRIALS
            assert await sessions(servers.resources) == baseline  # released by rollout id
            # ...by the ids the agents carried: the ledger's, the bridge's and the environment's are one.
            ledger = f"file:{state_dir / 'ledger.sqlite3'}?mode=ro"
            with contextlib.closing(sqlite3.connect(ledger, uri=True)) as db:
                recorded = {row[0] for row in db.execute("SELECT rollout_id FROM trials")}
            assert recorded == set(relay.rollout_ids)

            seen_by_policy = len(policy.requests)
            async with httpx.AsyncClient(base_url=second.url, trust_env=False, timeout=30) as http:
                # A late model call of each dead trial, both ways a rollout id can travel: refused.
                for rollout_id in relay.rollout_ids:
                    late = {"model": "x", "input": "still there?", "metadata": {TAG: rollout_id}}
                    prefixed = await http.post(f"/ng-rollout/{rollout_id}/v1/responses", json=late)
                    tagged = await http.post("/v1/responses", json=late)
                    assert (prefixed.status_code, tagged.status_code) == (410, 410)
                # A replayed create returns the recorded trial and runs nothing again.
                for body, done in zip(bodies, settled, strict=True):
                    replay = await http.post("/v1/trials", json=body)
                    assert replay.status_code == 202
                    assert replay.json()["status"] == "aborted"
                    assert replay.json()["error"] == {"code": "service_restart"}
                    assert replay.json()["request_id"] == done.request_id
                other = {**bodies[0], "deadline_s": 901}
                assert (await http.post("/v1/trials", json=other)).status_code == 409
                health = (await http.get("/healthz")).json()
            assert len(policy.requests) == seen_by_policy  # nothing was forwarded
            assert health["active_trials"] == 0 and health["trials"] == 0
            assert await sessions(servers.resources) == baseline
            logs = first.output + second.output
        gate.open()

    assert found_in(state_dir, logs, tokens) == []
    assert found_in(None, logs, relay.rollout_ids) == []
