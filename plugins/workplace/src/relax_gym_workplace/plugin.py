"""The workplace_assistant environment (entry point ``workplace``): NeMo Gym's multi-step office tool use
(email, calendar, analytics, project management, CRM), scored by replaying the calls and comparing final
database state.

The resources server is the installed upstream ``WorkbenchResourcesServer`` extended (subclass, in
relax_gym_workplace.server) so that a trial's tool databases are released when it ends and the release
can be confirmed by rollout id. The agent is the installed upstream ``simple_agent``, unchanged.

What differs from the reference: rows and /run bodies are checked and their ``ground_truth`` normalised
(rows.py: upstream scores any do-nothing answer 1.0 against a string ``ground_truth``), rows without
ground truth are dropped from mixes, probes are derived from each row's ground truth (probes.py), and a
result counts its model responses (``turns``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from relax_gym_core.gym.installed import example_rows as installed_rows
from relax_gym_core.gym.installed import installed_file
from relax_gym_core.ingym import CLEANUP_PATH
from relax_gym_core.plugin import (
    CleanupContract,
    EnvironmentDefinition,
    EnvironmentRegistrar,
    RunResult,
    VerifierProbe,
    hookimpl,
    reference,
    resources_server,
    simple_agent,
)
from relax_gym_core.protocol import Generation

from relax_gym_workplace import probes, rows

RESOURCES_SERVER = "workplace_assistant"
AGENT = "workplace_assistant_simple_agent"
# Upstream's example rows, read in place from the INSTALLED nemo-gym package (never copied here): 5 rows
# without a trailing newline (``wc -l`` says 4).
PACKAGE = "resources_servers.workplace_assistant"
EXAMPLE_FILE = "data/example.jsonl"


def example_path() -> Path:
    """Where the installed example.jsonl is."""
    return installed_file(PACKAGE, EXAMPLE_FILE)


def example_rows() -> list[dict[str, Any]]:
    """The 5 upstream example rows, raw (fresh objects on every call)."""
    return installed_rows(PACKAGE, EXAMPLE_FILE)


def count_turns(output: list[Any]) -> int:
    """How many model responses produced this trajectory (simple_agent's ``response.output``).

    Rule: one turn per maximal run of model-produced items (``message``, ``function_call``,
    ``reasoning``, ...) not interrupted by a ``function_call_output``. simple_agent appends each
    response's items, then the outputs of that response's calls, then asks the model again; so a
    response with calls is always followed by tool outputs, and only a response without calls ends the
    loop (or, holding neither a call nor an assistant message, e.g. reasoning only, is merged into the
    next one: the count is then a lower bound). A message and calls in one response count once.
    """
    turns = 0
    in_turn = False
    for item in output:
        if isinstance(item, dict) and item.get("type") == "function_call_output":
            in_turn = False
        elif not in_turn:
            turns += 1
            in_turn = True
    return turns


class WorkplaceAssistant(EnvironmentDefinition):
    def convert_row(self, row: dict[str, Any]) -> dict[str, Any]:
        return reference.convert_row(rows.normalise_row(row))

    def drop_reason(self, row: dict[str, Any]) -> str | None:
        return rows.drop_reason(row)

    def build_run_body(self, task: dict[str, Any], generation: Generation, rollout_id: str) -> dict[str, Any]:
        # Checked like a row: a task converted elsewhere (or passed through raw) with a string
        # ground_truth must fail here, not be scored 1.0 for doing nothing.
        return rows.normalise_row(reference.build_run_body(task, generation, rollout_id))

    def map_result(self, body: dict[str, Any]) -> RunResult:
        # An answer the verifier never scored is a verifier_error (Relax drops the group), never a 0.
        return reference.verified_result(self.name, body, lambda output: {"turns": count_turns(output)})

    def verifier_probes(self) -> Sequence[VerifierProbe]:
        return probes.verifier_probes(example_rows())


WORKPLACE = WorkplaceAssistant(
    name="workplace_assistant",
    configs=("workplace-assistant-v1",),
    agent=AGENT,
    servers=(
        resources_server(
            RESOURCES_SERVER,
            "workplace_assistant",
            "relax_gym_workplace.server:CleanupWorkbenchResourcesServer",
            domain="agent",
        ),
        # upstream's workplace_assistant.yaml: tasks need a few tool rounds, never an unbounded loop
        simple_agent(AGENT, resources=RESOURCES_SERVER, max_steps=6),
    ),
    # POST releases a rollout's tool databases (abort and force alike), GET proves them gone.
    cleanup=CleanupContract.at(RESOURCES_SERVER, CLEANUP_PATH),
    description=(
        "NeMo Gym workplace_assistant: multi-step office tool use (email, calendar, analytics, project "
        "management, CRM) scored by replaying the calls and comparing final database state."
    ),
    max_deadline_s=1800.0,
    max_concurrency=8,
    queue_capacity=32,
    readiness=(RESOURCES_SERVER, AGENT),
)


@hookimpl
def register_environments(registrar: EnvironmentRegistrar) -> None:
    registrar.add(WORKPLACE)
