"""`relax-gym reverify DIR`: re-score a rollout's stored trajectories with each environment's current
verifier, without running an agent again, and say which rewards changed.

Each scored trial's trajectory holds what its environment's `/run` got and answered: the row (with its
verifier fields) and the final output items. Those go to the environment's real resources server as one
`POST /verify` each (the probe machinery: gym/probe.py), and the reward it gives is compared with the one
recorded. Whether a verifier can score a stored answer again is first the server's own word (NeMo Gym >=
0.5's `GET /reverify_mode`: "stateless" re-scores, "unsupported" refuses); where it says nothing, an
environment whose cleanup contract is not stateless kept state for each trial (a tool session, a checkout)
that its verifier reads; that state is gone, so its trials are refused, not guessed.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attrs import asdict, frozen

from relax_gym_core.errors import ConfigError, ConversionError
from relax_gym_core.gym.probe import probe_environments
from relax_gym_core.plugin import VerifierProbe
from relax_gym_core.plugin.host import Hooks, make_plugin_manager
from relax_gym_core.rollout.store import load_trajectories, load_trials, read_run
from relax_gym_core.rollout.summary import is_scored

REFUSED_STATEFUL = (
    "its verifier reads state each trial held (its cleanup contract is not stateless), gone with the trial"
)


@frozen(kw_only=True)
class Rescored:
    environment: str
    row: int
    repeat: int
    request_id: str
    recorded: float
    reward: float | None  # None: the verifier gave no usable answer
    error: str | None = None

    @property
    def changed(self) -> bool:
        return self.reward is None or not math.isclose(self.reward, self.recorded, abs_tol=1e-9)


def _stored_answer(document: Mapping[str, Any]) -> tuple[Mapping[str, Any], list[Any]] | None:
    """The row the environment got and the output items it answered, when the trajectory kept both."""
    run = document.get("run") or {}
    request, answer = run.get("request"), run.get("answer")
    response = answer.get("response") if isinstance(answer, Mapping) else None
    output = response.get("output") if isinstance(response, Mapping) else None
    if not isinstance(request, Mapping) or request.get("truncated") is True or not isinstance(output, list):
        return None
    return request, output


def collect(
    directory: Path, hooks: Hooks
) -> tuple[dict[str, list[tuple[dict[str, Any], VerifierProbe]]], dict[str, str], dict[str, int]]:
    """(probes by environment with their records, refusals by environment, trials without a stored answer
    by environment)."""
    if read_run(directory) is None:
        raise ConversionError(f"{directory}: not a rollout directory (no run.json)")
    found, _ = load_trials(directory, repair=False)
    scored = [record for record in found.values() if is_scored(record)]
    documents = load_trajectories(directory, [str(record["request_id"]) for record in scored])
    installed = {definition.name: definition for definition in hooks.environments}
    probes: dict[str, list[tuple[dict[str, Any], VerifierProbe]]] = defaultdict(list)
    refused: dict[str, str] = {}  # environments no trial of which can be re-scored, and why
    missing: dict[str, int] = defaultdict(int)
    for record in sorted(scored, key=lambda r: (r["row"], r["repeat"])):
        environment = str(record["environment"])
        if environment in refused:
            continue
        definition = installed.get(environment)
        if definition is None:
            refused[environment] = "no installed plugin registers it"
            continue
        document = documents.get(str(record["request_id"]))
        stored = _stored_answer(document) if document is not None else None
        if stored is None:
            missing[environment] += 1
            continue
        row, output = stored
        probe = VerifierProbe(
            name=str(record["request_id"]),
            row=row,
            output=tuple(output),
            expected_reward=float(record["reward"]),
        )
        probes[environment].append((record, probe))
    return dict(probes), refused, dict(missing)


def reverify(directory: str, *, as_json: bool = False, python: str | None = None) -> tuple[str, bool]:
    """What `relax-gym reverify` prints, and whether every re-scored reward is the one recorded."""
    hooks = make_plugin_manager()
    probes, refused, missing = collect(Path(directory), hooks)
    if not probes:
        raise _nothing(directory, refused)
    own = {env: None if hooks.environments.get(env).cleanup.stateless else REFUSED_STATEFUL for env in probes}
    outcomes = probe_environments(
        hooks,
        sorted(probes),
        python=python,
        probes={env: [p for _, p in pairs] for env, pairs in probes.items()},
        reverify=own,
    )
    results = []
    for environment, pairs in probes.items():
        skipped = {outcome.skipped for outcome in outcomes[environment]}
        if None not in skipped:  # refused as a whole, before any /verify
            refused[environment] = str(skipped.pop())
            continue
        by_name = {outcome.name: outcome for outcome in outcomes[environment]}
        for record, probe in pairs:
            outcome = by_name[probe.name]
            results.append(
                Rescored(
                    environment=environment,
                    row=record["row"],
                    repeat=record["repeat"],
                    request_id=probe.name,
                    recorded=probe.expected_reward,
                    reward=outcome.reward,
                    error=outcome.error,
                )
            )
    if not results:
        raise _nothing(directory, refused)
    same = all(not result.changed for result in results)
    if as_json:
        document = {
            "rescored": [{**asdict(result), "changed": result.changed} for result in results],
            "refused": refused,
            "without_stored_answer": missing,
        }
        return json.dumps(document, indent=2), same
    return _text(results, refused, missing), same


def _nothing(directory: str, refused: Mapping[str, str]) -> ConfigError:
    reasons = "; ".join(f"{env}: {why}" for env, why in sorted(refused.items())) or "none has a stored answer"
    return ConfigError(f"{directory}: no trial can be re-scored ({reasons})")


def _text(results: list[Rescored], refused: Mapping[str, str], missing: Mapping[str, int]) -> str:
    lines = []
    for environment in sorted({r.environment for r in results}):
        mine = [r for r in results if r.environment == environment]
        changed = [r for r in mine if r.changed]
        lines.append(f"{environment}: {len(mine)} re-scored, {len(mine) - len(changed)} as recorded, "
                     f"{len(changed)} changed")  # fmt: skip
        for r in changed:
            now = f"{r.reward:g}" if r.reward is not None else f"no reward ({r.error})"
            lines.append(f"  row {r.row} repeat {r.repeat}: {r.recorded:g} -> {now}  ({r.request_id})")
        if missing.get(environment):
            lines.append(f"  {missing[environment]} scored trial(s) kept no stored answer (no trajectory)")
    for environment, why in sorted(refused.items()):
        lines.append(f"{environment}: refused: {why}")
    return "\n".join(lines)
