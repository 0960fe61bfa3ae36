"""summary.json from trial records: per environment and overall. `relax-gym rollout` writes it and
`relax-gym report` shows it, both through summarize(), so their numbers are the same numbers.

A trial is *scored* when it ended with a reward (completed or truncated) and an *infrastructure failure*
otherwise (failed, aborted by someone else, lost, no reward): failures are counted by kind and never
enter the mean reward, and pass@k only counts scored attempts.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

COUNTED = ("model_calls", "answered_calls")  # per trial, from the trajectory the gateway kept


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between the closest ranks."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of nothing")
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one row from n scored attempts with c passes (1 - C(n-c, k) / C(n, k))."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def is_scored(record: Mapping[str, Any]) -> bool:
    return record.get("failure_kind") is None and isinstance(record.get("reward"), int | float)


def _rounded(value: float) -> float:
    return round(value, 6)


def _distribution(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "mean": _rounded(statistics.fmean(values)),
        "p50": _rounded(percentile(values, 50)),
        "p90": _rounded(percentile(values, 90)),
        "p99": _rounded(percentile(values, 99)),
        "max": _rounded(max(values)),
    }


def group_stats(
    records: Sequence[Mapping[str, Any]], *, repeats: int, pass_threshold: float
) -> dict[str, Any]:
    """The figures of one group of trials (an environment, or all of them)."""
    scored = [record for record in records if is_scored(record)]
    rewards = [float(record["reward"]) for record in scored]
    failures = Counter(str(record["failure_kind"]) for record in records if not is_scored(record))
    attempts: dict[int, list[bool]] = defaultdict(list)
    for record in scored:
        attempts[record["row"]].append(float(record["reward"]) >= pass_threshold)
    passes: dict[str, float] = {}
    for k in range(1, max(repeats, 1) + 1):
        per_row = [pass_at_k(len(seen), sum(seen), k) for seen in attempts.values() if len(seen) >= k]
        if per_row:
            passes[str(k)] = _rounded(statistics.fmean(per_row))
    latencies = [
        float(record["timings"]["total_s"])
        for record in records
        if isinstance(record.get("timings"), dict)
        and isinstance(record["timings"].get("total_s"), int | float)
    ]
    calls, answered = ([float(r[key]) for r in records if isinstance(r.get(key), int)] for key in COUNTED)
    tokens = [
        float(record["input_tokens"] + record["output_tokens"])
        for record in records
        if isinstance(record.get("input_tokens"), int) and isinstance(record.get("output_tokens"), int)
    ]
    return {
        "trials": len(records),
        "rows": len({record["row"] for record in records}),
        "scored": len(scored),
        "infra_failures": sum(failures.values()),
        "failures_by_kind": dict(sorted(failures.items())),
        "mean_reward": _rounded(statistics.fmean(rewards)) if rewards else None,
        "reward_stdev": _rounded(statistics.pstdev(rewards)) if rewards else None,
        "pass_at_k": passes,
        "latency_s": _distribution(latencies),
        "model_calls": _distribution(calls),
        "answered_calls": _distribution(answered),  # per trial, from the trajectories the gateway kept
        "tokens": _distribution(tokens),  # input + output, as the model reported them
        "statuses": dict(sorted(Counter(str(record.get("status")) for record in records).items())),
        "cleanup": dict(sorted(Counter(str(record.get("cleanup")) for record in records).items())),
    }


def summarize(
    records: Iterable[Mapping[str, Any]],
    *,
    run: Mapping[str, Any],
    repeats: int,
    pass_threshold: float,
    planned: int,
    complete: bool,
) -> dict[str, Any]:
    """The summary.json document of these trial records."""
    ordered = sorted(records, key=lambda record: (record["row"], record["repeat"]))
    by_environment: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for record in ordered:
        by_environment[str(record.get("environment"))].append(record)
    return {
        "run": {**run, "repeats": repeats, "pass_threshold": pass_threshold},
        "planned": planned,
        "finished": len(ordered),
        "complete": complete,
        "environments": {
            name: group_stats(group, repeats=repeats, pass_threshold=pass_threshold)
            for name, group in sorted(by_environment.items())
        },
        "overall": group_stats(ordered, repeats=repeats, pass_threshold=pass_threshold),
    }
