"""An answer math-verify did not decide fails, never scores 0, against REAL servers: this module's own
`relax-gym up math_with_judge` with a verify bound no check can meet (0.001 s: its resources server, the
plugin's subclass, stops every check), and the session's shared verifier (upstream's 10 s bound) for the
answers math-verify does decide."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from relax_gym_core.plugin import message, verify_body
from relax_gym_core.protocol import PROTOCOL_VERSION, CleanupState, TrialSnapshot, parse_snapshot
from relax_gym_core.testing import Hooks, converted_row, reply_text
from relax_gym_core.testing.gym import Verifier
from relax_gym_core.testing.web import GatewayProcess, PolicyByToken

from relax_gym_gsm8k import plugin
from relax_gym_gsm8k.judge import API_KEY_VAR, MODEL_VAR, URL_VAR, VERIFY_TIMEOUT_VAR

BOUND_S = "0.001"
HURRIED = {**dict.fromkeys((URL_VAR, MODEL_VAR, API_KEY_VAR), ""), VERIFY_TIMEOUT_VAR: BOUND_S}
pytestmark = pytest.mark.e2e
SAFETY_S = 120


@pytest.fixture(scope="module")
def hurried(relax_gym_up: Callable[..., GatewayProcess]) -> GatewayProcess:
    return relax_gym_up(plugin.MATH, env=HURRIED)


def resources_url(gateway: GatewayProcess) -> str:
    """The math_with_judge resources server of the `up` (from the lines it printed)."""
    for line in gateway.output:
        match = re.match(rf"NeMo Gym server {plugin.MATH_RESOURCES} at (\S+)", line)
        if match:
            return match.group(1)
    raise AssertionError("resources server address not printed:\n" + "\n".join(gateway.output))


def post(url: str, row: dict[str, Any], text: str) -> httpx.Response:
    body = verify_body(row, [message(text)])
    return httpx.post(f"{url}/verify", json=body, timeout=120, trust_env=False)


def settled_trial(gateway: GatewayProcess, policy: PolicyByToken, task: dict[str, Any]) -> TrialSnapshot:
    """A math_with_judge trial whose one model call answers `\\boxed{32}`, over the wire protocol: its
    snapshot once terminal and its cleanup settled."""
    token = "agentic_session_shard_0.session-undecided0"
    policy.behaviours[token] = lambda _request: reply_text("Counting carefully, the answer is \\boxed{32}.")
    request = {
        "protocol_version": PROTOCOL_VERSION,
        "request_id": f"relax-undecided-{token}",
        "session": {"session_id": token, "group_id": "undecided", "rollout_mode": "train"},
        "environment": {"name": plugin.MATH, "config": "math-with-judge-v1", "task": task},
        "model_endpoint": {"base_url": policy.server.base_url, "api_key": token, "model": "policy"},
        "interrupt_policy": "protected",
        "deadline_s": 120,
        "lease_s": 60,
    }
    with httpx.Client(base_url=gateway.url, timeout=30, trust_env=False) as client:
        client.post("/v1/trials", json=request).raise_for_status()
        guard = time.monotonic() + SAFETY_S  # against a hang only
        while time.monotonic() < guard:
            answer = client.get(f"/v1/trials/{request['request_id']}")
            snapshot = parse_snapshot(answer.raise_for_status().json(), request_id=request["request_id"])
            if snapshot.status.is_terminal and snapshot.cleanup != CleanupState.PENDING:
                return snapshot
            time.sleep(0.05)
    raise AssertionError(f"trial {request['request_id']} did not settle")


@pytest.mark.nemo_gym(plugin.MATH, env=HURRIED)
def test_a_right_answer_whose_check_is_stopped_fails_instead_of_scoring_zero(
    hurried: GatewayProcess, math_rows: list[dict[str, Any]], hooks: Hooks
) -> None:
    # /verify itself: upstream's class answers 200 with reward 0.0 here, as for a wrong answer.
    answer = post(resources_url(hurried), math_rows[0], "\\boxed{32}")
    assert answer.status_code == 503, answer.text
    assert "reward" not in answer.json()
    detail = answer.json()["detail"]
    assert f"answer not scored: math-verify's check did not finish within {BOUND_S} s" in detail
    assert VERIFY_TIMEOUT_VAR in detail  # how to widen it
    # A trial through the gateway and the agent's /run: failed, no reward, never a 0.
    converted = converted_row(hooks.environments.get(plugin.MATH), math_rows[0])
    task = {"messages": converted["input"], "metadata": converted["metadata"]}
    with PolicyByToken(default=lambda _request: reply_text("unexpected session")) as policy:
        settled = settled_trial(hurried, policy, task)
    assert (settled.status.value, settled.reward, settled.error) == ("failed", None, {"code": "agent_error"})
    assert settled.cleanup == "confirmed"


@pytest.mark.nemo_gym(plugin.MATH)
def test_decided_answers_keep_upstreams_rewards(
    relax_gym_verifier: Callable[..., Verifier], math_rows: list[dict[str, Any]]
) -> None:
    url = relax_gym_verifier(plugin.MATH).url
    right, wrong = post(url, math_rows[0], "\\boxed{32}"), post(url, math_rows[0], "\\boxed{33}")
    assert (right.status_code, right.json()["reward"], right.json()["library_reward"]) == (200, 1.0, 1.0)
    assert (wrong.status_code, wrong.json()["reward"]) == (200, 0.0)
