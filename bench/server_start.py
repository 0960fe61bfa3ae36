"""Server start benchmark: NeMo Gym servers forked from the fork server vs each in its own interpreter.

Run: .venv/bin/python bench/server_start.py [ENV ...] (needs `make gym`; default: workplace_assistant calendar
gsm8k, six servers). Each way runs in a fresh process (so the fork server's one import of NeMo Gym is
counted), alternated twice; prints wall time until every server answers and the CPU of the whole process
tree (ours, the fork server's, the servers'), best of each, and their ratio. Target: the fork server takes
<= 50 % of the CPU. Exits 0 whatever the figures are.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time

CHILD = """
import sys, time
from relax_gym_core.plugin.host import make_plugin_manager
from relax_gym_core.gym.config import servers_of
from relax_gym_core.gym.processes import run_gym_servers
hooks = make_plugin_manager()
servers = servers_of([hooks.environments.get(name) for name in sys.argv[1:]])
start = time.monotonic()
with run_gym_servers(servers, gateway_host="127.0.0.1", gateway_port=9) as running:
    print(len(running), time.monotonic() - start)
"""
TARGET = 0.5


def once(environments: list[str], fork: bool) -> tuple[int, float, float]:
    """(servers, seconds until all answer, CPU seconds of the whole tree, stops included)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run(
        [sys.executable, "-c", CHILD, *environments],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "RELAX_GYM_FORK_SERVER": "1" if fork else "0"},
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    count, seconds = result.stdout.split()
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return int(count), float(seconds), cpu


def main() -> int:
    environments = sys.argv[1:] or ["workplace_assistant", "calendar", "gsm8k"]
    best: dict[bool, tuple[int, float, float]] = {}
    for _ in range(2):
        for fork in (True, False):
            figures = once(environments, fork)
            if fork not in best or figures[2] < best[fork][2]:
                best[fork] = figures
    for fork, (count, seconds, cpu) in best.items():
        way = "fork server" if fork else "own interpreter"
        print(f"{way:16} {count} servers ready in {seconds:5.1f} s, {cpu:5.1f} CPU-s")
    ratio = best[True][2] / best[False][2]
    verdict = "ok" if ratio <= TARGET else "MISS"
    print(f"CPU fork server / own interpreter: {ratio:.2f} (target <= {TARGET:.2f}) {verdict}")
    return 0


if __name__ == "__main__":
    started = time.monotonic()
    code = main()
    print(f"({time.monotonic() - started:.0f} s)")
    sys.exit(code)
