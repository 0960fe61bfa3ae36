"""The catalogue plugin: one environment per NeMo Gym server that runs here, built from the installed NeMo
Gym's own files (its config, classes, example rows and recorded rollouts, read at run time).

ENTRIES (catalogue.py) says which servers, and what the files cannot: what each needs beyond NeMo Gym and
a text policy, and why a server's recordings cannot be replayed here. Everything else is upstream's: the
agent and resources server instances of its config (their fields as upstream sets them), the classes
their ``app.py`` files run, the rows. A server that keeps per-session state runs as its servers.py
subclass, with the cleanup contract; the others are stateless. Without a NeMo Gym environment nothing is
registered (a warning says why), so the core and the other plugins work as before.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from attrs import field, frozen
from relax_gym_core.errors import ConfigError
from relax_gym_core.ingym import CLEANUP_PATH
from relax_gym_core.plugin import (
    STATELESS,
    CleanupContract,
    EnvironmentDefinition,
    EnvironmentRegistrar,
    JudgeEndpoint,
    JudgeVariables,
    NemoGymServer,
    RunResult,
    VerifierProbe,
    agent_server,
    hookimpl,
    judge_endpoint,
    reference,
    resources_server,
)

from relax_gym_catalogue.catalogue import ENTRIES, Entry
from relax_gym_catalogue.recordings import recorded_probes
from relax_gym_catalogue.servers import REQUIRES, STATE
from relax_gym_catalogue.upstream import (
    NotInstalled,
    UpstreamError,
    UpstreamServer,
    located,
    parse_recorded,
    read_server,
)

logger = logging.getLogger(__name__)

SERVERS = "relax_gym_catalogue.servers"  # the classes of the servers that need imports or cleanup
# The one LLM judge of every judged environment, at the operator's endpoint (never policy_model, the gateway).
JUDGE = JudgeVariables(
    url="RELAX_GYM_JUDGE_URL", model="RELAX_GYM_JUDGE_MODEL", api_key="RELAX_GYM_JUDGE_API_KEY"
)
JUDGE_SERVER = "relax_gym_judge"
JUDGE_FIELD = "judge_model_server"  # where upstream's resources configs name the judge's model server
# Upstream's simple_agent asks the model again until it answers with a message (or calls a tool), up to its
# max_steps, which many configs leave unset: a reasoning-only reply (a thinking model cut off, say) would then
# ask again until the trial's deadline, holding a slot and calling Relax's model every time. So where upstream
# sets no bound: one generation for tasks without tools (what a single-turn task means), and TOOL_STEPS model
# turns where there are tools (more than any of upstream's recordings uses: five).
SIMPLE_AGENT = "simple_agent"
TOOL_STEPS = 16


@frozen(kw_only=True)
class CatalogueEnvironment(EnvironmentDefinition):
    """An upstream server as upstream runs it; its probes replay upstream's recorded rollouts."""

    upstream: UpstreamServer = field(repr=False)
    entry: Entry = field(repr=False)
    missing: str | None = None  # what it lacks to start here (an LLM judge no variable names)

    def map_result(self, body: dict[str, Any]) -> RunResult:
        return reference.verified_result(self.name, body)  # an unscored answer is never a reward of 0

    def verifier_probes(self) -> Sequence[VerifierProbe]:
        lines = [parse_recorded(line) for line in self.upstream.recorded_lines()]
        return recorded_probes(lines, self.upstream.example_rows(), skip=self.entry.skip)

    def unavailable(self) -> str | None:
        return self.missing


def judge_of(environ: Mapping[str, str]) -> tuple[JudgeEndpoint | None, str | None]:
    """The operator's judge endpoint, or why a judged environment cannot start without one."""
    try:
        endpoint = judge_endpoint(JUDGE, environ)
    except ConfigError as exc:
        return None, f"its LLM judge: {exc}"
    if endpoint is None:
        return None, (
            f"its verifier asks an LLM judge: name one with {JUDGE.url} and {JUDGE.model} "
            f"(its key, if any, in {JUDGE.api_key})"
        )
    return endpoint, None


def servers_of(
    upstream: UpstreamServer, *, judged: bool = False, judge: JudgeEndpoint | None = None
) -> tuple[NemoGymServer, ...]:
    """Upstream's resources server and agent instances, the agent's model the policy model (the gateway);
    a server that needs more packages or keeps state runs as its servers.py class; a judged one asks the
    judge's own model server, never the policy (it is there once the operator names the endpoint)."""
    resources = upstream.resources
    server_class = upstream.resources_class
    if upstream.name in STATE or upstream.name in REQUIRES:
        server_class = f"{SERVERS}:{upstream.name}"
    fields = located(resources.own_fields(), upstream.directory)
    if judged:
        fields[JUDGE_FIELD] = {"type": "responses_api_models", "name": JUDGE_SERVER}
    judges = (judge.server(JUDGE_SERVER),) if judge is not None else ()
    return (
        resources_server(resources.name, resources.implementation, server_class, **fields),
        agent_server(
            upstream.agent.name,
            upstream.agent.implementation,
            upstream.agent_class,
            resources=resources.name,
            **agent_fields(upstream),
        ),
        *judges,
    )


def agent_fields(upstream: UpstreamServer) -> dict[str, Any]:
    """Upstream's agent instance fields, its simple_agent bounded where upstream leaves it unbounded."""
    fields = upstream.agent.own_fields()
    if upstream.agent.implementation == SIMPLE_AGENT and fields.get("max_steps") is None:
        fields["max_steps"] = TOOL_STEPS if upstream.offers_tools() else 1
    return fields


def _packages(name: str) -> tuple[str, ...]:
    required = REQUIRES.get(name)
    if not required:
        return ()
    return (f"PyPI {', '.join(required)} in NeMo Gym's environment (make gym installs them)",)


def definition_of(entry: Entry, environ: Mapping[str, str] = os.environ) -> CatalogueEnvironment:
    upstream = read_server(entry.name, entry.config)
    stateful = entry.name in STATE
    judge, missing = judge_of(environ) if entry.judge else (None, None)
    if entry.judge and JUDGE_FIELD not in upstream.resources.fields:
        raise UpstreamError(f"{upstream.name}'s resources config names no {JUDGE_FIELD}")
    needs = (*_packages(entry.name), *entry.needs)
    if entry.judge:
        needs += (f"an LLM judge: {JUDGE.url}, {JUDGE.model} (key: {JUDGE.api_key})",)
    return CatalogueEnvironment(
        name=entry.name,
        configs=(upstream.config,),
        agent=upstream.agent.name,
        servers=servers_of(upstream, judged=entry.judge, judge=judge),
        cleanup=CleanupContract.at(upstream.resources.name, CLEANUP_PATH) if stateful else STATELESS,
        description=f"NeMo Gym {entry.name}: {upstream.description}".rstrip(": "),
        needs=needs,
        max_concurrency=entry.max_concurrency,
        queue_capacity=4 * entry.max_concurrency,
        upstream=upstream,
        entry=entry,
        missing=missing,
    )


def definitions() -> list[CatalogueEnvironment]:
    """Every catalogued server this NeMo Gym has (none, with a warning, without a NeMo Gym); a server it
    does not have at all is left out quietly, one whose files differ with a warning."""
    found = []
    for entry in ENTRIES:
        try:
            found.append(definition_of(entry))
        except ConfigError as exc:  # no NeMo Gym environment: nothing to read the files from
            warnings.warn(f"relax-gym-catalogue registers nothing: {exc}", stacklevel=2)
            return []
        except NotInstalled as exc:  # a server of a later NeMo Gym than this one (CI's 0.4.0): expected
            logger.debug("relax-gym-catalogue leaves out %s: %s", entry.name, exc)
        except UpstreamError as exc:  # the server is there, but its files differ from what is catalogued
            logger.warning("relax-gym-catalogue leaves out %s: %s", entry.name, exc)
    return found


@hookimpl(trylast=True)  # after every other plugin: an environment a plugin of its own runs is that plugin's
def register_environments(registrar: EnvironmentRegistrar) -> None:
    for definition in definitions():
        owner = registrar.registered(definition.name)
        if owner is not None:
            logger.info("relax-gym-catalogue leaves %s to plugin %s", definition.name, owner)
            continue
        registrar.add(definition)
