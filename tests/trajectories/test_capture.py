"""Trajectories through a real gateway process: every model call of a trial (plain and streamed, all three
APIs) is kept in order with the run's request and answer, served once the trial ends, named by the
snapshot's artifact_ref, cut at the cap, kept across a restart, and never holds a secret."""

from __future__ import annotations

import contextlib
import itertools
import sqlite3
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from relax_gym_core.testing.processes import GatewayProcess, start_gateway
from relax_gym_core.testing.web import ScriptedPolicy

ECHO = {"echo": {"environment": "echo", "runtime": "echo", "max_concurrency": 8, "queue_capacity": 8}}
API_KEY = "sk-trajectory-secret-0001"
SESSION = "session-trajectory-secret-0002"
SAFETY_S = 60.0
_ids = itertools.count()


def trial_body(policy: ScriptedPolicy, echo: dict[str, Any]) -> dict[str, Any]:
    return {
        "protocol_version": "relax-nemo-gym/v1",
        "request_id": f"trajectory-{next(_ids)}",
        "session": {"session_id": SESSION, "group_id": "g", "rollout_mode": "train"},
        "environment": {
            "name": "echo",
            "config": "echo",
            "task": {"messages": [{"role": "user", "content": "hello"}], "metadata": {"echo": echo}},
        },
        "model_endpoint": {"base_url": policy.base_url, "api_key": API_KEY, "model": "alias"},
        "interrupt_policy": "protected",
    }


def finished(gateway: GatewayProcess, body: dict[str, Any]) -> dict[str, Any]:
    assert httpx.post(f"{gateway.url}/v1/trials", json=body, trust_env=False).status_code == 202
    stop = time.monotonic() + SAFETY_S
    while True:
        snapshot: dict[str, Any] = httpx.get(
            f"{gateway.url}/v1/trials/{body['request_id']}", trust_env=False
        ).json()
        if snapshot["status"] not in ("queued", "running") or time.monotonic() > stop:
            return snapshot
        time.sleep(0.05)


def trajectory(gateway: GatewayProcess, request_id: str) -> httpx.Response:
    return httpx.get(f"{gateway.url}/v1/trials/{request_id}/trajectory", trust_env=False)


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trajectory-state")


@pytest.fixture(scope="module")
def policy() -> Iterator[ScriptedPolicy]:
    with ScriptedPolicy() as policy:
        yield policy


@pytest.fixture(scope="module")
def gateway(state_dir: Path, policy: ScriptedPolicy) -> Iterator[GatewayProcess]:
    with start_gateway(ECHO, state_dir=state_dir) as gateway:
        yield gateway


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_every_model_call_is_kept_in_order_with_the_run(
    gateway: GatewayProcess, policy: ScriptedPolicy, api: str, stream: bool
) -> None:
    body = trial_body(policy, {"model": {"api": api, "calls": 2, "stream": stream}, "reward": 0.5})
    snapshot = finished(gateway, body)
    assert snapshot["status"] == "completed"
    assert snapshot["artifact_ref"] == f"/v1/trials/{body['request_id']}/trajectory"
    response = trajectory(gateway, body["request_id"])
    assert response.status_code == 200, response.text
    document = response.json()
    assert document["format"] == "relax-gym/trajectory-v1"
    assert (document["request_id"], document["environment"], document["status"]) == (
        body["request_id"],
        "echo",
        "completed",
    )
    assert document["run"]["request"] == body["environment"]["task"]  # what the environment got
    assert document["run"]["answer"]["reward"] == 0.5
    assert document["result"]["reward"] == 0.5
    calls = document["model_calls"]
    assert [call["resource"] for call in calls] == [{"chat": "chat/completions"}.get(api, api)] * 2
    assert all(call["status"] == 200 and call["attempts"] == 1 for call in calls)
    # The body as sent upstream: the trial's model name in place of the agent's.
    assert all(call["request"]["model"] == "alias" for call in calls)
    assert all(call.get("streamed", False) is stream for call in calls)
    text = {"chat": answer_text_chat, "responses": answer_text_responses, "messages": answer_text_messages}[
        api
    ]
    # A streamed answer is folded into the object the plain call answers: the same text either way.
    assert [text(call["response"]) for call in calls] == ["ok"] * 2
    assert all(call["usage"]["input_tokens"] > 0 and call["usage"]["output_tokens"] > 0 for call in calls)
    counts = document["counts"]
    assert (counts["model_calls"], counts["answered_calls"]) == (2, 2)
    assert counts["input_tokens"] == sum(call["usage"]["input_tokens"] for call in calls)


def answer_text_chat(answer: dict[str, Any]) -> str:
    return str(answer["choices"][0]["message"]["content"])


def answer_text_responses(answer: dict[str, Any]) -> str:
    message = next(item for item in answer["output"] if item["type"] == "message")
    return "".join(part["text"] for part in message["content"] if part["type"] == "output_text")


def answer_text_messages(answer: dict[str, Any]) -> str:
    return "".join(block["text"] for block in answer["content"] if block["type"] == "text")


def test_a_running_trial_has_no_trajectory_yet_and_an_aborted_one_has_its_calls(
    gateway: GatewayProcess, policy: ScriptedPolicy
) -> None:
    body = trial_body(policy, {"model": {"api": "chat", "calls": 1}, "sleep_s": 600})
    assert httpx.post(f"{gateway.url}/v1/trials", json=body, trust_env=False).status_code == 202
    stop = time.monotonic() + SAFETY_S
    while not any(r.bearer == API_KEY and r.resource for r in policy.requests[-8:]):
        assert time.monotonic() < stop, "the trial never called its model"
        time.sleep(0.05)
    early = trajectory(gateway, body["request_id"])
    assert early.status_code == 404
    assert "its trajectory comes when it ends" in early.json()["detail"]
    url = f"{gateway.url}/v1/trials/{body['request_id']}/abort"
    assert httpx.post(url, trust_env=False).status_code == 202
    stop = time.monotonic() + SAFETY_S
    while (late := trajectory(gateway, body["request_id"])).status_code != 200:
        assert time.monotonic() < stop, late.text
        time.sleep(0.05)
    document = late.json()
    assert document["status"] == "aborted"
    assert len(document["model_calls"]) == 1
    assert "answer" not in document["run"]  # it never answered


def test_an_unknown_trial_has_no_trajectory(gateway: GatewayProcess) -> None:
    response = trajectory(gateway, "no-such-trial")
    assert response.status_code == 404


def test_no_secret_reaches_the_state_directory(
    gateway: GatewayProcess, policy: ScriptedPolicy, state_dir: Path
) -> None:
    # The run's request carries the secrets (an agent echoing its configuration): they are replaced.
    body = trial_body(policy, {"model": {"api": "responses", "calls": 1}, "leak": [API_KEY, SESSION]})
    assert finished(gateway, body)["status"] == "completed"
    document = trajectory(gateway, body["request_id"]).json()
    assert document["run"]["request"]["metadata"]["echo"]["leak"] == ["[redacted]", "[redacted]"]
    files = [path for path in state_dir.rglob("*") if path.is_file()]
    assert (state_dir / "trajectories" / "trajectories.sqlite3").stat().st_mode & 0o777 == 0o600
    for path in files:
        for data in [path.read_bytes(), *stored_records(path)]:
            assert API_KEY.encode() not in data, path
            assert SESSION.encode() not in data, path


def stored_records(path: Path) -> list[bytes]:
    """Every trajectory record of a trajectory database, decompressed (a grep of the file misses those)."""
    if path.name != "trajectories.sqlite3":
        return []
    with contextlib.closing(sqlite3.connect(path)) as connection:
        rows = connection.execute("SELECT compressed, data FROM trajectories").fetchall()
    return [zlib.decompress(data) if compressed else data for compressed, data in rows]


def test_a_cap_cuts_bodies_with_a_marker_saying_how_much(policy: ScriptedPolicy) -> None:
    env = {"RELAX_GYM_TRAJECTORY_MAX_BYTES": "800"}
    with start_gateway(ECHO, env=env) as small:
        body = trial_body(policy, {"model": {"api": "chat", "calls": 6}})
        assert finished(small, body)["status"] == "completed"
        document = trajectory(small, body["request_id"]).json()
    calls = document["model_calls"]
    assert len(calls) == 6  # every call is listed, in order
    cut = [call for call in calls if call["request"].get("truncated") is True]
    assert cut and calls[0] not in cut  # the first ones fit, the later ones were cut
    assert all(call["request"]["bytes"] > 0 for call in cut)
    assert document["truncated_bytes"] >= sum(call["request"]["bytes"] for call in cut)


def test_trajectories_outlive_a_restart_and_can_be_switched_off(
    policy: ScriptedPolicy, tmp_path: Path
) -> None:
    with start_gateway(ECHO, state_dir=tmp_path) as first:
        body = trial_body(policy, {"model": {"api": "messages", "calls": 1}})
        assert finished(first, body)["status"] == "completed"
        kept = trajectory(first, body["request_id"]).json()
    with start_gateway(ECHO, state_dir=tmp_path, env={"RELAX_GYM_TRAJECTORIES": "off"}) as off:
        refused = trajectory(off, body["request_id"])
        assert refused.status_code == 404
        assert "RELAX_GYM_TRAJECTORIES=off" in refused.json()["detail"]
        other = trial_body(policy, {"model": {"api": "messages", "calls": 1}})
        assert finished(off, other)["artifact_ref"] is None
    with start_gateway(ECHO, state_dir=tmp_path) as second:
        again = trajectory(second, body["request_id"]).json()
        assert trajectory(second, other["request_id"]).status_code == 404  # none was kept while off
    assert again["model_calls"] == kept["model_calls"]


def many(gateway: GatewayProcess, *request_ids: str) -> httpx.Response:
    query = "&".join(f"request_id={request_id}" for request_id in request_ids)
    return httpx.get(f"{gateway.url}/v1/trajectories?{query}", trust_env=False)


def test_many_trajectories_come_in_one_answer_as_each_alone(
    gateway: GatewayProcess, policy: ScriptedPolicy
) -> None:
    bodies = [trial_body(policy, {"model": {"api": "chat", "calls": calls}}) for calls in (1, 2, 3)]
    ended = [body["request_id"] for body in bodies if finished(gateway, body)["status"] == "completed"]
    running = trial_body(policy, {"sleep_s": 600})
    assert httpx.post(f"{gateway.url}/v1/trials", json=running, trust_env=False).status_code == 202
    try:
        answer = many(gateway, *ended, running["request_id"], "no-such-trial", ended[0])
        assert answer.status_code == 200, answer.text
        document = answer.json()
        assert list(document["trajectories"]) == ended  # in the order asked, each once
        for request_id in ended:
            assert document["trajectories"][request_id] == trajectory(gateway, request_id).json()
        assert [len(document["trajectories"][r]["model_calls"]) for r in ended] == [1, 2, 3]
        assert set(document["missing"]) == {running["request_id"], "no-such-trial"}
        assert "its trajectory comes when it ends" in document["missing"][running["request_id"]]
        assert document["deferred"] == []
    finally:
        httpx.post(f"{gateway.url}/v1/trials/{running['request_id']}/abort", trust_env=False)


@pytest.mark.parametrize("count", [0, 257])
def test_many_trajectories_are_asked_for_1_to_256_at_once(gateway: GatewayProcess, count: int) -> None:
    refused = many(gateway, *(f"t-{index}" for index in range(count)))
    assert refused.status_code == 422
    assert refused.json()["detail"] == f"request_id: ask for 1 to 256 trials at once, got {count}"
