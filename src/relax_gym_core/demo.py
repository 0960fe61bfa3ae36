"""`make demo`: a gateway with the built-in echo environment, and sessions run the way Relax runs them.

Each session is a real `relax-gym-client` process with Relax's RELAX_* variables, an input file and an
output file; the gateway is a real `relax-gym serve` process. Everything binds 127.0.0.1 and is stopped
by PID at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from relax_gym_core.testing.processes import start_gateway

ENVIRONMENTS = {
    "echo": {"environment": "echo", "runtime": "echo", "max_concurrency": 4, "queue_capacity": 16}
}
SESSIONS: list[tuple[str, dict[str, Any]]] = [
    ("solves it", {"reward": 1.0, "sleep_s": 0.2}),
    ("partial credit", {"reward": 0.5, "sleep_s": 0.4}),
    ("wrong answer", {"reward": 0.0, "sleep_s": 0.1}),
    ("scored object", {"reward": {"scalar": 0.75, "components": {"format": 1.0}}}),
    ("slow one", {"reward": 1.0, "sleep_s": 1.0}),
    ("environment crashes", {"fail": True}),
]


def _launch(
    root: Path, gateway_url: str, index: int, echo: dict[str, Any]
) -> tuple[subprocess.Popen[str], Path]:
    io_dir = root / f"session-{index}"
    io_dir.mkdir()
    (io_dir / "session_input.json").write_text(
        json.dumps(
            {"messages": [{"role": "user", "content": f"demo task {index}"}], "metadata": {"echo": echo}}
        )
    )
    env = {
        **os.environ,
        "RELAX_SESSION_ID": f"agentic_session_shard_0.session-demo{index:028d}",
        "RELAX_GROUP_ID": "demo:prepare_group_0",
        "RELAX_ROLLOUT_MODE": "train",
        "RELAX_SESSION_IO_DIR": str(io_dir),
        "RELAX_INPUT_JSON": str(io_dir / "session_input.json"),
        "RELAX_OUTPUT_JSON": str(io_dir / "session_output.json"),
        "RELAX_BASE_URL": "http://127.0.0.1:1/agentic_api/",  # the echo environment makes no model calls
        "NEMO_GYM_URL": gateway_url,
        "NEMO_GYM_ENVIRONMENT": "echo",
        "NEMO_GYM_POLL_INTERVAL_S": "0.1",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "relax_gym_core.client"], env=env, stderr=subprocess.PIPE, text=True
    )
    return process, io_dir / "session_output.json"


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="relax-gym-demo-") as tmp, start_gateway(ENVIRONMENTS) as gateway:
        print(f"gateway (pid {gateway.pid}) at {gateway.url}, echo environment, {len(SESSIONS)} sessions\n")
        running = [
            (name, *_launch(Path(tmp), gateway.url, i, echo)) for i, (name, echo) in enumerate(SESSIONS)
        ]
        print(f"{'session':22} {'exit':>4}  {'reward':>7}  {'status':10} what Relax gets")
        for name, process, output in running:
            _, stderr = process.communicate(timeout=120)
            if output.exists():
                result = json.loads(output.read_text())
                meta = result["metadata"]["nemo_gym"]
                detail = f"reward {result['reward']} (cleanup {meta.get('cleanup', '?')})"
                print(
                    f"{name:22} {process.returncode:>4}  {result['reward']:>7}  {meta['status']:10} {detail}"
                )
            else:
                message = stderr.strip().splitlines()[-1] if stderr.strip() else "no output"
                print(f"{name:22} {process.returncode:>4}  {'-':>7}  {'-':10} group dropped: {message}")
        print()
        print(f"gateway health: {json.dumps(_health(gateway.url))}")
    return 0


def _health(url: str) -> dict[str, Any]:
    import httpx  # noqa: PLC0415

    body: dict[str, Any] = httpx.get(f"{url}/healthz", trust_env=False).json()
    return {key: body[key] for key in ("trials", "active_trials", "terminal_trials")}


if __name__ == "__main__":
    sys.exit(main())
