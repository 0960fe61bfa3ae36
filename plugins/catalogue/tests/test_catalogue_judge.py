"""Judged environments: registered for production, their judge at the endpoint the operator names, never
the policy. For REAL: upstream's equivalence_llm_judge resources server (whose own config names
policy_model as its judge) and upstream's openai_model as the judge's model server, pointed at a scripted
Responses endpoint that answers each judge call with the verdict NeMo Gym recorded. policy_model is a port
nobody listens on, so a judge call sent there would fail the verify.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from attrs import define, field
from relax_gym_core.errors import InstalledFileUnavailable
from relax_gym_core.gym.installed import installed_file
from relax_gym_core.gym.processes import free_ports, run_gym_servers
from relax_gym_core.plugin import verify_body
from relax_gym_core.testing import (
    RawReply,
    RecordedRequest,
    ReplayPlan,
    ScriptedReply,
    converted_row,
    make_plugin_manager,
    reply_json,
)
from relax_gym_core.testing.processes import start_up
from relax_gym_core.testing.web import GatewayProcess, PolicyByToken, ScriptedPolicy

from relax_gym_catalogue.catalogue import ENTRIES
from relax_gym_catalogue.plugin import JUDGE, JUDGE_SERVER, definition_of
from relax_gym_catalogue.recordings import normalized, task_of
from relax_gym_catalogue.upstream import read_server

KEY = "sk-catalogue-judge-0123456789"
ENTRY = next(entry for entry in ENTRIES if entry.name == "equivalence_llm_judge")
SAFETY_S = 120


@define
class RecordedJudge:
    """Answers judge calls with the recorded judge responses, in order."""

    answers: list[dict[str, Any]] = field(factory=list)

    def __call__(self, request: RecordedRequest) -> ScriptedReply:
        return reply_json(200, self.answers.pop(0))


@define
class Judged:
    verifier: str
    judge: RecordedJudge
    endpoint: ScriptedPolicy


@pytest.fixture(scope="module")
def judged() -> Iterator[Judged]:
    judge = RecordedJudge()
    with (
        ScriptedPolicy(judge, require_token=KEY) as endpoint,
        pytest.MonkeyPatch.context() as mp,
    ):
        mp.setenv(JUDGE.api_key, KEY)  # read by the judge's own server process, never by a definition
        environ = {JUDGE.url: f"{endpoint.base_url}/v1", JUDGE.model: "judge-model"}
        definition = definition_of(ENTRY, environ)
        assert definition.unavailable() is None
        resources, _agent, judge_server = definition.servers
        assert judge_server.name == JUDGE_SERVER and KEY not in json.dumps(dict(judge_server.config))
        (nobody,) = free_ports(1)
        with run_gym_servers(
            [resources, judge_server], gateway_host="127.0.0.1", gateway_port=nobody
        ) as running:
            yield Judged(running[resources.name].url, judge, endpoint)


def test_each_recording_is_scored_as_recorded_by_the_judge_at_its_own_endpoint(judged: Judged) -> None:
    upstream = read_server(ENTRY.name)
    examples = upstream.example_rows()
    rewards = []
    for line in upstream.recorded_lines():
        recorded = json.loads(line)
        judged.endpoint.clear()
        evaluations = recorded["judge_evaluations"]
        judged.judge.answers = [evaluation["response"] for evaluation in evaluations]
        task, problem = task_of(recorded, examples)
        assert problem is None and task is not None
        answer = httpx.post(
            f"{judged.verifier}/verify",
            json=verify_body(task, recorded["response"]["output"]),
            timeout=SAFETY_S,
            trust_env=False,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["reward"] == recorded["reward"]
        rewards.append(recorded["reward"])
        calls = judged.endpoint.model_requests("responses")
        assert len(calls) == len(evaluations)
        for call, evaluation in zip(calls, evaluations, strict=True):
            assert (call.bearer, call.model) == (KEY, "judge-model")
            # The verifier asked the judge exactly what it asked when the rollout was recorded.
            assert normalized(call.body["input"]) == normalized(
                evaluation["responses_create_params"]["input"]
            )
    assert set(rewards) == {0.0, 1.0}


def test_without_a_judge_it_is_listed_but_refused_at_start_in_one_line() -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RELAX_GYM_JUDGE_")}
    definition = make_plugin_manager().environments.get(ENTRY.name)
    assert "an LLM judge" in " ".join(definition.needs)
    resources = definition.servers[0]
    assert resources.config["judge_model_server"] == {"type": "responses_api_models", "name": JUDGE_SERVER}
    up = ["up", ENTRY.name, "--port", "0", "--callback-network", "127.0.0.0/8"]
    for command in (up, ["probe", ENTRY.name]):
        done = subprocess.run(
            [sys.executable, "-m", "relax_gym_core.cli", *command],
            capture_output=True,
            text=True,
            env=environ,
            timeout=SAFETY_S,
            check=False,
        )
        if command[0] == "probe":  # nothing it could score here: every recording is the judge's verdict
            assert done.returncode == 1 and "nothing here proves its verifier" in done.stdout, done.stderr
            continue
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr
        assert done.stderr.strip().splitlines()[-1:] == [
            f"relax-gym: error: environment '{ENTRY.name}' cannot start here: its verifier asks an LLM "
            f"judge: name one with {JUDGE.url} and {JUDGE.model} (its key, if any, in {JUDGE.api_key})"
        ]


def test_a_judge_routed_through_the_bridge_is_refused() -> None:
    environ = {JUDGE.url: "http://127.0.0.1:8000/ng-rollout/1-0/v1", JUDGE.model: "m"}
    problem = definition_of(ENTRY, environ).unavailable()
    assert problem is not None and "model-call route on the relax-gym gateway" in problem


# ---- the whole trial path: `relax-gym up`, the gateway, the thin client ---------------------------------

CLIENT = str(Path(sys.executable).with_name("relax-gym-client"))


@define
class Switchable:
    """The operator's judge: the recorded verdicts, or HTTP 500 for every call while `failing`."""

    recorded: RecordedJudge
    failing: bool = False

    def __call__(self, request: RecordedRequest) -> ScriptedReply:
        if self.failing:
            return reply_json(500, {"error": {"message": "judge backend is down", "type": "server_error"}})
        return self.recorded(request)


def judge_failsafe_installed() -> bool:
    """NeMo Gym >= 0.5.0 wraps every /verify in judge_failsafe (nemo_gym/judge.py); 0.4.0 has no such file."""
    try:
        installed_file("nemo_gym", "judge.py")
    except InstalledFileUnavailable:
        return False
    return True


def session(policy: PolicyByToken, gateway: GatewayProcess, task: dict[str, Any], io_dir: Path) -> str:
    """One Relax session through the thin client, as Relax launches it; its stderr (the process is done)."""
    io_dir.mkdir()
    (io_dir / "session_input.json").write_text(json.dumps(task))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RELAX_", "NEMO_GYM_", "OPENAI_"))}
    environ = {
        **base,
        "RELAX_SESSION_ID": f"judged-session-{io_dir.name}",
        "RELAX_SESSION_IO_DIR": str(io_dir),
        "RELAX_BASE_URL": policy.server.base_url,
        "RELAX_INPUT_JSON": str(io_dir / "session_input.json"),
        "RELAX_OUTPUT_JSON": str(io_dir / "session_output.json"),
        "NEMO_GYM_URL": gateway.url,
        "NEMO_GYM_ENVIRONMENT": ENTRY.name,
        "NEMO_GYM_MODEL": "model",
        "NEMO_GYM_DEADLINE_S": "300",
    }
    done = subprocess.run(
        [CLIENT], env=environ, capture_output=True, text=True, timeout=SAFETY_S, check=False
    )
    (io_dir / "exit").write_text(str(done.returncode))
    return done.stderr


@pytest.mark.e2e
def test_a_failed_judge_leaves_the_trial_unscored_and_a_working_one_scores_it(tmp_path: Path) -> None:
    """The trial path end to end, judged by the operator's judge. NeMo Gym 0.4.0 answers a failed judge call
    with HTTP 500 from /verify; v0.5.0 and later with HTTP 200, reward 0.0 and `_ng_failure_class:
    judge_failed` (judge_failsafe). Either way the trial is never scored: the thin client exits non-zero and
    writes no reward. With the judge working, the right answer scores 1.0."""
    definition = make_plugin_manager().environments.get(ENTRY.name)
    lines = read_server(ENTRY.name).recorded_lines()
    index, recorded = next(
        (i, json.loads(line)) for i, line in enumerate(lines) if json.loads(line)["reward"] == 1.0
    )
    probe = next(p for p in definition.verifier_probes() if p.name == f"rollout{index}")
    plan = ReplayPlan.of(probe)
    judge = Switchable(RecordedJudge())

    def policy_turn(request: RecordedRequest) -> RawReply:
        reply = plan.reply(request.body)
        assert reply is not None, "the agent asked past the recording"
        return RawReply(status=200, body=json.dumps(reply).encode())

    converted = converted_row(definition, dict(probe.row))
    task = {"messages": converted["input"], "metadata": converted["metadata"]}
    environ = {
        **os.environ,
        JUDGE.url: "",  # set below, once the judge listens
        JUDGE.model: "judge-model",
        JUDGE.api_key: KEY,  # read by the judge's own server process only
    }
    with ScriptedPolicy(judge, require_token=KEY) as endpoint, PolicyByToken(policy_turn) as policy:
        environ[JUDGE.url] = f"{endpoint.base_url}/v1"
        with start_up([ENTRY.name], env=environ, extra_args=("--callback-network", "127.0.0.0/8")) as gateway:
            judge.recorded.answers = [evaluation["response"] for evaluation in recorded["judge_evaluations"]]
            session(policy, gateway, task, tmp_path / "working")
            assert (tmp_path / "working" / "exit").read_text() == "0"
            assert json.loads((tmp_path / "working" / "session_output.json").read_text())["reward"] == 1.0

            judge.failing = True
            asked = len(endpoint.model_requests("responses"))
            stderr = session(policy, gateway, task, tmp_path / "failing")
    assert (tmp_path / "failing" / "exit").read_text() != "0", stderr
    assert not (tmp_path / "failing" / "session_output.json").exists()  # no reward written, ever
    assert len(endpoint.model_requests("responses")) > asked  # the judge was asked, and failed
    assert "Remote trial failed with error code 'agent_error'" in stderr
    if judge_failsafe_installed():  # 200, reward 0.0, _ng_failure_class: the kind names it
        assert "kind 'judge_failed'" in stderr, stderr
