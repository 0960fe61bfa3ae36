"""reasoning_gym with the real Claude Code CLI end to end: `relax-gym up reasoning_gym` (NeMo Gym's
reasoning_gym resources server, our subclass of its claude_code_agent running Claude Code 2.1.237 with Bash
in bubblewrap, the gateway), the real thin client, and a scripted policy speaking streaming Anthropic
Messages behind the bridge (no LLM runs here).

One `up` is shared by the module (the session's relax_gym_up); each trial has its own session token and
the policy answers each request by the trial its token belongs to, turn by turn (the number of
tool_result blocks in the history). What a trial leaves behind is read from the machine: /proc and the
agent's trials directory.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from relax_gym_core.client import ClientOptions, GatewayClient, run_trial
from relax_gym_core.plugin import VerifierProbe
from relax_gym_core.plugin.host import converted_row, make_plugin_manager
from relax_gym_core.protocol import PROTOCOL_VERSION, parse_create_request
from relax_gym_core.testing import (
    Gate,
    OracleScript,
    RecordedRequest,
    ScriptedReply,
    ToolCall,
    reply_text,
    reply_tool_calls,
)
from relax_gym_core.testing.web import GatewayProcess, PolicyByToken

pytest.importorskip("relax_gym_reasoning_gym_cc")
from relax_gym_reasoning_gym_cc import claude
from relax_gym_reasoning_gym_cc.trials import MARKER, dir_prefix

ENV, CONFIG = "reasoning_gym", "reasoning-gym-cc-v1"
AGENT = "reasoning_gym_claude_code_agent_model_server"
pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.nemo_gym(ENV)]
OPTIONS = ClientOptions(poll_interval_s=0.05)
CLIENT = str(Path(sys.executable).with_name("relax-gym-client"))
SAFETY_S = 300  # guards against hangs only
QUESTION = "What is 6 * 7? Give the number only."
_tokens = itertools.count()

type Behaviour = Callable[[RecordedRequest], ScriptedReply]


def row(answer: str = "42") -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": QUESTION}]},
        "question": QUESTION,
        "answer": answer,
        "metadata": {"source_dataset": "basic_arithmetic", "source_index": 0, "expression": "6 * 7"},
    }


def tool_results(request: RecordedRequest) -> list[str]:
    """The tool_result blocks of a Messages request's history, as text."""
    found = []
    for message in request.body.get("messages", []) if isinstance(request.body, dict) else []:
        content = message.get("content")
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                inner = block.get("content")
                text = (
                    inner if isinstance(inner, str) else "".join(part.get("text", "") for part in inner or [])
                )
                found.append(text)
    return found


def steps(*replies: ScriptedReply) -> Behaviour:
    """Turn n (n tool results so far) gets replies[n]."""
    return lambda request: replies[min(len(tool_results(request)), len(replies) - 1)]


def bash(command: str) -> ScriptedReply:
    return reply_tool_calls(ToolCall("Bash", {"command": command, "description": "run it"}))


@pytest.fixture(scope="module")
def policy() -> Iterator[PolicyByToken]:
    with PolicyByToken(lambda _request: reply_text("<answer>0</answer>"), resource="messages") as holder:
        yield holder


@pytest.fixture(scope="module")
def stack(relax_gym_up: Callable[..., GatewayProcess]) -> GatewayProcess:
    return relax_gym_up(ENV)


@pytest.fixture(scope="module")
def agent_url(stack: GatewayProcess) -> str:
    return stack.server_url(AGENT)


def new_token() -> str:
    return f"agentic_session_shard_0.session-rgcc{next(_tokens):04d}"


def session_input(answer: str = "42") -> dict[str, Any]:
    converted = converted_row(make_plugin_manager().environments.get(ENV), row(answer))
    return {"messages": converted["input"], "metadata": converted["metadata"]}


def trial_request(policy: PolicyByToken, token: str, *, deadline_s: float = 600) -> Any:
    body = {
        "protocol_version": PROTOCOL_VERSION,
        "request_id": f"relax-rgcc-{token}",
        "session": {"session_id": token, "group_id": "e2e", "rollout_mode": "train"},
        "environment": {"name": ENV, "config": CONFIG, "task": session_input()},
        "model_endpoint": {"base_url": policy.server.base_url, "api_key": token, "model": "policy-alias"},
        "interrupt_policy": "protected",
        "deadline_s": deadline_s,
        "lease_s": 300,
    }
    return parse_create_request(json.dumps(body))


async def trial(
    policy: PolicyByToken, stack: GatewayProcess, behaviour: Behaviour, token: str | None = None
) -> tuple[Any, str]:
    token = token or new_token()
    policy.behaviours[token] = behaviour
    request = trial_request(policy, token)
    async with GatewayClient(stack.url, options=OPTIONS) as client:
        await run_trial(request, client=client)
        return await client.settled(request.request_id, timeout_s=SAFETY_S), token


def processes_running(path: str) -> list[int]:
    """Live processes whose executable, or command line, names `path`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            exe = os.readlink(entry / "exe")
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and (exe == path or path in cmdline):
            found.append(int(entry.name))
    return found


def rollout_of(pid: int) -> str | None:
    """The rollout a trial's process is marked with (the agent sets it in every process of the trial)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    prefix = f"{MARKER}=".encode()
    return next((item[len(prefix) :].decode() for item in environ if item.startswith(prefix)), None)


def claude_processes(rollout: str | None = None) -> list[int]:
    """The CLI processes of trials (of one trial, given its rollout); a CLI that another test runs, or a
    developer's own, is not one."""
    found = []
    for pid in processes_running(str(claude.locate().path.resolve())):
        marked = rollout_of(pid)
        if marked is not None and rollout in (None, marked):
            found.append(pid)
    return found


def claude_processes_after_cleanup(rollout: str | None = None) -> list[int]:
    """The trials' CLI processes still there once cleanup is confirmed: none, or a leak. A SIGKILLed CLI
    (a large multi-threaded process) can take a moment to leave /proc: bounded against hangs only."""
    deadline = time.monotonic() + SAFETY_S
    while (found := claude_processes(rollout)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def describe(pids: list[int]) -> str:
    """Each process's parent and command line, for a failure message."""
    lines = []
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            parent = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
        except OSError:
            continue
        lines.append(f"{pid} (parent {parent}): {cmdline[:300]}")
    return "\n".join(lines)


async def until(condition: Callable[[], Any]) -> Any:
    """Poll a condition of the machine until it holds (bounded only against hangs)."""
    async with asyncio.timeout(SAFETY_S):
        while True:
            if found := condition():
                return found
            await asyncio.sleep(0.05)


def nothing_at(*paths: Path) -> bool:
    return not any(path.exists() for path in paths)


def settings_of(trials_dir: str, directory: str) -> dict[str, Any]:
    settings: dict[str, Any] = json.loads(Path(trials_dir, directory, "config", "settings.json").read_text())
    return settings


def note_of(workspace: Path) -> str:
    return (workspace / "note").read_text()


def directories_of(state: dict[str, Any], rollout: str) -> list[str]:
    """The trial directories of one rollout in an agent's state (others' may be there too)."""
    return [name for name in state["directories"] if name.startswith(dir_prefix(rollout))]


async def agent_state(agent_url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(trust_env=False) as http:
        state: dict[str, Any] = (await http.get(f"{agent_url}/relax_gym/trials")).json()
        return state


def test_a_bash_round_trip_through_the_thin_client_scores_one(
    policy: PolicyByToken, stack: GatewayProcess, agent_url: str, tmp_path: Path
) -> None:
    """The recipe's trial: Bash `python3 -c 'print(6 * 7)'`, then the row's answer; reward 1.0."""
    token = new_token()
    policy.behaviours[token] = steps(
        bash("python3 -c 'print(6 * 7)'"), reply_text("It is 42.\n<answer>42</answer>")
    )
    io_dir = tmp_path / "relax-agentic-command-1"
    io_dir.mkdir()
    (io_dir / "session_input.json").write_text(json.dumps(session_input()))
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
        "NEMO_GYM_ENVIRONMENT": ENV,
        "NEMO_GYM_CONFIG": CONFIG,
        "NEMO_GYM_MODEL": "policy-alias",
        "NEMO_GYM_DEADLINE_S": "600",
        "NEMO_GYM_LEASE_S": "300",
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

    calls = policy.requests_of(token)
    assert len(calls) == 2
    assert all(call.stream and call.bearer == token and call.path.endswith("/v1/messages") for call in calls)
    assert [tool_results(call) for call in calls] == [[], ["42"]]  # exactly one tool_result: Bash's output
    assert [tool["name"] for tool in calls[0].body["tools"]] == ["Bash"]  # every other tool denied
    # Its trajectory: the CLI's two Messages calls (streamed, folded), Bash's call and its output.
    nemo_gym = output["metadata"]["nemo_gym"]
    assert nemo_gym["artifact_ref"] == f"/v1/trials/{nemo_gym['request_id']}/trajectory"
    document = httpx.get(stack.url + nemo_gym["artifact_ref"], trust_env=False).json()
    assert [(c["resource"], c["streamed"], c["status"]) for c in document["model_calls"]] == [
        ("messages", True, 200)
    ] * 2
    assert document["model_calls"][0]["response"]["content"][-1]["name"] == "Bash"
    assert (document["counts"]["tool_calls"], document["counts"]["tool_outputs"]) == (1, 1)
    assert token not in json.dumps(document)  # the session token is the call's API key: never kept

    async def settled() -> Any:
        async with GatewayClient(stack.url, options=OPTIONS) as client:
            return await client.settled(output["metadata"]["nemo_gym"]["request_id"], timeout_s=SAFETY_S)

    assert asyncio.run(settled()).cleanup.value == "confirmed"
    assert (leftover := claude_processes_after_cleanup()) == [], describe(leftover)
    assert asyncio.run(agent_state(agent_url))["live"] == []
    readiness = httpx.get(f"{agent_url}/", trust_env=False).json()  # what GET / (readiness) reports
    assert readiness["sandbox"].startswith("bubblewrap 0.11.0 at ")
    assert readiness["claude_code"] == f"Claude Code 2.1.237 at {claude.locate().path}"


async def test_the_sandbox_keeps_bash_off_the_network_the_system_and_other_trials(
    policy: PolicyByToken, stack: GatewayProcess
) -> None:
    """Two concurrent trials: A writes a note in its workspace and waits (its next model call held); B
    looks for it, tries the gateway over the network and writes to the system."""
    gate = Gate()
    token_a = new_token()
    first = steps(bash("echo secret-of-a > note && pwd"), reply_text("<answer>42</answer>").held(gate))
    a = asyncio.ensure_future(trial(policy, stack, first, token_a))
    held = await until(lambda: [r for r in policy.requests_of(token_a) if tool_results(r)])  # A waits
    workspace_a = Path(tool_results(held[0])[0].strip())
    assert note_of(workspace_a) == "secret-of-a\n"  # A's workspace is a host directory
    host, port = stack.url.removeprefix("http://").rsplit(":", 1)
    probe = (
        f"cat {workspace_a}/note; ls {workspace_a.parent.parent}; "
        f"python3 -c 'import socket; socket.create_connection((\"{host}\", {port}), 2)' 2>&1 | tail -1; "
        "touch /usr/planted /planted 2>&1; echo done"
    )
    b, token_b = await trial(policy, stack, steps(bash(probe), reply_text("<answer>42</answer>")))
    gate.open()
    snapshot_a, _ = await a
    outcomes = [(s.status.value, s.reward, s.cleanup.value) for s in (snapshot_a, b)]
    assert outcomes == [("completed", 1.0, "confirmed")] * 2
    (seen,) = tool_results(policy.requests_of(token_b)[-1])
    assert "secret-of-a" not in seen
    assert f"{workspace_a}/note: No such file or directory" in seen
    listed = seen.splitlines()[1:-4]  # the trials directory as B sees it: B's own directory only
    assert len(listed) == 1 and listed[0] != workspace_a.parent.name, seen
    # The gateway listens on the host at that address: refused means a network namespace of its own.
    assert "ConnectionRefusedError" in seen
    assert seen.count("Read-only file system") == 2 and seen.endswith("done"), seen
    assert nothing_at(workspace_a, Path("/usr/planted"))


async def test_an_abort_during_the_bash_call_leaves_no_process_and_no_directory(
    policy: PolicyByToken, stack: GatewayProcess, agent_url: str
) -> None:
    token = new_token()
    command = f"sleep 290.{next(_tokens):04d}"  # names this trial's sandboxed command in /proc
    policy.behaviours[token] = steps(bash(command), reply_text("<answer>42</answer>"))
    request = trial_request(policy, token)
    async with GatewayClient(stack.url, options=OPTIONS) as client:
        await client.create(request)
        sleepers = await until(lambda: processes_running(command))  # Bash runs it in the sandbox
        (rollout,) = {rollout_of(pid) for pid in sleepers} - {None}  # marked as the trial's
        assert claude_processes(rollout), describe(claude_processes())  # and its CLI is live
        state = await agent_state(agent_url)
        # The trials directory is shared by every agent on the machine: this trial's is named by its rollout.
        found = directories_of(state, rollout)
        assert len(found) == 1, state
        (live,) = found  # the trial's settings, as its CLI read them:
        settings = settings_of(state["trials_dir"], live)
        assert settings["env"]["DISABLE_COMPACT"] == "1"  # compaction off: linear histories
        assert "Bash" not in settings["permissions"]["deny"] and "Read" in settings["permissions"]["deny"]
        await client.abort(request.request_id)
        snapshot = await client.settled(request.request_id, timeout_s=SAFETY_S)
    assert (snapshot.status.value, snapshot.error, snapshot.reward) == ("aborted", {"code": "aborted"}, None)
    assert snapshot.cleanup.value == "confirmed"
    assert (leftover := claude_processes_after_cleanup(rollout)) == [], describe(leftover)
    assert processes_running(command) == []
    state = await agent_state(agent_url)
    assert (rollout not in state["live"], directories_of(state, rollout)) == (True, []), state
    assert len(policy.requests_of(token)) == 1  # the CLI never came back after the abort


@pytest.mark.slow
async def test_sixteen_concurrent_trials_complete(
    policy: PolicyByToken, stack: GatewayProcess, agent_url: str
) -> None:
    recipe = steps(bash("python3 -c 'print(6 * 7)'"), reply_text("<answer>42</answer>"))
    results = await asyncio.gather(*(trial(policy, stack, recipe) for _ in range(16)))
    assert [(s.status.value, s.reward, s.cleanup.value) for s, _ in results] == [
        ("completed", 1.0, "confirmed")
    ] * 16
    assert all([tool_results(r) for r in policy.requests_of(token)] == [[], ["42"]] for _, token in results)
    assert (leftover := claude_processes_after_cleanup()) == [], describe(leftover)
    assert (await agent_state(agent_url))["live"] == []


async def test_the_oracle_policy_of_make_demo_recognises_the_row_through_the_cli(
    policy: PolicyByToken, stack: GatewayProcess
) -> None:
    """`make demo` drives every environment with OracleScript; the CLI sends the row's prompt with blocks
    of its own beside it in the user message, and the oracle still knows the row."""
    prompt = session_input()["messages"]
    answer = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "<answer>42</answer>"}],
    }
    probe = VerifierProbe(
        name="own-answer",
        row={"responses_create_params": {"input": prompt}},
        output=(answer,),
        expected_reward=1.0,
    )
    snapshot, _ = await trial(policy, stack, OracleScript([probe]))
    assert (snapshot.status.value, snapshot.reward, snapshot.cleanup.value) == ("completed", 1.0, "confirmed")
