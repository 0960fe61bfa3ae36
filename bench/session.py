"""What a Relax session costs on Relax's side: N sessions launched the way Relax's managed-agent launcher does
(`bash -lc '<agent command>'`, a fresh process each, its RELAX_* variables and session files), against a real
`relax-gym serve` running echo trials, one after another, side by side with the bare interpreter doing
nothing under the same launch.

Run: .venv/bin/python bench/session.py [--sessions 40] [--command "relax-gym-client"]

Prints CPU (user + system of the whole launched process tree, from the kernel's child accounting) and wall
per session, medians over interleaved rounds, and each session's figure above the bare interpreter against
issue 36's targets (<= 40 ms of CPU, <= 60 ms of wall). Exits 0 whatever the figures: a slow machine shows
MISS, it does not fail.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from relax_gym_core.testing.web import start_gateway

ECHO = {"echo": {"environment": "echo", "runtime": "echo", "max_concurrency": 4, "queue_capacity": 4}}
TARGET_CPU_S = 0.040
TARGET_WALL_S = 0.060
BARE = f"{shlex.quote(sys.executable)} -c pass"
CLIENT = shlex.quote(str(Path(sys.executable).with_name("relax-gym-client")))


def launch(command: str, gateway: str, io_dir: Path, index: int) -> tuple[float, float, int]:
    """One session as Relax launches it: (CPU s of the process tree, wall s, exit code)."""
    session = io_dir / f"relax-agentic-command-{index}"
    session.mkdir()
    (session / "session_input.json").write_text(
        json.dumps({"messages": [{"role": "user", "content": "hi"}], "metadata": {"echo": {}}})
    )
    environ = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("RELAX_", "NEMO_GYM_", "OPENAI_"))},
        "RELAX_SESSION_ID": f"bench-session-{index}",
        "RELAX_GROUP_ID": f"train:group_{index}",
        "RELAX_ROLLOUT_MODE": "train",
        "RELAX_BASE_URL": "http://127.0.0.1:9/agentic_api/",
        "RELAX_SESSION_IO_DIR": str(session),
        "RELAX_INPUT_JSON": str(session / "session_input.json"),
        "RELAX_OUTPUT_JSON": str(session / "session_output.json"),
        "NEMO_GYM_URL": gateway,
        "NEMO_GYM_ENVIRONMENT": "echo",
    }
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(["bash", "-lc", command], env=environ, capture_output=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=40, help="sessions per command (default 40)")
    parser.add_argument(
        "--command", default=CLIENT, help="the agent command (default: this relax-gym-client)"
    )
    args = parser.parse_args()
    figures: dict[str, tuple[list[float], list[float]]] = {"bare": ([], []), "client": ([], [])}
    with start_gateway(ECHO) as gateway, tempfile.TemporaryDirectory(prefix="relax-gym-bench-") as tmp:
        launch(args.command, gateway.url, Path(tmp), -1)  # warm: bytecode, the gateway's first trial
        for index in range(args.sessions):  # interleaved, so the machine's drift hits both alike
            for name, command in (("bare", BARE), ("client", args.command)):
                cpu, wall, code = launch(command, gateway.url, Path(tmp), 2 * index + (name == "client"))
                if code != 0:
                    raise SystemExit(f"{name} session {index} exited {code}")
                figures[name][0].append(cpu)
                figures[name][1].append(wall)
    bare_cpu, bare_wall = (statistics.median(values) for values in figures["bare"])
    cpu, wall = (statistics.median(values) for values in figures["client"])
    print(f"{args.sessions} sessions each, medians; launched as `bash -lc '<command>'`")
    print(f"  bare interpreter: {bare_cpu * 1000:7.1f} ms CPU  {bare_wall * 1000:7.1f} ms wall")
    print(f"  {args.command}: {cpu * 1000:7.1f} ms CPU  {wall * 1000:7.1f} ms wall")
    for what, value, target in (
        ("CPU", cpu - bare_cpu, TARGET_CPU_S),
        ("wall", wall - bare_wall, TARGET_WALL_S),
    ):
        verdict = "ok" if value <= target else "MISS"
        above = f"{value * 1000:7.1f} ms {what}"
        print(f"  above the bare interpreter: {above} (target <= {target * 1000:.0f} ms) {verdict}")


if __name__ == "__main__":
    main()
