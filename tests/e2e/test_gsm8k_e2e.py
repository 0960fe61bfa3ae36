"""gsm8k and math_with_judge end to end: real NeMo Gym servers (upstream's math_with_judge resources server
and simple_agent, started by `relax-gym up gsm8k math_with_judge`), the real gateway and thin client, and
a scripted policy standing in for Relax's per-session model API (no LLM runs here).

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
from relax_gym_core.plugin.host import converted_row, make_plugin_manager
from relax_gym_core.protocol import PROTOCOL_VERSION, parse_create_request
from relax_gym_core.testing import OracleScript, RecordedRequest, ScriptedReply, reply_text
from relax_gym_core.testing.web import GatewayProcess, PolicyByToken

pytest.importorskip("relax_gym_gsm8k")
from relax_gym_gsm8k.judge import API_KEY_VAR, MODEL_VAR, URL_VAR, VERIFY_TIMEOUT_VAR
from relax_gym_gsm8k.plugin import example_rows, numeric_example_rows

JUDGE_OFF = {
    **dict.fromkeys((URL_VAR, MODEL_VAR, API_KEY_VAR), ""),  # whatever the shell running the tests has
    # Past its bound upstream scores a right answer 0.0: on a shared, loaded test machine it gets room.
    VERIFY_TIMEOUT_VAR: "120",
}
ENVIRONMENTS = ("gsm8k", "math_with_judge")
pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.nemo_gym(*ENVIRONMENTS, env=JUDGE_OFF)]

CONFIGS = {"gsm8k": "gsm8k-v1", "math_with_judge": "math-with-judge-v1"}
OPTIONS = ClientOptions(poll_interval_s=0.05)
CLIENT = str(Path(sys.executable).with_name("relax-gym-client"))
SAFETY_S = 120  # guards against hangs only
_tokens = itertools.count()

type Behaviour = Callable[[RecordedRequest], ScriptedReply]


@pytest.fixture(scope="module")
def policy() -> Iterator[PolicyByToken]:
    with PolicyByToken(default=lambda _request: reply_text("I am not sure.")) as holder:
        yield holder


@pytest.fixture(scope="module")
def stack(relax_gym_up: Callable[..., GatewayProcess]) -> GatewayProcess:
    return relax_gym_up(*ENVIRONMENTS, env=JUDGE_OFF)


def new_token() -> str:
    return f"agentic_session_shard_0.session-math{next(_tokens):04d}"


def session_input(environment: str, row: dict[str, Any]) -> dict[str, Any]:
    converted = converted_row(make_plugin_manager().environments.get(environment), row)
    return {"messages": converted["input"], "metadata": converted["metadata"]}


def trial_request(policy: PolicyByToken, environment: str, row: dict[str, Any], *, token: str) -> Any:
    body = {
        "protocol_version": PROTOCOL_VERSION,
        "request_id": f"relax-e2e-{token}",
        "session": {"session_id": token, "group_id": "e2e", "rollout_mode": "train"},
        "environment": {
            "name": environment,
            "config": CONFIGS[environment],
            "task": session_input(environment, row),
        },
        "model_endpoint": {"base_url": policy.server.base_url, "api_key": token, "model": "policy-alias"},
        "interrupt_policy": "protected",
        "deadline_s": 120,
        "lease_s": 60,
    }
    return parse_create_request(json.dumps(body))


async def settled_trial(stack: GatewayProcess, request: Any) -> tuple[Any, Any]:
    """The trial's terminal snapshot and, after it, its settled one (cleanup verdict proven)."""
    async with GatewayClient(stack.url, options=OPTIONS) as client:
        snapshot = await run_trial(request, client=client)
        settled = await client.settled(request.request_id, timeout_s=60)
    return snapshot, settled


def benchmark_row() -> dict[str, Any]:
    """A gsm8k row as NeMo Gym's prepare.py writes it (an int answer), from a real upstream row."""
    row = numeric_example_rows()[0]
    return {"question": row["question"], "expected_answer": int(row["expected_answer"])}


async def test_a_gsm8k_benchmark_row_answered_right_scores_one(
    policy: PolicyByToken, stack: GatewayProcess
) -> None:
    row, token = benchmark_row(), new_token()
    policy.behaviours[token] = lambda _request: reply_text("Counting carefully, the answer is \\boxed{32}.")
    snapshot, settled = await settled_trial(stack, trial_request(policy, "gsm8k", row, token=token))
    assert (snapshot.status.value, snapshot.reward, snapshot.error) == ("completed", 1.0, None)
    assert snapshot.cleanup in ("pending", "confirmed")  # never unverified: nothing to prove
    assert settled.cleanup == "confirmed"  # stateless: confirmed without any cleanup call
    assert snapshot.metrics["library_reward"] == 1.0
    assert snapshot.metrics["judge_calls"] == 0
    (seen,) = policy.requests_of(token)  # exactly one model call: no tools, one generation
    assert seen.model == "policy-alias"
    assert seen.body["input"] == session_input("gsm8k", row)["messages"]
    assert "inside \\boxed{}" in seen.body["input"][0]["content"]
    assert not seen.body.get("tools")
    assert "relax_gym_rollout" not in seen.raw_body.decode()


async def test_a_wrong_number_scores_zero_with_cleanup_confirmed(
    policy: PolicyByToken, stack: GatewayProcess
) -> None:
    token = new_token()
    policy.behaviours[token] = lambda _request: reply_text("The answer is \\boxed{31}.")
    snapshot, settled = await settled_trial(
        stack, trial_request(policy, "gsm8k", benchmark_row(), token=token)
    )
    assert (snapshot.status.value, snapshot.reward, snapshot.error) == ("completed", 0.0, None)
    assert settled.cleanup == "confirmed"


async def test_an_original_gsm8k_row_runs_too(policy: PolicyByToken, stack: GatewayProcess) -> None:
    source = numeric_example_rows()[4]
    row = {"question": source["question"], "answer": "Work it out.\n#### -3"}
    token = new_token()
    policy.behaviours[token] = lambda _request: reply_text("\\boxed{-3}")
    snapshot, _ = await settled_trial(stack, trial_request(policy, "gsm8k", row, token=token))
    assert snapshot.reward == 1.0


async def test_math_with_judge_rows_scored_by_the_oracle_from_probes(
    policy: PolicyByToken, stack: GatewayProcess
) -> None:
    """The oracle `make demo` could use: each row's known-good probe answer -> 1.0; known-bad -> 0.0."""
    probes = list(make_plugin_manager().environments.get("math_with_judge").verifier_probes())
    right, wrong = OracleScript(probes), OracleScript(probes, reward=0.0)
    rows = example_rows()
    cases = [(row, right, 1.0) for row in rows] + [(rows[2], wrong, 0.0)]  # \frac{333}{1997}
    tokens = [new_token() for _ in cases]
    for token, (_, script, _) in zip(tokens, cases, strict=True):
        policy.behaviours[token] = script
    results = await asyncio.gather(
        *(
            settled_trial(stack, trial_request(policy, "math_with_judge", row, token=token))
            for token, (row, _, _) in zip(tokens, cases, strict=True)
        )
    )
    assert [snapshot.reward for snapshot, _ in results] == [expected for _, _, expected in cases]
    assert {settled.cleanup for _, settled in results} == {"confirmed"}
    for token in tokens:
        assert len(policy.requests_of(token)) == 1


def test_the_thin_client_as_relax_launches_it(
    policy: PolicyByToken, stack: GatewayProcess, tmp_path: Path
) -> None:
    """`relax-gym-client` with the recipe's variables (NEMO_GYM_ENVIRONMENT=gsm8k ...) writes the reward."""
    token = new_token()
    policy.behaviours[token] = lambda _request: reply_text("\\boxed{32}")
    io_dir = tmp_path / "relax-agentic-command-1"
    io_dir.mkdir()
    (io_dir / "session_input.json").write_text(json.dumps(session_input("gsm8k", benchmark_row())))
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
        "NEMO_GYM_ENVIRONMENT": "gsm8k",
        "NEMO_GYM_CONFIG": "gsm8k-v1",
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
    assert output["reward"] == 1.0
    assert output["metadata"]["nemo_gym"]["status"] == "completed"
    assert output["metadata"]["nemo_gym"]["cleanup"] in ("pending", "confirmed")
    assert [r.model for r in policy.requests_of(token)] == ["model"]
