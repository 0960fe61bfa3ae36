"""Workplace Assistant end to end: real NeMo Gym servers (started by `relax-gym up`), the real gateway and
thin client, and a scripted policy standing in for Relax's per-session model API (no LLM runs here).

The servers are the session's shared `relax-gym up workplace_assistant`; every test uses its own session
tokens, and the policy answers each request according to the trial its token belongs to.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from relax_gym_core.client import GatewayClient, run_trial
from relax_gym_core.plugin.host import converted_row, make_plugin_manager
from relax_gym_core.policies.oracle import OracleScript
from relax_gym_core.protocol import PROTOCOL_VERSION, parse_create_request
from relax_gym_core.testing import Gate, reply_text
from relax_gym_core.testing.web import GatewayProcess, PolicyByToken

from ..replicas.support import OPTIONS, solve_task_0, tool_outputs

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.nemo_gym("workplace_assistant")]

relax_gym_workplace = pytest.importorskip("relax_gym_workplace")
from relax_gym_workplace.plugin import example_rows  # noqa: E402

_tokens = itertools.count()


@pytest.fixture(scope="module")
def policy() -> Iterator[PolicyByToken]:
    with PolicyByToken(default=lambda _request: reply_text("Done.")) as holder:
        yield holder


@pytest.fixture(scope="module")
def stack(relax_gym_up: Callable[..., GatewayProcess]) -> GatewayProcess:
    return relax_gym_up("workplace_assistant")


@pytest.fixture(scope="module")
def resources_url(stack: Any) -> str:
    return stack.server_url("workplace_assistant")


def session_input(row: dict[str, Any]) -> dict[str, Any]:
    converted = converted_row(make_plugin_manager().environments.get("workplace_assistant"), row)
    return {"messages": converted["input"], "metadata": converted["metadata"]}


def trial_request(policy: PolicyByToken, row: dict[str, Any], *, token: str, deadline_s: float = 120) -> Any:
    body = {
        "protocol_version": PROTOCOL_VERSION,
        "request_id": f"relax-e2e-{token}",
        "session": {"session_id": token, "group_id": "e2e", "rollout_mode": "eval"},
        "environment": {
            "name": "workplace_assistant",
            "config": "workplace-assistant-v1",
            "task": session_input(row),
        },
        "model_endpoint": {"base_url": policy.server.base_url, "api_key": token, "model": "policy-alias"},
        "interrupt_policy": "protected",
        "deadline_s": deadline_s,
        "lease_s": 60,
    }
    return parse_create_request(json.dumps(body))


def new_token() -> str:
    return f"agentic_session_shard_0.session-e2e{next(_tokens):04d}"


async def test_scripted_trial_scores_one_and_feeds_tool_results_back(
    policy: PolicyByToken, stack: Any
) -> None:
    row = example_rows()[0]
    token = new_token()
    policy.behaviours[token] = solve_task_0("00000057")
    request = trial_request(policy, row, token=token)
    async with GatewayClient(stack.url, options=OPTIONS) as client:
        snapshot = await run_trial(request, client=client)
        assert snapshot.status.value == "completed"
        assert snapshot.reward == 1.0
        # The status turns terminal first; the resources server's cleanup is proven just after.
        settled = await client.settled(request.request_id, timeout_s=60)
    assert settled.cleanup is not None and settled.cleanup.value == "confirmed"
    assert snapshot.metrics["tool_calls"] == 2
    seen = policy.requests_of(token)
    assert [tool_outputs(r) for r in seen] == [0, 1, 2]  # each tool result reached the next model call
    for request in seen:
        assert request.model == "policy-alias"
        assert "relax_gym_rollout" not in request.raw_body.decode()
        assert request.body["tools"]  # the row's own tools went to the model


async def test_wrong_write_scores_zero(policy: PolicyByToken, stack: Any) -> None:
    token = new_token()
    policy.behaviours[token] = solve_task_0("00000017")  # an existing email, but the wrong one
    snapshot = await run_trial(
        trial_request(policy, example_rows()[0], token=token), gateway_url=stack.url, options=OPTIONS
    )
    assert (snapshot.status.value, snapshot.reward) == ("completed", 0.0)


async def test_two_concurrent_trials_never_cross(policy: PolicyByToken, stack: Any) -> None:
    rows = example_rows()[:2]
    tokens = [new_token(), new_token()]
    for token in tokens:
        policy.behaviours[token] = solve_task_0("00000057")
    await asyncio.gather(
        *(
            run_trial(trial_request(policy, row, token=token), gateway_url=stack.url, options=OPTIONS)
            for row, token in zip(rows, tokens, strict=True)
        )
    )
    for row, token in zip(rows, tokens, strict=True):
        user_text = row["responses_create_params"]["input"][-1]["content"]
        seen = policy.requests_of(token)
        assert seen
        for request in seen:
            assert user_text in json.dumps(request.body["input"])


async def test_abort_mid_trial_is_aborted_with_cleanup_confirmed(
    policy: PolicyByToken, stack: Any, resources_url: str
) -> None:
    token = new_token()
    gate = Gate()
    policy.behaviours[token] = lambda request: solve_task_0("00000057")(request).held(gate)
    request = trial_request(policy, example_rows()[0], token=token)
    seen_before = len(policy.server.requests)
    async with GatewayClient(stack.url, options=OPTIONS) as client:
        await client.create(request)
        await policy.server.wait_for_requests_async(seen_before + 1)
        assert policy.requests_of(token)  # the agent is now waiting on its first model call
        await client.abort(request.request_id)
        snapshot = await client.settled(request.request_id, timeout_s=60)
    gate.open()
    assert (snapshot.status.value, snapshot.error, snapshot.reward) == ("aborted", {"code": "aborted"}, None)
    assert snapshot.cleanup == "confirmed"


async def resources_sessions(resources_url: str) -> tuple[int, int]:
    async with httpx.AsyncClient(trust_env=False) as http:
        sessions = (await http.get(f"{resources_url}/relax_gym/sessions")).json()
    return sessions["sessions"], sessions["rollouts"]


@pytest.mark.slow
async def test_two_hundred_sequential_trials_leave_no_sessions(
    policy: PolicyByToken, stack: Any, resources_url: str
) -> None:
    row = example_rows()[0]
    before = await resources_sessions(resources_url)  # the servers are shared: count what these trials add
    async with GatewayClient(stack.url, options=OPTIONS) as client:
        for _ in range(200):
            token = new_token()  # no behaviour: the policy just answers "Done."
            request = trial_request(policy, row, token=token)
            snapshot = await run_trial(request, client=client)
            assert snapshot.reward == 0.0  # doing nothing does not solve the task
            # The last trials' cleanups may still run when the loop ends: count sessions once all settled.
            assert (await client.settled(request.request_id, timeout_s=60)).cleanup == "confirmed"
    async with httpx.AsyncClient(trust_env=False) as http:
        health = (await http.get(f"{stack.url}/readyz")).json()
    assert await resources_sessions(resources_url) == before
    assert health["active_trials"] == 0


async def test_oracle_from_probes_solves_every_example_row(policy: PolicyByToken, stack: Any) -> None:
    """The oracle policy `make demo` uses: each row's known-good probe output, replayed turn by turn."""
    probes = list(make_plugin_manager().environments.get("workplace_assistant").verifier_probes())
    oracle = OracleScript(probes)
    rows = example_rows()
    assert len(oracle) == len(rows) == 5
    tokens = [new_token() for _ in rows]
    for token in tokens:
        policy.behaviours[token] = oracle
    snapshots = await asyncio.gather(
        *(
            run_trial(trial_request(policy, row, token=token), gateway_url=stack.url, options=OPTIONS)
            for row, token in zip(rows, tokens, strict=True)
        )
    )
    assert [snapshot.reward for snapshot in snapshots] == [1.0] * 5
    ground_truth_calls = [len(row["ground_truth"]) for row in rows]
    assert [snapshot.metrics["tool_calls"] for snapshot in snapshots] == ground_truth_calls
    # Each trial's trajectory shows the tool calls and their outputs, and a model turn per call plus one.
    async with httpx.AsyncClient(base_url=stack.url, trust_env=False) as http:
        documents = [(await http.get(str(snapshot.artifact_ref))).json() for snapshot in snapshots]
    assert [d["counts"]["tool_calls"] for d in documents] == ground_truth_calls
    assert [d["counts"]["tool_outputs"] for d in documents] == ground_truth_calls
    assert [d["counts"]["answered_calls"] for d in documents] == [n + 1 for n in ground_truth_calls]
    outputs = [
        item
        for item in documents[0]["run"]["answer"]["response"]["output"]
        if item["type"] == "function_call_output"
    ]
    assert len(outputs) == ground_truth_calls[0] and all(item["output"] for item in outputs)
