"""`relax-gym rollout` as a user runs it, against the built-in echo environment: a real `relax-gym serve`
(or the gateway the command starts itself), a real policy server, the real CLI in a subprocess."""

from __future__ import annotations

import gzip
import json
import os
import signal
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route

from relax_gym_core.rollout.store import load_trajectories
from relax_gym_core.testing.web import GatewayProcess, ScriptedPolicy, serve_in_thread

from .conftest import SECRET, echo_row, metric, relax_gym, start_relax_gym, trial_lines, write_rows

pytestmark = pytest.mark.e2e  # the real CLI

KEY_ENV = {**os.environ, "POLICY_KEY": SECRET}


def test_every_row_runs_k_times_and_failures_stay_out_of_the_mean(
    tmp_path: Path, echo_gateway: GatewayProcess, policy: ScriptedPolicy
) -> None:
    rows = [
        echo_row("solved", reward=1.0),
        echo_row("wrong", reward=0.0),
        echo_row("partial, asks the model twice", reward=0.5, model={"api": "chat", "calls": 2}),
        echo_row("crashes", fail=True),
    ]
    data = write_rows(tmp_path / "data.jsonl", rows)
    out = tmp_path / "out"
    calls_before = len(policy.model_requests())
    result = relax_gym(
        "rollout", "echo", "--data", str(data), "--policy", policy.base_url, "--api-key-env", "POLICY_KEY",
        "--repeats", "3", "--concurrency", "4", "--out", str(out), "--gateway", echo_gateway.url,
        env=KEY_ENV,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = trial_lines(out)
    assert sorted((line["row"], line["repeat"]) for line in lines) == [
        (row, repeat) for row in range(1, 5) for repeat in range(1, 4)
    ]
    by_row = {line["row"]: line for line in lines}
    assert [by_row[row]["reward"] for row in (1, 2, 3)] == [1.0, 0.0, 0.5]
    crashed = [line for line in lines if line["row"] == 4]
    assert {(line["status"], line["reward"], line["failure_kind"]) for line in crashed} == {
        ("failed", None, "agent_error")
    }
    assert {line["cleanup"] for line in lines} == {"confirmed"}
    assert {line["model_calls"] for line in lines if line["row"] == 3} == {2}
    assert all(line["request_id"].startswith("rollout-") and line["timings"]["total_s"] > 0 for line in lines)

    summary = json.loads((out / "summary.json").read_text())
    echo = summary["environments"]["echo"]
    assert (summary["planned"], summary["finished"], summary["complete"]) == (12, 12, True)
    assert (echo["trials"], echo["scored"], echo["infra_failures"]) == (12, 9, 3)
    assert echo["failures_by_kind"] == {"agent_error": 3}
    assert echo["mean_reward"] == pytest.approx(0.5)  # (1 + 0 + 0.5) / 3: the crashes are not zeros
    assert echo["pass_at_k"] == {
        "1": pytest.approx(1 / 3),
        "2": pytest.approx(1 / 3),
        "3": pytest.approx(1 / 3),
    }
    assert summary["overall"]["mean_reward"] == pytest.approx(0.5)
    assert "mean reward 0.500 over 9 scored" in result.stdout

    # Each trial's trajectory is kept beside its line, and the line says what it amounts to.
    trajectories = load_trajectories(out)
    assert set(trajectories) == {line["request_id"] for line in lines}
    asked = [line for line in lines if line["row"] == 3]
    assert {(line["answered_calls"], line["input_tokens"], line["output_tokens"]) for line in asked} == {
        (2, 22, 14)
    }
    assert all(len(trajectories[line["request_id"]]["model_calls"]) == 2 for line in asked)
    assert {line["stop_reason"] for line in crashed} == {"env_error:agent_error"}
    assert {line["stop_reason"] for line in lines if line["row"] != 4} == {"completed"}
    assert echo["answered_calls"]["max"] == 2 and echo["tokens"]["max"] == 36

    # The key went to the policy (through the gateway's bridge) and nowhere else.
    bridged = policy.model_requests()[calls_before:]
    assert len(bridged) == 6 and {request.bearer for request in bridged} == {SECRET}
    for path in out.iterdir():
        data = path.read_bytes()
        assert SECRET.encode() not in (gzip.decompress(data) if path.suffix == ".gz" else data), path
    assert SECRET not in result.stdout + result.stderr


def test_a_mixed_file_routes_rows_through_a_gateway_the_command_starts(
    tmp_path: Path, policy: ScriptedPolicy
) -> None:
    """No ENV and no --gateway: each row goes where its mix tag says, through the command's own gateway,
    whose callback allowlist lets exactly the policy's host in."""
    tagged = {"environment": "echo", "config": "echo"}
    rows = [
        {"input": [{"role": "user", "content": "a"}], "metadata": {**tagged, "echo": {"reward": 1.0}}},
        {
            "input": [{"role": "user", "content": "b"}],
            "metadata": {**tagged, "echo": {"reward": 0.25, "model": {"api": "responses", "calls": 3}}},
        },
    ]
    data = write_rows(tmp_path / "mixed.jsonl", rows)
    out = tmp_path / "out"
    env = {k: v for k, v in KEY_ENV.items() if not k.startswith("NEMO_GYM_CALLBACK_")}
    result = relax_gym(
        "rollout", "--data", str(data), "--policy", policy.base_url, "--api-key-env", "POLICY_KEY",
        "--repeats", "2", "--out", str(out), env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = trial_lines(out)
    assert sorted((line["row"], line["reward"], line["model_calls"]) for line in lines) == [
        (1, 1.0, 0), (1, 1.0, 0), (2, 0.25, 3), (2, 0.25, 3),
    ]  # fmt: skip
    # The command's own gateway reports each trial's phases.
    assert all({"queued_s", "running_s"} <= set(line["timings"]) for line in lines)
    assert SECRET not in (out / "gateway.log").read_text()


def test_resume_after_kill_9_skips_finished_trials_and_replays_the_running_ones(
    tmp_path: Path, echo_gateway: GatewayProcess, policy: ScriptedPolicy
) -> None:
    rows = [echo_row(f"task {i}", reward=float(i % 2), sleep_s=0.3) for i in range(12)]
    data = write_rows(tmp_path / "data.jsonl", rows)
    out = tmp_path / "out"
    args = (
        "rollout", "echo", "--data", str(data), "--policy", policy.base_url, "--repeats", "2",
        "--concurrency", "4", "--out", str(out), "--gateway", echo_gateway.url,
    )  # fmt: skip
    created_before = metric(echo_gateway, "relax_gym_trials_created_total", environment="echo")
    process = start_relax_gym(*args)
    trials = out / "trials.jsonl"
    deadline = time.monotonic() + 120
    while not (trials.exists() and len(trials.read_bytes().splitlines()) >= 6):
        assert process.poll() is None and time.monotonic() < deadline, "no trial finished"
        time.sleep(0.05)
    process.kill()  # SIGKILL: no clean-up of any kind; trials are still running on the gateway
    process.communicate()
    kept = trials.read_bytes()
    # What a kill in the middle of a write would leave: a line without its end.
    trials.write_bytes(kept + b'{"row": 7, "repeat": 1, "row_dig')

    resumed = relax_gym(*args)
    assert resumed.returncode == 0, resumed.stderr
    assert "cut a torn last line" in resumed.stderr
    assert trials.read_bytes().startswith(kept)  # finished lines are never rewritten
    lines = trial_lines(out)
    assert Counter((line["row"], line["repeat"]) for line in lines) == {
        (row, repeat): 1 for row in range(1, 13) for repeat in (1, 2)
    }
    assert [line["reward"] for line in sorted(lines, key=lambda line: line["row"])][::2] == [
        float(i % 2) for i in range(12)
    ]
    # Same request ids: the trials in flight at the kill were joined, not run a second time.
    created = metric(echo_gateway, "relax_gym_trials_created_total", environment="echo") - created_before
    assert created == 24
    assert json.loads((out / "summary.json").read_text())["complete"] is True


def test_ctrl_c_aborts_running_trials_keeps_finished_ones_and_says_how_to_resume(
    tmp_path: Path, echo_gateway: GatewayProcess, policy: ScriptedPolicy
) -> None:
    rows = [echo_row(f"quick {i}", reward=1.0) for i in range(3)]
    rows += [echo_row(f"slow {i}", reward=1.0, sleep_s=600) for i in range(3)]
    data = write_rows(tmp_path / "data.jsonl", rows)
    out = tmp_path / "out"
    confirmed_before = metric(
        echo_gateway, "relax_gym_trial_cleanups_total", environment="echo", outcome="confirmed"
    )
    process = start_relax_gym(
        "rollout", "echo", "--data", str(data), "--policy", policy.base_url, "--concurrency", "6",
        "--out", str(out), "--gateway", echo_gateway.url,
    )  # fmt: skip
    trials = out / "trials.jsonl"
    deadline = time.monotonic() + 120
    while not (trials.exists() and len(trials.read_bytes().splitlines()) == 3 and running(echo_gateway) == 3):
        assert process.poll() is None and time.monotonic() < deadline, "the slow trials never ran"
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)

    assert process.returncode == 130, stderr
    assert running(echo_gateway) == 0  # no trial left running
    confirmed = metric(
        echo_gateway, "relax_gym_trial_cleanups_total", environment="echo", outcome="confirmed"
    )
    assert confirmed - confirmed_before == 6  # the 3 finished and the 3 aborted, every cleanup confirmed
    assert "3 running trials aborted (cleanup confirmed for 3 of 3)" in stderr
    assert f"resume with: relax-gym rollout echo --data {data}" in stderr
    assert sorted(line["row"] for line in trial_lines(out)) == [1, 2, 3]  # what finished is kept
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["finished"], summary["planned"], summary["complete"]) == (3, 6, False)
    assert "Traceback" not in stderr + stdout


def running(gateway: GatewayProcess) -> int:
    return int(httpx.get(f"{gateway.url}/healthz", trust_env=False, timeout=30).json()["active_trials"])


def test_an_anthropic_style_endpoint_gets_its_key_as_x_api_key(
    tmp_path: Path, echo_gateway: GatewayProcess
) -> None:
    """A model list shaped like Anthropic's: the key goes the way Messages APIs read it (x-api-key)."""
    scripted = ScriptedPolicy()

    async def anthropic_models(request: Request) -> JSONResponse:
        if request.headers.get("x-api-key") != SECRET:
            return JSONResponse({"type": "error"}, status_code=401)
        model = {"type": "model", "id": "claude-like", "display_name": "Claude-like"}
        return JSONResponse(
            {"data": [model], "has_more": False, "first_id": "claude-like", "last_id": "claude-like"}
        )

    app = Starlette(routes=[Route("/agentic_api/v1/models", anthropic_models), Mount("/", app=scripted.app)])
    data = write_rows(
        tmp_path / "data.jsonl", [echo_row("hi", reward=1.0, model={"api": "messages", "calls": 1})]
    )
    with serve_in_thread(app) as server:
        result = relax_gym(
            "rollout", "echo", "--data", str(data), "--policy", f"{server.url}/agentic_api",
            "--api-key-env", "POLICY_KEY", "--out", str(tmp_path / "out"), "--gateway", echo_gateway.url,
            env=KEY_ENV,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "(model claude-like)" in result.stderr
    (call,) = scripted.model_requests("messages")
    assert call.headers["x-api-key"] == SECRET and "authorization" not in call.headers
    assert call.headers["anthropic-version"] == "2023-06-01"
    assert call.model == "claude-like"
    assert trial_lines(tmp_path / "out")[0]["reward"] == 1.0
