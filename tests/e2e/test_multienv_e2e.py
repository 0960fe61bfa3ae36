"""Math + Workplace behind one gateway, per-row routing: `relax-gym up math_with_judge workplace_assistant`
(real NeMo Gym servers), a dataset built by `relax-gym mix`, and real `relax-gym-client` processes launched
the way Relax launches them for a multi-environment job: without NEMO_GYM_ENVIRONMENT, so every row goes
where its tag says. Admission stays per environment: a saturated workplace queue never touches math."""

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

import httpx
import pytest

from relax_gym_core.client import ClientOptions, GatewayClient
from relax_gym_core.plugin.host import converted_row, make_plugin_manager
from relax_gym_core.testing import Gate, OracleScript, RecordedRequest, ScriptedReply, reply_text
from relax_gym_core.testing.processes import run_cli
from relax_gym_core.testing.web import GatewayProcess, PolicyByToken

pytest.importorskip("relax_gym_gsm8k")
pytest.importorskip("relax_gym_workplace")
from relax_gym_gsm8k.judge import API_KEY_VAR, MODEL_VAR, URL_VAR, VERIFY_TIMEOUT_VAR
from relax_gym_gsm8k.plugin import example_rows as math_rows
from relax_gym_workplace.plugin import example_rows as workplace_rows

JUDGE_OFF = {
    **dict.fromkeys((URL_VAR, MODEL_VAR, API_KEY_VAR), ""),
    # Past its bound upstream scores a right answer 0.0: on a shared, loaded test machine it gets room.
    VERIFY_TIMEOUT_VAR: "120",
}
ENVIRONMENTS = ("math_with_judge", "workplace_assistant")
pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.nemo_gym(*ENVIRONMENTS, env=JUDGE_OFF)]

CLIENT = str(Path(sys.executable).with_name("relax-gym-client"))
SAFETY_S = 180  # guards against hangs only
_tokens = itertools.count()

type Behaviour = Callable[[RecordedRequest], ScriptedReply]


@pytest.fixture(scope="module")
def oracles() -> dict[str, OracleScript]:
    """Known-good answers for every example row of each environment."""
    hooks = make_plugin_manager()
    return {env: OracleScript(list(hooks.environments.get(env).verifier_probes())) for env in ENVIRONMENTS}


@pytest.fixture(scope="module")
def policy() -> Iterator[PolicyByToken]:
    with PolicyByToken(default=lambda _request: reply_text("I am not sure.")) as holder:
        yield holder


@pytest.fixture(scope="module")
def stack(relax_gym_up: Callable[..., GatewayProcess]) -> GatewayProcess:
    return relax_gym_up(*ENVIRONMENTS, env=JUDGE_OFF)


def mixed_dataset(tmp_path: Path) -> list[dict[str, Any]]:
    """Upstream's example rows of both environments, converted and mixed by the real commands."""
    for name, rows in (("math", math_rows()), ("workplace", workplace_rows())):
        (tmp_path / f"{name}.raw.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        env = "math_with_judge" if name == "math" else "workplace_assistant"
        done = run_cli(
            "convert",
            env,
            "--input",
            f"{name}.raw.jsonl",
            "--output",
            f"{name}.jsonl",
            cwd=tmp_path,
            timeout_s=SAFETY_S,
        )
        assert done.returncode == 0, done.stderr
    done = run_cli(
        "mix",
        "math_with_judge=math.jsonl",
        "workplace_assistant=workplace.jsonl",
        "--output",
        "mixed.jsonl",
        cwd=tmp_path,
        timeout_s=SAFETY_S,
    )
    assert done.returncode == 0, done.stderr
    assert "math_with_judge=5 workplace_assistant=5 total=10" in done.stdout
    return [json.loads(line) for line in (tmp_path / "mixed.jsonl").read_text().splitlines()]


def launch_client(
    stack: GatewayProcess, policy: PolicyByToken, row: dict[str, Any], io_dir: Path, token: str
) -> subprocess.Popen[str]:
    """`relax-gym-client` as Relax launches it for a mixed job: no NEMO_GYM_ENVIRONMENT / NEMO_GYM_CONFIG."""
    io_dir.mkdir()
    (io_dir / "session_input.json").write_text(
        json.dumps({"messages": row["input"], "metadata": row["metadata"]})
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RELAX_", "NEMO_GYM_", "OPENAI_"))}
    environ = {
        **base,
        "RELAX_SESSION_ID": token,
        "RELAX_SESSION_IO_DIR": str(io_dir),
        "RELAX_BASE_URL": policy.server.base_url,
        "RELAX_INPUT_JSON": str(io_dir / "session_input.json"),
        "RELAX_OUTPUT_JSON": str(io_dir / "session_output.json"),
        "NEMO_GYM_URL": stack.url,
        "NEMO_GYM_MODEL": "model",
        "NEMO_GYM_DEADLINE_S": "600",
        "NEMO_GYM_LEASE_S": "60",
        "NEMO_GYM_POLL_INTERVAL_S": "0.05",
    }
    return subprocess.Popen([CLIENT], env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture
def clients() -> Iterator[list[subprocess.Popen[str]]]:
    """The thin clients a test launches: any still running when it ends (an assertion failed first) is
    killed by PID and reaped, its pipes closed, so nothing of it outlives the test."""
    launched: list[subprocess.Popen[str]] = []
    yield launched
    for process in launched:
        if process.poll() is None:
            process.kill()
        process.communicate()


def test_every_mixed_row_reaches_its_own_environment(
    policy: PolicyByToken,
    oracles: dict[str, OracleScript],
    stack: GatewayProcess,
    tmp_path: Path,
    clients: list[subprocess.Popen[str]],
) -> None:
    rows = mixed_dataset(tmp_path)
    launched = []
    for index, row in enumerate(rows):
        token = f"agentic_session_shard_0.session-mix{next(_tokens):04d}"
        environment = row["metadata"]["environment"]
        # A right answer for half the math rows, a wrong one for the rest; the oracle for workplace.
        wrong = environment == "math_with_judge" and index % 2 == 1
        policy.behaviours[token] = (
            (lambda _request: reply_text("\\boxed{-12345}")) if wrong else oracles[environment]
        )
        io_dir = tmp_path / f"io-{index}"
        clients.append(launch_client(stack, policy, row, io_dir, token))
        launched.append((environment, token, wrong, io_dir, clients[-1]))
    for environment, token, wrong, io_dir, process in launched:
        _out, err = process.communicate(timeout=SAFETY_S)
        assert process.returncode == 0, err
        result = json.loads((io_dir / "session_output.json").read_text())
        assert result["reward"] == (0.0 if wrong else 1.0), (environment, result)
        metrics = result["metadata"]["nemo_gym"]["metrics"]
        # Each environment's own plugin mapped the result: the row reached that environment's servers.
        assert ("library_reward" in metrics) is (environment == "math_with_judge")
        assert ("turns" in metrics) is (environment == "workplace_assistant")
        requests = policy.requests_of(token)
        assert requests, "every trial called its own policy session"
        # Math rows are one generation without tools; workplace rows carry their tools.
        assert bool(requests[0].body.get("tools")) is (environment == "workplace_assistant")


async def test_a_saturated_workplace_queue_never_delays_math(
    policy: PolicyByToken, oracles: dict[str, OracleScript], stack: GatewayProcess
) -> None:
    hooks = make_plugin_manager()
    workplace = hooks.environments.get("workplace_assistant")
    capacity = workplace.max_concurrency + workplace.queue_capacity
    gate = Gate()
    oracle = oracles["workplace_assistant"]

    def workplace_body(token: str, row: dict[str, Any]) -> dict[str, Any]:
        converted = converted_row(hooks.environments.get("workplace_assistant"), row)
        return {
            "protocol_version": "relax-nemo-gym/v1",
            "request_id": f"relax-sat-{token}",
            "session": {"session_id": token, "group_id": "sat", "rollout_mode": "train"},
            "environment": {
                "name": "workplace_assistant",
                "config": "workplace-assistant-v1",
                "task": {"messages": converted["input"], "metadata": converted["metadata"]},
            },
            "model_endpoint": {"base_url": policy.server.base_url, "api_key": token, "model": "m"},
            "interrupt_policy": "protected",
            "deadline_s": 600,
            "lease_s": 120,
        }

    tokens = [f"agentic_session_shard_0.session-sat{next(_tokens):04d}" for _ in range(capacity)]
    rows = workplace_rows()
    async with httpx.AsyncClient(base_url=stack.url, timeout=60) as http:
        for index, token in enumerate(tokens):
            policy.behaviours[token] = lambda request: oracle(request).held(gate)  # stalls the running ones
            created = await http.post("/v1/trials", json=workplace_body(token, rows[index % len(rows)]))
            assert created.status_code == 202, created.text
        try:
            # The workplace queue is full: one more is refused at once ...
            extra = f"agentic_session_shard_0.session-sat{next(_tokens):04d}"
            refused = await http.post("/v1/trials", json=workplace_body(extra, rows[0]))
            assert refused.status_code == 429
            # ... while a math trial is admitted and completes with its reward, the queue still full.
            math_token = f"agentic_session_shard_0.session-sat{next(_tokens):04d}"
            policy.behaviours[math_token] = oracles["math_with_judge"]
            converted = converted_row(hooks.environments.get("math_with_judge"), math_rows()[0])
            math_body = {
                **workplace_body(math_token, rows[0]),
                "request_id": f"relax-sat-{math_token}",
                "environment": {
                    "name": "math_with_judge",
                    "config": "math-with-judge-v1",
                    "task": {"messages": converted["input"], "metadata": converted["metadata"]},
                },
            }
            assert (await http.post("/v1/trials", json=math_body)).status_code == 202
            async with GatewayClient(stack.url, options=ClientOptions(poll_interval_s=0.05)) as client:
                math = await client.settled(f"relax-sat-{math_token}", timeout_s=SAFETY_S)
            assert (math.status.value, math.reward) == ("completed", 1.0)
            still_full = await http.post("/v1/trials", json=workplace_body(extra, rows[0]))
            assert still_full.status_code == 429
            assert not gate.is_open
        finally:
            gate.open()
            for token in tokens:
                await http.post(f"/v1/trials/relax-sat-{token}/abort")
            async with GatewayClient(stack.url, options=ClientOptions(poll_interval_s=0.1)) as client:
                settled = await asyncio.gather(
                    *(client.settled(f"relax-sat-{token}", timeout_s=SAFETY_S) for token in tokens)
                )
    assert {snapshot.cleanup for snapshot in settled} == {"confirmed"}
