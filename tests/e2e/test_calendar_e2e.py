"""calendar end to end: real NeMo Gym servers (upstream's calendar resources server and simple_agent,
started by `relax-gym up calendar`), the real gateway and thin client, and a scripted policy standing in
for Relax's per-session model API (no LLM runs here; the answers come from the plugin's schedule search).

The `up` is shared by the test session (the relax_gym_up fixture); every trial has its own session token,
and the policy answers each request according to the trial its token belongs to.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from relax_gym_core.client import ClientOptions, GatewayClient, run_trial
from relax_gym_core.plugin import VerifierProbe
from relax_gym_core.plugin.host import converted_row, make_plugin_manager
from relax_gym_core.protocol import PROTOCOL_VERSION, parse_create_request
from relax_gym_core.testing import OracleScript, RecordedRequest, ScriptedReply, reply_text
from relax_gym_core.testing.web import GatewayProcess, PolicyByToken

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.nemo_gym("calendar")]

pytest.importorskip("relax_gym_calendar")
from relax_gym_calendar.plugin import example_rows  # noqa: E402

OPTIONS = ClientOptions(poll_interval_s=0.05)
CLIENT = str(Path(sys.executable).with_name("relax-gym-client"))
SAFETY_S = 120  # guards against hangs only
_tokens = itertools.count()

type Behaviour = Callable[[RecordedRequest], ScriptedReply]


@pytest.fixture(scope="module")
def policy() -> Iterator[PolicyByToken]:
    with PolicyByToken(default=lambda _request: reply_text("Sure, all set!")) as holder:
        yield holder


@pytest.fixture(scope="module")
def stack(relax_gym_up: Callable[..., GatewayProcess]) -> GatewayProcess:
    return relax_gym_up("calendar")


@pytest.fixture(scope="module")
def probes() -> dict[str, VerifierProbe]:
    return {
        probe.name: probe
        for probe in list(make_plugin_manager().environments.get("calendar").verifier_probes())
    }


def new_token() -> str:
    return f"agentic_session_shard_0.session-cal{next(_tokens):04d}"


def session_input(row: dict[str, Any]) -> dict[str, Any]:
    converted = converted_row(make_plugin_manager().environments.get("calendar"), row)
    return {"messages": converted["input"], "metadata": converted["metadata"]}


def trial_request(policy: PolicyByToken, row: dict[str, Any], *, token: str) -> Any:
    body = {
        "protocol_version": PROTOCOL_VERSION,
        "request_id": f"relax-e2e-{token}",
        "session": {"session_id": token, "group_id": "e2e", "rollout_mode": "train"},
        "environment": {"name": "calendar", "config": "calendar-v1", "task": session_input(row)},
        "model_endpoint": {"base_url": policy.server.base_url, "api_key": token, "model": "policy-alias"},
        "interrupt_policy": "protected",
        "deadline_s": 120,
        "lease_s": 60,
    }
    return parse_create_request(json.dumps(body))


def text_of(probe: VerifierProbe) -> str:
    text: str = probe.output[-1]["content"][0]["text"]
    return text


async def run(
    policy: PolicyByToken, stack: GatewayProcess, row: dict[str, Any], behaviour: Behaviour
) -> tuple[Any, Any]:
    """The trial's terminal snapshot and its settled one (cleanup verdict proven)."""
    token = new_token()
    policy.behaviours[token] = behaviour
    request = trial_request(policy, row, token=token)
    async with GatewayClient(stack.url, options=OPTIONS) as client:
        snapshot = await run_trial(request, client=client)
        settled = await client.settled(request.request_id, timeout_s=60)
    assert len(policy.requests_of(token)) == 1  # one generation per trial
    return snapshot, settled


async def test_the_solved_calendar_scores_one_with_the_whole_conversation_seen(
    policy: PolicyByToken, stack: GatewayProcess, probes: dict[str, VerifierProbe]
) -> None:
    row = example_rows()[1]  # 42 messages, 7 events
    solved = text_of(probes["example1:solved"])
    token = new_token()
    policy.behaviours[token] = lambda _request: reply_text(solved)
    request = trial_request(policy, row, token=token)
    async with GatewayClient(stack.url, options=OPTIONS) as client:
        snapshot = await run_trial(request, client=client)
        settled = await client.settled(request.request_id, timeout_s=60)
    assert (snapshot.status.value, snapshot.reward, snapshot.error) == ("completed", 1.0, None)
    assert snapshot.cleanup in ("pending", "confirmed")  # never unverified: nothing to prove
    assert settled.cleanup == "confirmed"  # stateless: confirmed without any cleanup call
    assert snapshot.metrics["answered"] is True
    (seen,) = policy.requests_of(token)
    assert seen.body["input"] == row["responses_create_params"]["input"]  # every turn reached the model
    assert not seen.body.get("tools")
    assert seen.model == "policy-alias"


async def test_a_broken_constraint_scores_zero(
    policy: PolicyByToken, stack: GatewayProcess, probes: dict[str, VerifierProbe]
) -> None:
    broken = text_of(probes["example0:broken_constraint"])
    snapshot, settled = await run(policy, stack, example_rows()[0], lambda _request: reply_text(broken))
    assert (snapshot.status.value, snapshot.reward, snapshot.error) == ("completed", 0.0, None)
    assert settled.cleanup == "confirmed"


async def test_visible_thinking_scores_zero_and_parsed_reasoning_does_not(
    policy: PolicyByToken, stack: GatewayProcess, probes: dict[str, VerifierProbe]
) -> None:
    """What the README's reasoning-parser advice is about: the same right calendar, two ways."""
    row, solved = example_rows()[3], text_of(probes["example3:solved"])
    thinking = "Event 0 is fixed at 1pm, so the morning holds the rest."
    visible, _ = await run(policy, stack, row, lambda _r: reply_text(f"<think>{thinking}</think>\n{solved}"))
    parsed, _ = await run(policy, stack, row, lambda _r: reply_text(solved, reasoning=thinking))
    assert (visible.reward, parsed.reward) == (0.0, 1.0)


async def test_the_oracle_from_probes_solves_every_example_row(
    policy: PolicyByToken, stack: GatewayProcess, probes: dict[str, VerifierProbe]
) -> None:
    oracle = OracleScript(probes.values())
    rows = example_rows()
    assert len(oracle) == len(rows) == 5
    results = await asyncio.gather(*(run(policy, stack, row, oracle) for row in rows))
    assert [snapshot.reward for snapshot, _ in results] == [1.0] * 5
    assert {settled.cleanup for _, settled in results} == {"confirmed"}


def test_the_thin_client_as_relax_launches_it(
    policy: PolicyByToken, stack: GatewayProcess, probes: dict[str, VerifierProbe], tmp_path: Path
) -> None:
    """`relax-gym-client` with the calendar recipe's variables writes the reward for Relax."""
    token = new_token()
    solved = text_of(probes["example4:solved"])
    policy.behaviours[token] = lambda _request: reply_text(solved)
    io_dir = tmp_path / "relax-agentic-command-1"
    io_dir.mkdir()
    (io_dir / "session_input.json").write_text(json.dumps(session_input(example_rows()[4])))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RELAX_", "NEMO_GYM_", "OPENAI_"))}
    environ = {
        **base,
        "RELAX_SESSION_ID": token,
        "RELAX_SESSION_IO_DIR": str(io_dir),
        "RELAX_BASE_URL": policy.server.base_url,
        "RELAX_GROUP_ID": "train:prepare_group_1",
        "RELAX_INPUT_JSON": str(io_dir / "session_input.json"),
        "RELAX_OUTPUT_JSON": str(io_dir / "session_output.json"),
        "NEMO_GYM_URL": stack.url,
        "NEMO_GYM_ENVIRONMENT": "calendar",
        "NEMO_GYM_CONFIG": "calendar-v1",
        "NEMO_GYM_MODEL": "model",
        "NEMO_GYM_DEADLINE_S": "600",
        "NEMO_GYM_LEASE_S": "60",
        "NEMO_GYM_INTERRUPT_POLICY": "protected",
        "NEMO_GYM_POLL_INTERVAL_S": "0.05",
    }
    result = subprocess.run(
        [CLIENT], env=environ, capture_output=True, text=True, timeout=SAFETY_S, check=False
    )
    assert (result.returncode, result.stderr) == (0, "")
    output = json.loads((io_dir / "session_output.json").read_text())
    assert (output["reward"], output["metadata"]["nemo_gym"]["status"]) == (1.0, "completed")
