"""Verifier probes scored by an environment's real verifier (what `relax-gym probe ENV` runs).

Starts only the resources server the environment's agent uses (in the NeMo Gym environment, no Ray), or uses
one already running (--verifier-url), posts each probe's known output to its `/verify`, and compares the
reward with the one the probe expects. It is how an operator checks an installation or a deployment, and how
a plugin author checks probes, before any trial runs. A server started here has its model server at a port
nobody listens on: a verifier that needs a model (an LLM judge) fails loudly instead of calling anything.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

import httpx
from attrs import frozen

from relax_gym_core.errors import ConfigError
from relax_gym_core.gym.processes import free_ports, run_gym_servers
from relax_gym_core.plugin import (
    EnvironmentDefinition,
    Hooks,
    NemoGymServer,
    VerifierProbe,
    verify_body,
)

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


def run_probes(
    hooks: Hooks, environment: str, *, python: str | None = None, verifier_url: str | None = None
) -> list[ProbeOutcome]:
    """Score every verifier probe of `environment` with its real resources server: one started here, or
    the one already running at `verifier_url` (a deployment's, checked without starting anything)."""
    definition = hooks.environments.get(environment)  # names what is installed when unknown
    probes = list(definition.verifier_probes())
    if not probes:
        raise ConfigError(f"environment {environment!r} has no verifier probes (its plugin returns none)")
    if verifier_url is not None:
        return _score_all(probes, _checked_url(verifier_url))
    server = resources_server(definition)
    (unused_port,) = free_ports(1, "127.0.0.1")
    print(f"starting NeMo Gym server {server.name} for {len(probes)} probe(s)", file=sys.stderr, flush=True)  # noqa: T201
    with run_gym_servers(
        [server], gateway_host="127.0.0.1", gateway_port=unused_port, python=python
    ) as running:
        return _score_all(probes, running[server.name].url)


def _checked_url(url: str) -> str:
    """The base URL of a running resources server, or a ConfigError naming the URL and what is wrong."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ConfigError(f"--verifier-url {url!r} is not a URL ({exc})") from None
    if parsed.scheme not in {"http", "https"} or not parsed.host:
        raise ConfigError(f"--verifier-url {url!r} must be an http(s) URL with a host")
    try:
        httpx.get(url, trust_env=False, timeout=10.0)
    except httpx.HTTPError as exc:
        raise ConfigError(f"no server answers at --verifier-url {url} ({type(exc).__name__})") from None
    return url.rstrip("/")


def _score_all(probes: Sequence[VerifierProbe], url: str) -> list[ProbeOutcome]:
    with httpx.Client(base_url=url, trust_env=False, timeout=VERIFY_TIMEOUT_S) as client:
        return [score(probe, lambda body: client.post("/verify", json=body)) for probe in probes]
