"""Catalogue environments end to end, as Relax runs them: `relax-gym up` (real upstream servers), the real
gateway, and one real `relax-gym-client` process per session, its model calls bridged to a per-session
policy that answers with the recorded model turns (no LLM runs here).

Three kinds of environment: tool use with state (math_with_code: a Python subprocess per session), a
gymnasium game (example_multi_turn_gymnasium: /reset, then a model call and a /step per turn) and multi-step
tool calling (example_multi_step). Every recording's reward comes back through the whole path, and the
stateful servers hold nothing afterwards, nor after an abort in the middle of a trial.

And the main job over the catalogue, on the same servers: the example rows of catalogued environments and of
a dedicated plugin (mcqa), tagged into one dataset by `relax-gym mix`, then `relax-gym rollout --policy
oracle`. The oracle replays each catalogued row's recorded model turns (and the plugin's known-good output),
so every trial must score exactly what NeMo Gym recorded.
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from relax_gym_core.client import GatewayClient
from relax_gym_core.plugin import VerifierProbe
from relax_gym_core.plugin.host import Hooks, converted_row, make_plugin_manager
from relax_gym_core.policies.replay import ReplayPlan
from relax_gym_core.protocol import PROTOCOL_VERSION, CreateTrialRequest, parse_create_request
from relax_gym_core.rollout.data import example_rows, task_identity
from relax_gym_core.testing import Gate, RawReply, RecordedRequest, ScriptedReply, reply_text
from relax_gym_core.testing.processes import run_cli
from relax_gym_core.testing.web import GatewayProcess, PolicyByToken

# equivalence_rule: one of its recordings ends on a reasoning-only turn, answered as a model may end one (not
# cut off): its agent must stop there and score it, not ask again until the deadline.
THIN_CLIENT = ("equivalence_rule", "example_multi_step", "example_multi_turn_gymnasium", "math_with_code")
STATEFUL = ("example_multi_turn_gymnasium", "math_with_code")
# For the rollout too: tool calls, a fractional score, a seeded game; and mcqa, a dedicated plugin.
ENVIRONMENTS = (*THIN_CLIENT, "grl_sokoban", "mcqa", "mrcr", "xlam_fc")
pytest.importorskip("relax_gym_catalogue")

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.nemo_gym(*ENVIRONMENTS)]

CLIENT = str(Path(sys.executable).with_name("relax-gym-client"))
SAFETY_S = 180  # guards against hangs only
ROLLOUT_S = 600
_tokens = itertools.count()


@pytest.fixture(scope="module")
def hooks() -> Hooks:
    return make_plugin_manager()


@pytest.fixture(scope="module")
def policy() -> Iterator[PolicyByToken]:
    with PolicyByToken(default=lambda _request: reply_text("I do not know.")) as holder:
        yield holder


@pytest.fixture(scope="module")
def stack(relax_gym_up: Callable[..., GatewayProcess]) -> GatewayProcess:
    return relax_gym_up(*ENVIRONMENTS)


def replaying(probe: VerifierProbe) -> Callable[[RecordedRequest], ScriptedReply | RawReply]:
    """A session's policy answering with the recording's model turns, in order."""
    plan = ReplayPlan.of(probe)

    def answer(request: RecordedRequest) -> ScriptedReply | RawReply:
        reply = plan.reply(request.body)
        assert reply is not None, "the agent asked past the recording"
        return RawReply(status=200, body=json.dumps(reply).encode())

    return answer


def session_input(hooks: Hooks, environment: str, probe: VerifierProbe) -> dict[str, Any]:
    converted = converted_row(hooks.environments.get(environment), dict(probe.row))
    return {"messages": converted["input"], "metadata": converted["metadata"]}


def create_request(
    policy: PolicyByToken, environment: str, task: dict[str, Any], token: str, request_id: str
) -> CreateTrialRequest:
    """A trial of `environment` on `task` in its config, its model calls to this session's policy."""
    body = {
        "protocol_version": PROTOCOL_VERSION,
        "request_id": request_id,
        "session": {"session_id": token, "group_id": "cat", "rollout_mode": "eval"},
        "environment": {"name": environment, "config": config_of(environment), "task": task},
        "model_endpoint": {"base_url": policy.server.base_url, "api_key": token, "model": "m"},
        "interrupt_policy": "protected",
        "deadline_s": 300,
        "lease_s": 60,
    }
    return parse_create_request(json.dumps(body))


@functools.cache
def config_of(environment: str) -> str:
    return make_plugin_manager().environments.get(environment).configs[0]


def launch_client(
    stack: GatewayProcess,
    policy: PolicyByToken,
    environment: str,
    task: dict[str, Any],
    io_dir: Path,
    token: str,
) -> subprocess.Popen[str]:
    io_dir.mkdir()
    (io_dir / "session_input.json").write_text(json.dumps(task))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RELAX_", "NEMO_GYM_", "OPENAI_"))}
    environ = {
        **base,
        "RELAX_SESSION_ID": token,
        "RELAX_SESSION_IO_DIR": str(io_dir),
        "RELAX_BASE_URL": policy.server.base_url,
        "RELAX_INPUT_JSON": str(io_dir / "session_input.json"),
        "RELAX_OUTPUT_JSON": str(io_dir / "session_output.json"),
        "NEMO_GYM_URL": stack.url,
        "NEMO_GYM_ENVIRONMENT": environment,
        # Upstream's config name, which need not be the environment's (equivalence_rule's is `lc`).
        "NEMO_GYM_CONFIG": config_of(environment),
        "NEMO_GYM_MODEL": "model",
        "NEMO_GYM_DEADLINE_S": "300",
        "NEMO_GYM_LEASE_S": "60",
        "NEMO_GYM_POLL_INTERVAL_S": "0.05",
    }
    return subprocess.Popen([CLIENT], env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture
def clients() -> Iterator[list[subprocess.Popen[str]]]:
    """Any client still running when a test ends (an assertion failed first) is killed by PID and reaped."""
    launched: list[subprocess.Popen[str]] = []
    yield launched
    for process in launched:
        if process.poll() is None:
            process.kill()
        process.communicate()


def live_sessions(stack: GatewayProcess, hooks: Hooks, environment: str) -> dict[str, int]:
    resources = hooks.environments.get(environment).servers[0].name
    answer = httpx.get(f"{stack.server_url(resources)}/relax_gym/sessions", trust_env=False, timeout=30)
    counts: dict[str, int] = answer.json()
    return counts


def test_every_recording_scores_as_recorded_through_the_thin_client(
    hooks: Hooks,
    policy: PolicyByToken,
    stack: GatewayProcess,
    tmp_path: Path,
    clients: list[subprocess.Popen[str]],
) -> None:
    launched = []
    for environment in THIN_CLIENT:
        for probe in hooks.environments.get(environment).verifier_probes():
            token = f"agentic_session_shard_0.session-cat{next(_tokens):04d}"
            policy.behaviours[token] = replaying(probe)
            io_dir = tmp_path / token
            task = session_input(hooks, environment, probe)
            clients.append(launch_client(stack, policy, environment, task, io_dir, token))
            launched.append((environment, probe, token, io_dir, clients[-1]))
    for environment, probe, token, io_dir, process in launched:
        _out, err = process.communicate(timeout=SAFETY_S)
        assert process.returncode == 0, err
        result = json.loads((io_dir / "session_output.json").read_text())
        assert result["reward"] == probe.expected_reward, (environment, probe.name, result)
        requests = policy.requests_of(token)
        # Every model call went through the bridge (up to the agent's max_steps: a recording may be longer).
        assert 1 <= len(requests) <= len(ReplayPlan.of(probe).turns)
        assert all("relax_gym_rollout" not in r.raw_body.decode() for r in requests)
    for environment in STATEFUL:
        # Each trial's cleanup was proven before its client returned; nothing is left on the servers.
        counts = live_sessions(stack, hooks, environment)
        assert (counts["sessions"], counts["rollouts"]) == (0, 0), environment


async def test_an_abort_after_a_tool_call_releases_the_sessions_subprocess(
    hooks: Hooks, policy: PolicyByToken, stack: GatewayProcess
) -> None:
    probe = next(
        p
        for p in hooks.environments.get("math_with_code").verifier_probes()
        if len(ReplayPlan.of(p).turns) > 1  # its first turn runs Python, its second is held back
    )
    token = f"agentic_session_shard_0.session-cat{next(_tokens):04d}"
    gate = Gate()
    first = replaying(probe)

    def answer(request: RecordedRequest) -> ScriptedReply | RawReply:
        reply = first(request)
        return reply if len(policy.requests_of(token)) <= 1 else reply.held(gate)

    policy.behaviours[token] = answer
    request = create_request(
        policy, "math_with_code", session_input(hooks, "math_with_code", probe), token, f"relax-cat-{token}"
    )
    async with GatewayClient(stack.url) as client:
        await client.create(request)
        while len(policy.requests_of(token)) < 2:  # the Python ran; the agent waits on its second call
            await policy.server.wait_for_requests_async(len(policy.server.requests) + 1)
        assert live_sessions(stack, hooks, "math_with_code")["rollouts"] == 1
        await client.abort(request.request_id)
        snapshot = await client.settled(request.request_id, timeout_s=60)
    gate.open()
    assert (snapshot.status.value, snapshot.cleanup) == ("aborted", "confirmed")
    counts = live_sessions(stack, hooks, "math_with_code")
    assert (counts["sessions"], counts["rollouts"]) == (0, 0)


def expected_rewards() -> dict[str, float]:
    """What each example row must score, by its task: the reward its first scored probe expects."""
    hooks = make_plugin_manager()
    expected: dict[str, float] = {}
    for name in ENVIRONMENTS:
        definition = hooks.environments.get(name)
        for probe in definition.verifier_probes():
            if probe.skip is None and (probe.replay or probe.expected_reward == 1.0):
                converted = converted_row(definition, copy.deepcopy(dict(probe.row)))
                expected.setdefault(
                    task_identity(converted["input"], converted["metadata"]), probe.expected_reward
                )
    return expected


def test_an_oracle_rollout_over_the_catalogue_scores_the_recorded_rewards(
    tmp_path: Path, stack: GatewayProcess
) -> None:
    hooks = make_plugin_manager()
    sources = []
    for name in ENVIRONMENTS:
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in example_rows(hooks, name)))
        sources.append(f"{name}={path.name}")
    mixed = run_cli("mix", *sources, "--output", "mixed.jsonl", cwd=tmp_path, timeout_s=ROLLOUT_S)
    assert mixed.returncode == 0, mixed.stderr
    run = run_cli(
        "rollout", "--data", "mixed.jsonl", "--policy", "oracle", "--gateway", stack.url,
        "--concurrency", "8", "--out", "run", cwd=tmp_path, timeout_s=ROLLOUT_S,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr

    rows = [json.loads(line) for line in (tmp_path / "mixed.jsonl").read_text().splitlines()]
    trials = [json.loads(line) for line in (tmp_path / "run" / "trials.jsonl").read_text().splitlines()]
    assert len(trials) == len(rows) >= 30
    expected = expected_rewards()
    environments = set()
    for trial in trials:
        row = rows[trial["row"] - 1]
        environments.add(row["metadata"]["environment"])
        want = expected[task_identity(row["input"], row["metadata"])]
        # A game that ran out of steps is truncated (gymnasium_agent says so), as it was when recorded.
        assert trial["status"] in ("completed", "truncated") and trial["cleanup"] == "confirmed", trial
        assert trial["reward"] == pytest.approx(want, abs=1e-9), (row["metadata"]["environment"], trial)
    assert environments == set(ENVIRONMENTS)
    # The recorded rewards are not all 1: the replay reproduces failures, fractions and game scores too.
    assert {0.0, 1.0, 10.0} <= {trial["reward"] for trial in trials}
    assert any(0.0 < trial["reward"] < 1.0 for trial in trials)

    # The stored trajectories re-score as recorded with the current verifiers, but for one line made to
    # claim another reward; environments whose verifier reads per-trial state are refused, by name.
    lines = (tmp_path / "run" / "trials.jsonl").read_text().splitlines()
    index, claimed = next((i, json.loads(line)) for i, line in enumerate(lines) if '"mcqa"' in line)
    claimed["reward"] = 1.0 - claimed["reward"]
    lines[index] = json.dumps(claimed)
    (tmp_path / "run" / "trials.jsonl").write_text("\n".join(lines) + "\n")
    again = run_cli("reverify", "run", "--json", cwd=tmp_path, timeout_s=ROLLOUT_S)
    assert again.returncode == 1, again.stdout + again.stderr  # a reward changed
    document = json.loads(again.stdout)
    changed = [r for r in document["rescored"] if r["changed"]]
    assert [(r["request_id"], r["reward"]) for r in changed] == [
        (claimed["request_id"], 1.0 - claimed["reward"])
    ]
    assert {"mcqa", "mrcr", "xlam_fc"} <= {r["environment"] for r in document["rescored"]}
    assert "grl_sokoban" in document["refused"] and "cleanup contract" in document["refused"]["grl_sokoban"]


async def test_a_failed_run_says_why_in_the_gateways_log(
    policy: PolicyByToken, stack: GatewayProcess
) -> None:
    """An agent that answers 500 (here: a task without the field its verifier reads) fails the trial as
    agent_error, and the gateway's log carries the last lines the NeMo Gym servers logged: the cause."""
    token = f"agentic_session_shard_0.session-cat{next(_tokens):04d}"
    policy.behaviours[token] = lambda _request: reply_text("42")
    task = {"messages": [{"role": "user", "content": "6 * 7?"}], "metadata": {}}  # no expected_answer
    request = create_request(policy, "equivalence_rule", task, token, f"relax-cat-why-{next(_tokens)}")
    before = len(stack.output)
    async with GatewayClient(stack.url) as client:
        await client.create(request)
        snapshot = await client.settled(request.request_id, timeout_s=SAFETY_S)
    assert (snapshot.status.value, snapshot.error) == ("failed", {"code": "agent_error"})
    said = next(line for line in stack.output[before:] if "NeMo Gym agent /run answered HTTP 500:" in line)
    assert "calling an inner server" in said and "expected_answer" in said  # the cause, as NeMo Gym put it
    assert token not in "\n".join(stack.output[before:])
