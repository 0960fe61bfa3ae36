"""`make demo`: trials run the way Relax runs them, through the real gateway and thin client.

1. The built-in echo environment behind `relax-gym serve`.
2. Workplace Assistant (if its plugin is installed) behind `relax-gym up`: the real NeMo Gym 0.4.0 servers,
   with an oracle policy that replays each example row's known-good trajectory (built from the plugin's
   verifier probes: no language model runs here), and one lazy session that answers without acting.

Each session is a real `relax-gym-client` process with Relax's RELAX_* variables, an input file and an
output file. Everything binds 127.0.0.1 and every process is stopped by PID at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
import httpx

from relax_gym_core.client import ClientOptions, GatewayClient
from relax_gym_core.environments import UnknownEnvironmentError, make_plugin_manager
from relax_gym_core.testing.oracle import OracleScript
from relax_gym_core.testing.policy import ScriptedPolicy
from relax_gym_core.testing.processes import start_gateway, start_up
from relax_gym_core.testing.replies import RecordedRequest, ScriptedReply, reply_text

ECHO_SPECS = {"echo": {"environment": "echo", "runtime": "echo", "max_concurrency": 4, "queue_capacity": 16}}
ECHO_SESSIONS: list[tuple[str, dict[str, Any]]] = [
    ("solves it", {"reward": 1.0, "sleep_s": 0.2}),
    ("partial credit", {"reward": 0.5, "sleep_s": 0.4}),
    ("wrong answer", {"reward": 0.0, "sleep_s": 0.1}),
    ("scored object", {"reward": {"scalar": 0.75, "components": {"format": 1.0}}}),
    ("environment crashes", {"fail": True}),
]
WORKPLACE = "workplace_assistant"
LAZY = "-lazy"


class Session:
    """One managed-agent launch, as Relax does it: env vars, input file, output file, exit code."""

    def __init__(
        self,
        root: Path,
        index: int,
        name: str,
        session_input: dict[str, Any],
        env: dict[str, str],
        *,
        session_suffix: str = "",
    ) -> None:
        self.name = name
        self.gateway_url = env["NEMO_GYM_URL"]
        io_dir = root / f"session-{index}"
        io_dir.mkdir()
        (io_dir / "session_input.json").write_text(json.dumps(session_input))
        self.output = io_dir / "session_output.json"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "relax_gym_core.client"],
            env={
                **os.environ,
                "RELAX_SESSION_ID": f"agentic_session_shard_0.session-demo{index:04d}{session_suffix}",
                "RELAX_GROUP_ID": "demo:prepare_group_0",
                "RELAX_ROLLOUT_MODE": "eval",
                "RELAX_SESSION_IO_DIR": str(io_dir),
                "RELAX_INPUT_JSON": str(io_dir / "session_input.json"),
                "RELAX_OUTPUT_JSON": str(self.output),
                "NEMO_GYM_POLL_INTERVAL_S": "0.1",
                **env,
            },
            stderr=subprocess.PIPE,
            text=True,
        )

    def report(self) -> str:
        _, stderr = self.process.communicate(timeout=600)
        code = self.process.returncode
        if not self.output.exists():
            message = stderr.strip().splitlines()[-1] if stderr.strip() else "no output"
            return f"{self.name:34} exit {code}  group dropped: {message}"
        result = json.loads(self.output.read_text())
        meta = result["metadata"]["nemo_gym"]
        calls = meta.get("metrics", {}).get("tool_calls")
        extra = f", {calls} tool calls" if calls is not None else ""
        return (
            f"{self.name:34} exit {code}  reward {result['reward']!s:5} {meta['status']:9} "
            f"(cleanup {settled_cleanup(self.gateway_url, meta['request_id'])}{extra})"
        )


def settled_cleanup(gateway_url: str, request_id: str) -> str:
    """The trial's cleanup verdict once it is in. The client reports the snapshot at completion, and Relax
    needs the reward without waiting on cleanup; the demo waits, to show each trial's cleanup proven."""

    async def wait() -> str:
        async with GatewayClient(gateway_url, options=ClientOptions(poll_interval_s=0.05)) as client:
            snapshot = await client.settled(request_id, timeout_s=60)
        return snapshot.cleanup.value if snapshot.cleanup is not None else "?"

    try:
        return anyio.run(wait)
    except TimeoutError:
        return "pending"


def health(url: str) -> str:
    body = httpx.get(f"{url}/healthz", trust_env=False).json()
    return json.dumps({key: body[key] for key in ("trials", "active_trials", "terminal_trials")})


def echo_demo(root: Path) -> None:
    with start_gateway(ECHO_SPECS) as gateway:
        print(f"[1] echo environment: gateway pid {gateway.pid} at {gateway.url}")
        env = {
            "NEMO_GYM_URL": gateway.url,
            "NEMO_GYM_ENVIRONMENT": "echo",
            "RELAX_BASE_URL": "http://127.0.0.1:1/",
        }
        sessions = [
            Session(
                root,
                i,
                name,
                {"messages": [{"role": "user", "content": name}], "metadata": {"echo": echo}},
                env,
            )
            for i, (name, echo) in enumerate(ECHO_SESSIONS)
        ]
        for session in sessions:
            print("   ", session.report())
        print(f"    gateway health: {health(gateway.url)}\n")


def workplace_demo(root: Path) -> None:
    hooks = make_plugin_manager()
    try:
        hooks.environments.get(WORKPLACE)
    except UnknownEnvironmentError:
        print("[2] workplace_assistant: plugin not installed (pip install relax-gym-workplace)")
        return
    probes = hooks.verifier_probes(WORKPLACE)
    oracle = OracleScript(probes)

    def policy_script(request: RecordedRequest) -> ScriptedReply:
        return reply_text("All done.") if (request.bearer or "").endswith(LAZY) else oracle(request)

    rows = list({str(p.row["id"]): p.row for p in probes}.values())
    print(
        f"[2] workplace_assistant: starting the NeMo Gym servers ({len(rows)} example rows, oracle policy)..."
    )
    with ScriptedPolicy(policy_script) as policy, start_up([WORKPLACE]) as gateway:
        print(f"    gateway at {gateway.url}; Relax's model API stand-in at {policy.base_url}")
        env = {
            "NEMO_GYM_URL": gateway.url,
            "NEMO_GYM_ENVIRONMENT": WORKPLACE,
            "NEMO_GYM_CONFIG": "workplace-assistant-v1",
            "RELAX_BASE_URL": policy.base_url,
        }
        sessions = []
        for index, row in enumerate([*rows, rows[0]]):
            converted = hooks.convert_row(WORKPLACE, dict(row))
            lazy = index == len(rows)
            name = f"row {row['id']} ({row['category'].removeprefix('workplace_assistant_')})"
            session_input = {"messages": converted["input"], "metadata": converted["metadata"]}
            suffix = LAZY if lazy else ""
            sessions.append(
                Session(
                    root,
                    100 + index,
                    name + (" lazy" if lazy else ""),
                    session_input,
                    env,
                    session_suffix=suffix,
                )
            )
        for session in sessions:
            print("   ", session.report())
        bridged = len(policy.model_requests("responses"))
        print(f"    model calls bridged: {bridged}; gateway health: {health(gateway.url)}")


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="relax-gym-demo-") as tmp:
        echo_demo(Path(tmp))
        workplace_demo(Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
