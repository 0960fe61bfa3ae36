"""Verifier probes scored by an environment's real servers (what `relax-gym probe ENV...` runs).

A probe with a known output is posted to the resources server's `/verify`; a replay probe (a recorded
trajectory) is one `/run` of the environment's real agent, whose model calls a replay server answers with
the recorded model turns, so the tool outputs and observations come live from the servers. Either way the
reward must be the one the probe expects. The servers of every environment probed start once, together
(in the NeMo Gym environment, no Ray), or a resources server already running is used (--verifier-url). It
is how an operator checks an installation or a deployment, and how a plugin author checks probes, before
any trial runs. The replay server answers only the probes' own rollouts: a verifier that needs a model (an
LLM judge) fails loudly instead of calling anything.
"""

from __future__ import annotations

import copy
import functools
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx
from attrs import evolve, frozen

from relax_gym_core.errors import ConfigError
from relax_gym_core.gym.processes import run_gym_servers
from relax_gym_core.plugin import EnvironmentDefinition, NemoGymServer, VerifierProbe, verify_body
from relax_gym_core.plugin.host import Hooks, converted_row, startable
from relax_gym_core.protocol import ROLLOUT_TAG, Generation

VERIFY_TIMEOUT_S = 120.0
# NeMo Gym >= 0.5's resources servers say whether their /verify may run again on a stored answer.
REVERIFY_MODE_PATH = "/reverify_mode"
STATELESS, UNSUPPORTED = "stateless", "unsupported"  # and "unknown"
REFUSED_UNSUPPORTED = (
    "its resources server says its verifier cannot re-score a stored answer (reverify_mode: unsupported)"
)


@frozen(kw_only=True)
class ProbeOutcome:
    name: str
    expected: float
    reward: float | None  # None when the verifier gave no usable answer
    error: str | None = None
    skipped: str | None = None  # why it was not scored (never counted as passing)

    @property
    def ok(self) -> bool:
        return (
            self.skipped is None
            and self.reward is not None
            and math.isclose(self.reward, self.expected, abs_tol=1e-9)
        )


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
    """Score every verifier probe of `environment` with its real servers: one started here, or the
    resources server already running at `verifier_url` (a deployment's, checked without starting
    anything; a replay probe needs the agent, so it is skipped there)."""
    return probe_environments(hooks, [environment], python=python, verifier_url=verifier_url)[environment]


def probe_environments(
    hooks: Hooks,
    environments: Sequence[str],
    *,
    python: str | None = None,
    verifier_url: str | None = None,
    probes: Mapping[str, Sequence[VerifierProbe]] | None = None,
    reverify: Mapping[str, str | None] | None = None,
) -> dict[str, list[ProbeOutcome]]:
    """The probes of several environments in one server set: each one's resources server (for probes
    posted to /verify) and, for replays, its agent with a replay model server; one start for them all.
    `probes` stands in for the plugins' own (by environment): stored answers to re-score, say. With
    `reverify` (by environment: why it may not be re-scored, None if it may), each resources server is asked
    its reverify_mode first: "stateless" re-scores, "unsupported" refuses, and anything else (an older NeMo
    Gym has no such route) leaves the environment's own answer; a refused environment's probes are skipped
    with the reason."""
    definitions = [hooks.environments.get(name) for name in dict.fromkeys(environments)]
    plans = {
        definition.name: _plan(definition) if probes is None else _Plan(probes.get(definition.name, ()))
        for definition in definitions
    }
    if verifier_url is None:
        startable(d for d in definitions if plans[d.name].replays or plans[d.name].verified)
    if verifier_url is not None:
        if len(definitions) != 1:
            raise ConfigError("--verifier-url names one resources server: probe one environment with it")
        (plan,) = plans.values()
        url = _checked_url(verifier_url)
        unreachable = "a replay needs the agent, not --verifier-url"
        plan.outcomes |= {probe.name: _skipped(probe, unreachable) for probe in plan.replays}
        plan.outcomes |= {outcome.name: outcome for outcome in _score_all(plan.verified, url)}
        return {name: plan.ordered() for name, plan in plans.items()}
    servers = _server_set([(d, plans[d.name]) for d in definitions])
    if servers:
        _replay_and_verify(definitions, plans, servers, python, reverify or {})
    return {name: plan.ordered() for name, plan in plans.items()}


def reverify_mode(client: httpx.Client, base_url: str) -> str | None:
    """What a resources server says of re-running its /verify on a stored answer (GET /reverify_mode:
    stateless, unsupported or unknown), or None when it says nothing (NeMo Gym before 0.5: no such route)."""
    try:
        answer = client.get(f"{base_url}{REVERIFY_MODE_PATH}")
        mode = answer.json() if answer.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return mode if isinstance(mode, str) else None


def reverify_refusal(client: httpx.Client, base_url: str, own: str | None) -> str | None:
    """Why the stored answers of the environment whose resources server is at `base_url` may not be
    re-scored, or None: the server's own word first, else `own` (the environment's cleanup contract)."""
    mode = reverify_mode(client, base_url)
    if mode == UNSUPPORTED:
        return REFUSED_UNSUPPORTED
    return None if mode == STATELESS else own


class _Plan:
    """One environment's probes, split by how each is scored, and their outcomes as they come in."""

    def __init__(self, probes: Sequence[VerifierProbe]) -> None:
        self.probes = list(probes)
        self.outcomes = {p.name: _skipped(p, p.skip) for p in self.probes if p.skip is not None}
        self.replays = [p for p in self.probes if p.replay and p.skip is None]
        self.verified = [p for p in self.probes if not p.replay and p.skip is None]

    def ordered(self) -> list[ProbeOutcome]:
        return [self.outcomes[probe.name] for probe in self.probes]


def _plan(definition: EnvironmentDefinition) -> _Plan:
    probes = list(definition.verifier_probes())
    if not probes:
        raise ConfigError(f"environment {definition.name!r} has no verifier probes (its plugin returns none)")
    names = [probe.name for probe in probes]
    if len(set(names)) != len(names):
        raise ConfigError(f"environment {definition.name!r}: two verifier probes share a name")
    return _Plan(probes)


def _server_set(planned: Sequence[tuple[EnvironmentDefinition, _Plan]]) -> list[NemoGymServer]:
    """Every server the probes need, once: the agent's whole set for replays, else the resources server."""
    chosen: dict[str, NemoGymServer] = {}
    for definition, plan in planned:
        needed = list(definition.servers) if plan.replays else [resources_server(definition)]
        if not plan.replays and not plan.verified:
            needed = []
        for server in needed:
            if chosen.setdefault(server.name, server) != server:
                raise ConfigError(
                    f"environments probed together both define NeMo Gym server {server.name!r} "
                    "differently: probe them one at a time"
                )
    return list(chosen.values())


def _status(message: str) -> None:
    print(message, file=sys.stderr, flush=True)  # noqa: T201 - progress for the operator, not data


def _skipped(probe: VerifierProbe, reason: str) -> ProbeOutcome:
    return ProbeOutcome(name=probe.name, expected=probe.expected_reward, reward=None, skipped=reason)


def _replay_and_verify(
    definitions: Sequence[EnvironmentDefinition],
    plans: Mapping[str, _Plan],
    servers: Sequence[NemoGymServer],
    python: str | None,
    reverify: Mapping[str, str | None],
) -> None:
    """Start the servers with a replay model server as their policy model, then score every probe: a
    replay is one /run of the agent (the recorded model turns answered in order by rollout id, the tool
    outputs live), a verified probe one /verify of the resources server."""
    from relax_gym_core.policies.replay import ReplayPlan, replay_app, rollout_of  # noqa: PLC0415
    from relax_gym_core.policies.threaded import ThreadedServer  # noqa: PLC0415 - the web stack

    recorded: dict[str, ReplayPlan] = {}
    divergences: dict[str, str] = {}
    runs: list[tuple[EnvironmentDefinition, VerifierProbe, str]] = []
    for definition in definitions:
        for probe in plans[definition.name].replays:
            rollout_id = f"{len(runs)}-0"
            recorded[rollout_id] = ReplayPlan.of(probe)
            runs.append((definition, probe, rollout_id))

    def lookup(path: str, body: Mapping[str, Any]) -> ReplayPlan | None:
        return recorded.get(rollout_of(path, body) or "")

    model = ThreadedServer(replay_app(lookup, divergences))
    model.start()
    try:
        port = httpx.URL(model.url).port or 0
        count = sum(len(plan.replays) + len(plan.verified) for plan in plans.values())
        _status(f"starting {len(servers)} NeMo Gym server(s) for {count} probe(s)")
        with (
            run_gym_servers(servers, gateway_host="127.0.0.1", gateway_port=port, python=python) as running,
            httpx.Client(trust_env=False, timeout=VERIFY_TIMEOUT_S) as client,
        ):
            for definition, probe, rollout_id in runs:
                run = functools.partial(_post, client, f"{running[definition.agent].url}/run")
                outcome = _replayed(definition, probe, rollout_id, run)
                if outcome.error is not None and rollout_id in divergences:
                    outcome = evolve(outcome, error=divergences[rollout_id])
                plans[definition.name].outcomes[probe.name] = outcome
            for definition in definitions:
                plan = plans[definition.name]
                base = running[resources_server(definition).name].url if plan.verified else ""
                if plan.verified and definition.name in reverify:
                    refusal = reverify_refusal(client, base, reverify[definition.name])
                    if refusal is not None:
                        plan.outcomes |= {probe.name: _skipped(probe, refusal) for probe in plan.verified}
                        continue
                for probe in plan.verified:
                    plan.outcomes[probe.name] = score(
                        probe, functools.partial(_post, client, f"{base}/verify")
                    )
    finally:
        model.stop()


def _post(client: httpx.Client, url: str, body: dict[str, Any]) -> httpx.Response:
    return client.post(url, json=body)


def _replayed(
    definition: EnvironmentDefinition,
    probe: VerifierProbe,
    rollout_id: str,
    post: Callable[[dict[str, Any]], httpx.Response],
) -> ProbeOutcome:
    """One replay: the probe's row as a trial's /run body (converted as Relax sends it, tagged with the
    rollout id as the gateway tags it); the agent's reward must be the recorded one."""

    def outcome(reward: float | None, error: str | None = None) -> ProbeOutcome:
        return ProbeOutcome(name=probe.name, expected=probe.expected_reward, reward=reward, error=error)

    converted = converted_row(definition, copy.deepcopy(dict(probe.row)))
    task = {"messages": converted["input"], "metadata": converted["metadata"]}
    body = definition.build_run_body(task, Generation(), rollout_id)
    params = body["responses_create_params"]
    metadata = params.get("metadata")
    params["metadata"] = {**(metadata if isinstance(metadata, dict) else {}), ROLLOUT_TAG: rollout_id}
    try:
        answer = post(body)
    except httpx.HTTPError as exc:
        return outcome(None, f"/run failed ({type(exc).__name__})")
    if answer.status_code != 200:
        return outcome(None, f"/run answered HTTP {answer.status_code}")
    try:
        reward = answer.json().get("reward")
    except (ValueError, AttributeError):
        reward = None
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        return outcome(None, "/run gave no numeric reward")
    return outcome(float(reward))


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
