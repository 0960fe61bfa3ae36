"""`relax-gym probe ENV`: ask an environment's real verifier to score its plugin's verifier probes.

Starts only the resources server the environment's agent uses (in the NeMo Gym environment, no Ray), posts
each probe's known output to its `/verify`, and compares the reward with the one the probe expects. It is
how an operator checks an installation, and how a plugin author checks probes, before any trial runs. The
server's model server points at a port nobody listens on: a verifier that needs a model (an LLM judge)
fails loudly here instead of calling anything.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

import httpx
from attrs import frozen

from relax_gym_core.environments import (
    EnvironmentDefinition,
    Hooks,
    NemoGymServer,
    VerifierProbe,
    make_plugin_manager,
    verify_body,
)
from relax_gym_core.errors import ConfigError
from relax_gym_core.gym.processes import free_ports, run_gym_servers

VERIFY_TIMEOUT_S = 120.0


@frozen(kw_only=True)
class ProbeOutcome:
    name: str
    expected: float
    reward: float | None  # None when the verifier gave no usable answer
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.reward is not None and math.isclose(self.reward, self.expected, abs_tol=1e-9)


def resources_server(definition: EnvironmentDefinition) -> NemoGymServer:
    """The resources server the agent is wired to (or the only one)."""
    by_name = {server.name: server for server in definition.servers}
    agent = by_name.get(definition.agent)
    ref = agent.config.get("resources_server") if agent is not None else None
    name = ref.get("name") if isinstance(ref, dict) else None
    if isinstance(name, str) and name in by_name:
        return by_name[name]
    candidates = [server for server in definition.servers if server.kind == "resources_servers"]
    if len(candidates) != 1:
        raise ConfigError(
            f"environment {definition.name!r}: cannot tell which resources server verifies "
            f"(agent {definition.agent!r} names none, and there are {len(candidates)})"
        )
    return candidates[0]


def score(probe: VerifierProbe, post: Callable[[dict[str, Any]], httpx.Response]) -> ProbeOutcome:
    def outcome(reward: float | None, error: str | None = None) -> ProbeOutcome:
        return ProbeOutcome(name=probe.name, expected=probe.expected_reward, reward=reward, error=error)

    try:
        answer = post(verify_body(probe.row, list(probe.output)))
    except httpx.HTTPError as exc:
        return outcome(None, f"/verify failed ({type(exc).__name__})")
    if answer.status_code != 200:
        return outcome(None, f"/verify answered HTTP {answer.status_code}")
    try:
        body = answer.json()
    except ValueError:
        body = None
    reward = body.get("reward") if isinstance(body, dict) else None
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        return outcome(None, "/verify gave no numeric reward")
    return outcome(float(reward))


def run_probes(hooks: Hooks, environment: str, *, python: str | None = None) -> list[ProbeOutcome]:
    """Score every verifier probe of `environment` with its real resources server."""
    definition = hooks.environments.get(environment)  # names what is installed when unknown
    probes = hooks.verifier_probes(environment)
    if not probes:
        raise ConfigError(f"environment {environment!r} has no verifier probes (its plugin returns none)")
    server = resources_server(definition)
    (unused_port,) = free_ports(1, "127.0.0.1")
    print(f"starting NeMo Gym server {server.name} for {len(probes)} probe(s)", file=sys.stderr, flush=True)  # noqa: T201
    with run_gym_servers(
        [server], gateway_host="127.0.0.1", gateway_port=unused_port, python=python
    ) as running:
        url = running[server.name].url
        with httpx.Client(base_url=url, trust_env=False, timeout=VERIFY_TIMEOUT_S) as client:
            return [score(probe, lambda body: client.post("/verify", json=body)) for probe in probes]


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


def probe(environment: str, *, as_json: bool = False) -> tuple[str, bool]:
    """What `relax-gym probe` prints, and whether every probe scored as expected."""
    outcomes = run_probes(make_plugin_manager(), environment)
    if as_json:
        document = [
            {"probe": o.name, "expected": o.expected, "reward": o.reward, "ok": o.ok, "error": o.error}
            for o in outcomes
        ]
        text = json.dumps(document, indent=2)
    else:
        text = format_outcomes(environment, outcomes)
    return text, all(outcome.ok for outcome in outcomes)
