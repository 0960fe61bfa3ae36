"""The environment countdown, relax-gym's side (the entry point):
its servers, its rows, their checks and the verifier probes over them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from typing import Any

from relax_gym_core.plugin import (
    STATELESS,
    EnvironmentDefinition,
    EnvironmentRegistrar,
    RowError,
    VerifierProbe,
    answer,
    hookimpl,
    resources_server,
    simple_agent,
)

RESOURCES = "countdown"
AGENT = "countdown_simple_agent"
# The resources server's class, imported by the NeMo Gym environment's interpreter, never by this one.
SERVER_CLASS = "relax_gym_countdown.server:CountdownResourcesServer"


def example_rows() -> list[dict[str, Any]]:
    """The raw NeMo Gym rows shipped with the package (data/example.jsonl), fresh on every call."""
    text = resources.files(__package__).joinpath("data/example.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


class Countdown(EnvironmentDefinition):
    def check_row(self, row: dict[str, Any]) -> None:
        # What the verifier needs of a row, refused by name (else it would score a silent 0).
        expected = row.get("expected_answer")
        if not isinstance(expected, str) or not expected.strip():
            raise RowError("expected_answer must be a non-empty string")

    def verifier_probes(self) -> Sequence[VerifierProbe]:
        # Known outputs for the shipped rows and the reward the real verifier must give each.
        probes = []
        for index, row in enumerate(example_rows()):
            right, wrong = answer(row["expected_answer"]), answer("not the answer")
            probes += [
                VerifierProbe(name=f"row{index}-right", row=row, output=right, expected_reward=1.0),
                VerifierProbe(name=f"row{index}-wrong", row=row, output=wrong, expected_reward=0.0),
            ]
        return probes


COUNTDOWN = Countdown(
    name="countdown",
    configs=("countdown",),
    agent=AGENT,
    servers=(
        resources_server(RESOURCES, "countdown", SERVER_CLASS),
        simple_agent(AGENT, resources=RESOURCES, max_steps=1),  # one answer per trial
    ),
    cleanup=STATELESS,  # its verifier keeps nothing per trial
    description="a verifier of its own over the rows it ships",
)


@hookimpl
def register_environments(registrar: EnvironmentRegistrar) -> None:
    registrar.add(COUNTDOWN)
