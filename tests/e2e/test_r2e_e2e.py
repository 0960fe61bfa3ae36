"""R2E-style repository repair end to end: `relax-gym up r2e_gym` (our resources server with its bubblewrap
sandboxes, NeMo Gym's simple_agent, the gateway), the real thin client, and a scripted policy standing in
for Relax's per-session model API (no LLM runs here) that uses the tools: view, bash, str_replace.

The servers are the session's shared `relax-gym up r2e_gym`; each test uses its own session tokens and
the policy answers each request by the trial its token belongs to. What a trial leaves behind is checked on
the machine: processes of the resources server's sandbox uids, directories in its state directory.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from relax_gym_core.client import ClientOptions, GatewayClient, run_trial
from relax_gym_core.plugin.host import converted_row, make_plugin_manager
from relax_gym_core.plugin.specs import parse_environments
from relax_gym_core.policies.oracle import OracleScript
from relax_gym_core.protocol import PROTOCOL_VERSION, parse_create_request
from relax_gym_core.testing import RecordedRequest, ScriptedReply, ToolCall, reply_text, reply_tool_calls
from relax_gym_core.testing.web import GatewayProcess, PolicyByToken

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.nemo_gym("r2e_gym")]

relax_gym_r2e = pytest.importorskip("relax_gym_r2e")
from relax_gym_r2e import tasks  # noqa: E402
from relax_gym_r2e.production import ProductionPlan  # noqa: E402
from relax_gym_r2e.rows import example_row  # noqa: E402
from relax_gym_r2e.sandbox import processes_of  # noqa: E402

ENV, CONFIG = "r2e_gym", "r2e-gym-v1"
OPTIONS = ClientOptions(poll_interval_s=0.05)
_tokens = itertools.count()

type Script = Callable[[RecordedRequest], ScriptedReply]


def tool_outputs(request: RecordedRequest) -> list[str]:
    items = request.body.get("input", []) if isinstance(request.body, dict) else []
    return [
        item["output"]
        for item in items
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    ]


def steps(*replies: ScriptedReply) -> Script:
    """One reply per model turn: turn n (n tool results so far) gets replies[n]."""
    return lambda request: replies[min(len(tool_outputs(request)), len(replies) - 1)]


@pytest.fixture(scope="module")
def policy() -> Iterator[PolicyByToken]:
    with PolicyByToken(lambda _request: reply_text("Done.")) as holder:
        yield holder


@pytest.fixture(scope="module")
def stack(relax_gym_up: Callable[..., GatewayProcess]) -> GatewayProcess:
    return relax_gym_up(ENV)


@pytest.fixture(scope="module")
def resources_url(stack: GatewayProcess) -> str:
    return stack.server_url("r2e_gym")


async def left_on_machine(resources_url: str) -> tuple[int, list[int], list[Path]]:
    """(live rollouts, processes of the server's sandbox uids, run directories), read from the machine."""
    async with httpx.AsyncClient(trust_env=False) as http:
        state = (await http.get(f"{resources_url}/relax_gym/sandboxes")).json()
    first, end = state["uid_range"]
    root = Path(state["state_dir"])
    directories = [path for name in ("rollouts", "evaluations") for path in (root / name).iterdir()]
    return state["rollouts"], processes_of(set(range(first, end))), directories


def nothing_at(*paths: Path) -> bool:
    return not any(path.exists() for path in paths)


def new_token() -> str:
    return f"agentic_session_shard_0.session-r2e{next(_tokens):04d}"


def trial_request(policy: PolicyByToken, row: dict[str, Any], *, token: str) -> Any:
    converted = converted_row(make_plugin_manager().environments.get(ENV), row)
    body = {
        "protocol_version": PROTOCOL_VERSION,
        "request_id": f"relax-r2e-{token}",
        "session": {"session_id": token, "group_id": "e2e", "rollout_mode": "train"},
        "environment": {
            "name": ENV,
            "config": CONFIG,
            "task": {"messages": converted["input"], "metadata": converted["metadata"]},
        },
        "model_endpoint": {"base_url": policy.server.base_url, "api_key": token, "model": "policy-alias"},
        "interrupt_policy": "protected",
        "deadline_s": 600,
        "lease_s": 120,
    }
    return parse_create_request(json.dumps(body))


async def trial(policy: PolicyByToken, stack: GatewayProcess, name: str, script: Script) -> tuple[Any, str]:
    """Run one trial of bundled task `name` with `script`; returns its settled snapshot and token."""
    token = new_token()
    policy.behaviours[token] = script
    request = trial_request(policy, example_row(name), token=token)
    async with GatewayClient(stack.url, options=OPTIONS) as client:
        await run_trial(request, client=client)
        settled = await client.settled(request.request_id, timeout_s=120)
    return settled, token


def whole_file_edit(path: str, old: str, new: str) -> ToolCall:
    return ToolCall("str_replace", {"path": path, "old_str": old, "new_str": new})


async def test_a_policy_fixing_the_bug_with_the_tools_scores_one(
    policy: PolicyByToken, stack: GatewayProcess, resources_url: str
) -> None:
    built = tasks.built_tasks()["pager"]
    ((path, fixed),) = built.task.fix.items()
    script = steps(
        reply_tool_calls(ToolCall("view", {"path": "pager/core.py"})),
        reply_tool_calls(
            ToolCall("bash", {"command": "python3 -c 'import pager; print(pager.page_count(10, 3))'"})
        ),
        reply_tool_calls(whole_file_edit(path, built.task.files[path], fixed)),
        reply_tool_calls(
            ToolCall(
                "bash", {"command": "python3 -c 'import pager; print(pager.page(list(range(10)), 4, 3))'"}
            )
        ),
        reply_text("page_count now rounds up, so the last partial page is counted."),
    )
    snapshot, token = await trial(policy, stack, "pager", script)
    assert (snapshot.status.value, snapshot.reward, snapshot.cleanup.value) == ("completed", 1.0, "confirmed")
    metrics = snapshot.metrics
    assert (metrics["resolved"], metrics["patch_exists"], metrics["tool_calls"], metrics["commands"]) == (
        True,
        True,
        4,
        4,
    )
    assert (metrics["fail_to_pass_passed"], metrics["pass_to_pass_passed"]) == (2, 3)
    seen = [tool_outputs(request) for request in policy.requests_of(token)]
    assert [len(outputs) for outputs in seen] == [0, 1, 2, 3, 4]  # every tool result reached the next turn
    view, before, edit, after = seen[-1]
    assert "return total // per_page" in view
    assert before.startswith("3\n") and after.startswith("[9]\n")  # the bug, then the fix, observed
    assert edit == "Replaced 1 occurrence in /workspace/repo/pager/core.py."
    assert (await left_on_machine(resources_url))[0] == 0
    # The trial's trajectory: the five model turns, the four tool calls, their outputs as the agent saw them.
    async with httpx.AsyncClient(base_url=stack.url, trust_env=False) as http:
        document = (await http.get(str(snapshot.artifact_ref))).json()
    counts = document["counts"]
    assert (counts["answered_calls"], counts["tool_calls"], counts["tool_outputs"]) == (5, 4, 4)
    last_request = document["model_calls"][-1]["request"]
    kept = [item["output"] for item in last_request["input"] if item.get("type") == "function_call_output"]
    assert kept == seen[-1]


async def test_editing_the_wrong_file_scores_the_shaping_reward(
    policy: PolicyByToken, stack: GatewayProcess
) -> None:
    readme = tasks.load_tasks()["acl"].files["README.md"]
    script = steps(
        reply_tool_calls(whole_file_edit("README.md", readme, readme + "\nOwners and admins may edit.\n")),
        reply_text("Documented the rule."),
    )
    snapshot, _ = await trial(policy, stack, "acl", script)
    assert (snapshot.status.value, snapshot.reward, snapshot.cleanup.value) == ("completed", 0.1, "confirmed")
    assert (snapshot.metrics["patch_exists"], snapshot.metrics["resolved"]) == (True, False)
    assert snapshot.metrics["fail_to_pass_passed"] == 0


async def test_answering_without_editing_scores_zero(policy: PolicyByToken, stack: GatewayProcess) -> None:
    script = steps(
        reply_tool_calls(ToolCall("view", {"path": "."})), reply_text("The code looks right to me.")
    )
    snapshot, _ = await trial(policy, stack, "semver", script)
    assert (snapshot.status.value, snapshot.reward, snapshot.cleanup.value) == ("completed", 0.0, "confirmed")
    assert (snapshot.metrics["patch_exists"], snapshot.metrics["resolved"]) == (False, False)


async def test_runaway_commands_are_contained_and_reported(
    policy: PolicyByToken, stack: GatewayProcess, tmp_path: Path
) -> None:
    host_marker = tmp_path / "written-from-the-sandbox"
    bomb = textwrap.dedent("""\
        import os, time
        started = 0
        for _ in range(200):
            try:
                if os.fork() == 0:
                    time.sleep(120)
                    os._exit(0)
                started += 1
            except OSError:
                pass
        print("children", started)
    """)
    script = steps(
        reply_tool_calls(ToolCall("bash", {"command": "while :; do :; done", "timeout": 1})),
        reply_tool_calls(ToolCall("bash", {"command": f"python3 -c '{bomb}'", "timeout": 60})),
        reply_tool_calls(
            ToolCall("bash", {"command": f"touch {host_marker} /usr/planted /planted 2>&1; echo $?"})
        ),
        reply_text("Nothing to fix."),
    )
    snapshot, token = await trial(policy, stack, "durations", script)
    assert (snapshot.status.value, snapshot.reward, snapshot.cleanup.value) == ("completed", 0.0, "confirmed")
    assert (snapshot.metrics["commands"], snapshot.metrics["command_timeouts"]) == (3, 1)
    loop, bomb_output, writes = tool_outputs(policy.requests_of(token)[-1])
    assert loop.endswith("[timed out after 1 s: the command and every process it started were killed]")
    children = int(bomb_output.split()[1])
    assert 0 < children < 64  # the process limit (64) stopped it, not the bomb's own bound (200)
    assert writes.count("Read-only file system") == 2 and "No such file or directory" in writes
    assert nothing_at(host_marker, Path("/usr/planted"), Path("/planted"))


async def test_an_abort_mid_trial_is_terminal_with_cleanup_confirmed_and_nothing_left(
    policy: PolicyByToken, stack: GatewayProcess, resources_url: str
) -> None:
    token = new_token()
    policy.behaviours[token] = steps(
        reply_tool_calls(ToolCall("bash", {"command": "sleep 280", "timeout": 290})), reply_text("Done.")
    )
    request = trial_request(policy, example_row("tagger"), token=token)
    async with GatewayClient(stack.url, options=OPTIONS) as client:
        await client.create(request)
        async with httpx.AsyncClient(trust_env=False) as http:
            async with asyncio.timeout(120):  # against hangs only
                while True:  # until the agent's command runs in the rollout's sandbox
                    state = (await http.get(f"{resources_url}/relax_gym/sandboxes")).json()
                    if state["running"]:
                        break
                    await asyncio.sleep(0.05)
        await client.abort(request.request_id)
        snapshot = await client.settled(request.request_id, timeout_s=120)
    assert (snapshot.status.value, snapshot.error, snapshot.reward) == ("aborted", {"code": "aborted"}, None)
    assert snapshot.cleanup.value == "confirmed"
    rollouts, processes, directories = await left_on_machine(resources_url)
    assert (rollouts, processes, directories) == (0, [], [])


async def test_eight_concurrent_trials_complete(
    policy: PolicyByToken, stack: GatewayProcess, resources_url: str
) -> None:
    """The oracle `make demo`-style policy (each task's golden probe, replayed through the tools)."""
    oracle = OracleScript(list(make_plugin_manager().environments.get(ENV).verifier_probes()))
    names = sorted(tasks.load_tasks())
    chosen = [names[index % len(names)] for index in range(8)]
    snapshots = await asyncio.gather(*(trial(policy, stack, name, oracle) for name in chosen))
    assert [(s.status.value, s.reward, s.cleanup.value) for s, _ in snapshots] == [
        ("completed", 1.0, "confirmed")
    ] * 8
    assert all(s.metrics["resolved"] and s.metrics["tool_calls"] == 1 for s, _ in snapshots)
    rollouts, processes, directories = await left_on_machine(resources_url)
    assert (rollouts, processes, directories) == (0, [], [])


def test_the_production_environments_file_is_one_the_gateway_accepts() -> None:
    """What relax-gym-r2e-prepare writes for swe_agents parses with the gateway's own reader."""
    plan = ProductionPlan(sif_dir="/data/sifs", dataset_path="/data/r2e_gym_train.jsonl")
    (spec,) = parse_environments(json.dumps(plan.environments("http://gym:28101")), source="prepared")
    assert (spec.environment, spec.config, spec.agent_name) == (ENV, CONFIG, "swe_agents")
    assert spec.max_deadline_s >= plan.deadline_s >= plan.policy.minimum_deadline_s
    assert spec.cleanup.cleanup_probe_url is None  # swe_agents proves nothing: cancellations stay unverified
