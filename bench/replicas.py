"""Replica benchmark: trials/s through one gateway in front of 1 vs 2 replicas of a stateless environment.

Run: .venv/bin/python bench/replicas.py  (needs `make gym`). Two real `relax-gym up math_with_judge
--replicas N` (N = 1, then 2; the LLM judge off, so the verifier is math-verify alone), each driven by
CONCURRENCY thin clients over TRIALS trials against a scripted policy that answers at once. Prints trials/s
for each and their ratio (trials that did not complete are counted, by error code, not timed), and exits 0
whatever the figures are.

What the ratio means depends on the machine: a replica is CPU (its agent and resources server), so
replicas scale out only when each gets cores of its own. On a 2-core machine the gateway, the policy, the
clients and every server share the same two cores: the ratio there is not a scale-out figure. It shows
the pool's overhead (placement, health probes, a second set of servers competing for CPU), offset by a
single replica's servers (one Python process each) leaving part of the second core idle.
Measured 2026-11-30 on 2 shared, busy cores: 3.8 vs 5.3 trials/s, ratio 1.42 (noisy).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import sys
import time
from collections import Counter
from typing import Any

from relax_gym_core.client import ClientOptions, GatewayClient
from relax_gym_core.plugin.host import converted_row, make_plugin_manager
from relax_gym_core.protocol import PROTOCOL_VERSION, CreateTrialRequest, parse_create_request
from relax_gym_core.testing import reply_text
from relax_gym_core.testing.web import PolicyByToken, start_up

ENVIRONMENT = "math_with_judge"
CONFIG = "math-with-judge-v1"
TRIALS = 300
WARM_UP = 30
CONCURRENCY = 32
JUDGE_OFF = {
    "RELAX_GYM_MATH_JUDGE_URL": "",
    "RELAX_GYM_MATH_JUDGE_MODEL": "",
    "RELAX_GYM_MATH_JUDGE_API_KEY": "",
}
_ids = itertools.count()


def task() -> dict[str, Any]:
    from relax_gym_gsm8k.plugin import example_rows  # noqa: PLC0415 - the plugin is needed only here

    converted = converted_row(make_plugin_manager().environments.get(ENVIRONMENT), example_rows()[0])
    return {"messages": converted["input"], "metadata": converted["metadata"]}


def request(policy: PolicyByToken, body_task: dict[str, Any]) -> CreateTrialRequest:
    token = f"bench-replicas-{next(_ids)}"
    return parse_create_request(
        json.dumps(
            {
                "protocol_version": PROTOCOL_VERSION,
                "request_id": token,
                "session": {"session_id": token, "group_id": "bench", "rollout_mode": "train"},
                "environment": {"name": ENVIRONMENT, "config": CONFIG, "task": body_task},
                "model_endpoint": {"base_url": policy.server.base_url, "api_key": token, "model": "m"},
                "interrupt_policy": "protected",
                "deadline_s": 600,
                "lease_s": 120,
            }
        )
    )


async def drive(
    url: str, policy: PolicyByToken, body_task: dict[str, Any], count: int
) -> tuple[float, Counter[str]]:
    """Run `count` trials, CONCURRENCY at a time: completed trials/s from the first create to the last
    end, and the error codes of those that did not complete (a loaded host times verifiers out)."""
    queue = [request(policy, body_task) for _ in range(count)]
    options = ClientOptions(poll_interval_s=0.02)
    completed = 0
    failures: Counter[str] = Counter()

    async def worker(client: GatewayClient) -> None:
        nonlocal completed
        while queue:
            trial = queue.pop()
            await client.create(trial)
            snapshot = await client.settled(trial.request_id, timeout_s=600)
            if snapshot.status.value == "completed":
                completed += 1
            else:
                error = snapshot.error or {}
                failures[f"{error.get('code')}/{error.get('kind', '-')}"] += 1

    async with GatewayClient(url, options=options) as client:
        started = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(CONCURRENCY)))
        return completed / (time.perf_counter() - started), failures


def measure(replicas: int, policy: PolicyByToken, body_task: dict[str, Any]) -> tuple[float, Counter[str]]:
    args = ("--replicas", str(replicas), "--max-concurrency", str(CONCURRENCY))
    with start_up([ENVIRONMENT], env=JUDGE_OFF, extra_args=args) as gateway:
        asyncio.run(drive(gateway.url, policy, body_task, WARM_UP))  # connections, imports, first calls
        return asyncio.run(drive(gateway.url, policy, body_task, TRIALS))


def main() -> int:
    body_task = task()
    rates: dict[int, float] = {}
    with PolicyByToken(default=lambda _request: reply_text("The answer is \\boxed{18}.")) as policy:
        for replicas in (1, 2):
            rates[replicas], failures = measure(replicas, policy, body_task)
            failed = f", {sum(failures.values())} not completed: {dict(failures)}" if failures else ""
            print(f"{replicas} replica(s): {rates[replicas]:8.1f} trials/s{failed}", flush=True)
    cores = os.cpu_count() or 1
    print(f"ratio 2 / 1 replicas: {rates[2] / max(rates[1], 1e-9):.2f} ({cores} cores)")
    if cores <= 2:
        print(
            "note: on 2 cores every server, the gateway and the clients share the CPU: this ratio is the "
            "pool's overhead against one replica's idle share of the second core, not a scale-out figure "
            "(replicas scale when each gets cores of its own)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
