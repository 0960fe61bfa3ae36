"""`relax-gym probe ENV...`: the environments' verifier probes scored by their real servers (gym/probe.py),
printed as a table per environment or as one JSON list."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from relax_gym_core.gym.probe import ProbeOutcome, probe_environments
from relax_gym_core.plugin.host import make_plugin_manager


def format_outcomes(environment: str, outcomes: Sequence[ProbeOutcome]) -> str:
    width = max(len(outcome.name) for outcome in outcomes)
    lines = [f"{'probe':{width}}  expected    reward  result"]
    for outcome in outcomes:
        reward = "-" if outcome.reward is None else f"{outcome.reward:g}"
        if outcome.skipped is not None:
            result = f"skipped: {outcome.skipped}"
        else:
            result = "ok" if outcome.ok else (outcome.error or "MISMATCH")
        lines.append(f"{outcome.name:{width}}  {outcome.expected:>8g}  {reward:>8}  {result}")
    scored = [outcome for outcome in outcomes if outcome.skipped is None]
    passed = sum(outcome.ok for outcome in scored)
    summary = f"{environment}: {passed}/{len(scored)} probes scored as expected by the real verifier"
    skipped = len(outcomes) - len(scored)
    if skipped:
        summary += f"; {skipped} skipped (not scored, not counted)"
    if not scored:
        summary += ": nothing here proves its verifier"
    lines.append(summary)
    return "\n".join(lines)


def passed(outcomes: Sequence[ProbeOutcome]) -> bool:
    """Every scored probe scored as expected, and at least one was scored (skips never count)."""
    scored = [outcome for outcome in outcomes if outcome.skipped is None]
    return bool(scored) and all(outcome.ok for outcome in scored)


def _document(results: Mapping[str, Sequence[ProbeOutcome]]) -> str:
    entries = [
        {
            "environment": environment,
            "probe": o.name,
            "expected": o.expected,
            "reward": o.reward,
            "ok": o.ok,
            "error": o.error,
            "skipped": o.skipped,
        }
        for environment, outcomes in results.items()
        for o in outcomes
    ]
    return json.dumps(entries, indent=2)


def probe(
    environments: str | Sequence[str], *, as_json: bool = False, verifier_url: str | None = None
) -> tuple[str, bool]:
    """What `relax-gym probe` prints, and whether every environment passed (a skipped probe is named with
    its reason and neither passes nor fails; an environment with nothing scored has not passed)."""
    names = [environments] if isinstance(environments, str) else list(environments)
    results = probe_environments(make_plugin_manager(), names, verifier_url=verifier_url)
    if as_json:
        text = _document(results)
    else:
        text = "\n\n".join(format_outcomes(name, outcomes) for name, outcomes in results.items())
    return text, all(passed(outcomes) for outcomes in results.values())
