"""A failure the environment reports in its answer ends the trial failed by name, through the whole path: a
real `relax-gym serve`, real thin client processes, and an agent that answers /run as NeMo Gym's
simple_agent passes on its resources server's /verify answer (its verify response models allow extra keys,
at 0.4.0, v0.5.0 and main). The answers are the shapes NeMo Gym writes: v0.5.0's judge failsafe (HTTP 200,
reward 0.0, `_ng_failure_class`), 0.7.0's top-level `mask_sample` with `failure_kind`/`failure_reason`
(#2611, past the snapshot this machine has), swe_agents' `instance_config.mask_sample`, and 0.7.0's
"degraded but valid" score (`mask_sample: false` beside a `failure_kind`), which stands.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from relax_gym_core.client import stable_request_id
from relax_gym_core.testing.web import GatewayProcess, ThreadedServer, start_gateway

SAFETY_S = 60  # guards against hangs only
CLIENT = str(Path(sys.executable).with_name("relax-gym-client"))
OUTPUT = [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "4"}]}]


def answer_of(shape: str, rollout_id: str) -> dict[str, Any]:
    scored = {"response": {"id": "resp_1", "output": OUTPUT}, "reward": 1.0, "_ng_rollout_id": rollout_id}
    judge_url = f"http://127.0.0.1:9/ng-rollout/{rollout_id}/v1/responses"  # observability prefixes it
    return {
        "judge_failed": {
            **scored,
            "reward": 0.0,
            "_ng_failure_class": "judge_failed",
            "_ng_failure_judge_error": f"HTTPStatusError: Server error '500' for url '{judge_url}'",
        },
        "masked": {
            **scored,
            "mask_sample": True,
            "failure_kind": "agent_timeout",
            "failure_reason": "the agent ran out of its 3900 s",
        },
        "swe_masked": {**scored, "mask_sample": False, "instance_config": {"mask_sample": True}},
        "degraded": {
            **scored,
            "mask_sample": False,
            "failure_kind": "judge_retried",
            "failure_reason": "2nd try",
        },
        "plain": {**scored, "reward": 0.0},
    }[shape]


async def run(request: Request) -> JSONResponse:
    body = await request.json()
    return JSONResponse(answer_of(body["shape"], body["_ng_rollout_id"]))


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    agent = ThreadedServer(Starlette(routes=[Route("/run", run, methods=["POST"])]))
    agent.start()
    spec = {
        "reporting-v1": {
            "environment": "reporting",
            "agent_name": "reporting_agent",
            "agent_url": agent.url,
            "stateless": True,
        }
    }
    try:
        with start_gateway(spec) as process:
            yield process
    finally:
        agent.stop()


def session(
    gateway: GatewayProcess, tmp_path: Path, shape: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    io_dir = tmp_path / shape
    io_dir.mkdir()
    task = {"messages": [{"role": "user", "content": "2 + 2?"}], "metadata": {"shape": shape}}
    (io_dir / "session_input.json").write_text(json.dumps(task))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RELAX_", "NEMO_GYM_", "OPENAI_"))}
    environ = {
        **base,
        "RELAX_SESSION_ID": f"session-token-{shape}",
        "RELAX_SESSION_IO_DIR": str(io_dir),
        "RELAX_BASE_URL": "http://127.0.0.1:9/v1",  # never called: the agent asks no model
        "RELAX_INPUT_JSON": str(io_dir / "session_input.json"),
        "RELAX_OUTPUT_JSON": str(io_dir / "session_output.json"),
        "NEMO_GYM_URL": gateway.url,
        "NEMO_GYM_ENVIRONMENT": "reporting",
        "NEMO_GYM_CONFIG": "reporting-v1",
        "NEMO_GYM_POLL_INTERVAL_S": "0.05",
    }
    done = subprocess.run(
        [CLIENT], env=environ, capture_output=True, text=True, timeout=SAFETY_S, check=False
    )
    return done, io_dir


@pytest.mark.parametrize(
    ("shape", "kind", "reason"),
    [
        ("judge_failed", "judge_failed", "HTTPStatusError: Server error '500' for url"),
        ("masked", "masked:agent_timeout", "the agent ran out of its 3900 s"),
        ("swe_masked", "masked", None),
    ],
)
def test_a_reported_failure_is_never_a_reward_and_the_client_says_which(
    gateway: GatewayProcess, tmp_path: Path, shape: str, kind: str, reason: str | None
) -> None:
    done, io_dir = session(gateway, tmp_path, shape)
    assert done.returncode != 0
    assert not (io_dir / "session_output.json").exists()  # Relax drops the group: no reward to train on
    assert done.stderr.strip().endswith(
        f"Remote trial failed with error code 'agent_error' (kind '{kind}')"
    ), done.stderr
    request_id = stable_request_id(f"session-token-{shape}", 1, invocation_id=str(io_dir))
    snapshot = httpx.get(f"{gateway.url}/v1/trials/{request_id}", trust_env=False, timeout=SAFETY_S).json()
    assert (snapshot["status"], snapshot["reward"]) == ("failed", None)
    error = snapshot["error"]
    assert (error["code"], error["kind"]) == ("agent_error", kind)
    if reason is None:
        assert "reason" not in error
    else:
        assert error["reason"].startswith(reason)
    # The rollout id (the trial's live bridge key) never leaves in a reason, even where the answer quotes it.
    assert not re.search(r"[0-9a-f]{32}-0", json.dumps(snapshot))


def test_a_degraded_but_valid_score_stands_with_its_kind_in_the_metrics(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    done, io_dir = session(gateway, tmp_path, "degraded")
    assert done.returncode == 0, done.stderr
    output = json.loads((io_dir / "session_output.json").read_text())
    assert output["reward"] == 1.0
    assert output["metadata"]["nemo_gym"]["metrics"]["failure_kind"] == "judge_retried"


def test_metrics_count_unscored_trials_by_kind(gateway: GatewayProcess, tmp_path: Path) -> None:
    for shape in ("judge_failed", "plain"):
        session(gateway, tmp_path, shape)
    deadline = time.monotonic() + SAFETY_S
    text = ""
    while time.monotonic() < deadline:
        text = httpx.get(f"{gateway.url}/metrics", trust_env=False, timeout=SAFETY_S).text
        if 'kind="judge_failed"' in text:
            break
        time.sleep(0.05)
    failures = [line for line in text.splitlines() if line.startswith("relax_gym_trial_failures_total{")]
    judged = [line for line in failures if 'kind="judge_failed"' in line]
    assert (
        len(judged) == 1 and 'environment="reporting"' in judged[0] and 'config="reporting-v1"' in judged[0]
    )
    assert float(judged[0].rsplit(" ", 1)[1]) >= 1
    assert not any('kind="completed"' in line for line in failures)  # a plain 0.0 is a score, not a failure
