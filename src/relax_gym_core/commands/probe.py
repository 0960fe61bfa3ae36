"""`relax-gym probe ENV`: the environment's verifier probes scored by its real verifier (gym/probe.py),
printed as a table or JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence

from relax_gym_core.gym.probe import ProbeOutcome, run_probes
from relax_gym_core.plugin import make_plugin_manager


def format_outcomes(environment: str, outcomes: Sequence[ProbeOutcome]) -> str:
    width = max(len(outcome.name) for outcome in outcomes)
    lines = [f"{'probe':{width}}  expected  reward  result"]
    for outcome in outcomes:
        reward = "-" if outcome.reward is None else f"{outcome.reward:g}"
        result = "ok" if outcome.ok else (outcome.error or "MISMATCH")
        lines.append(f"{outcome.name:{width}}  {outcome.expected:>8g}  {reward:>6}  {result}")
    passed = sum(outcome.ok for outcome in outcomes)
    lines.append(f"{environment}: {passed}/{len(outcomes)} probes scored as expected by the real verifier")
    return "\n".join(lines)


def probe(environment: str, *, as_json: bool = False, verifier_url: str | None = None) -> tuple[str, bool]:
    """What `relax-gym probe` prints, and whether every probe scored as expected."""
    outcomes = run_probes(make_plugin_manager(), environment, verifier_url=verifier_url)
    if as_json:
        document = [
            {"probe": o.name, "expected": o.expected, "reward": o.reward, "ok": o.ok, "error": o.error}
            for o in outcomes
        ]
        text = json.dumps(document, indent=2)
    else:
        text = format_outcomes(environment, outcomes)
    return text, all(outcome.ok for outcome in outcomes)
