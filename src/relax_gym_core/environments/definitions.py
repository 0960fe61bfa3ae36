"""What plugins describe: environments, the NeMo Gym servers they need, probes and cleanup contracts.

Plain frozen data, so the gateway, `relax-gym up`, the conformance kit and (later) a durable ledger
can all read it without calling plugin code.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from attrs import field, frozen

from relax_gym_core.protocol import InterruptPolicy
from relax_gym_core.protocol.jsonutil import is_finite_json

type ServerKind = Literal["resources_servers", "responses_api_agents", "responses_api_models"]


@frozen(kw_only=True)
class NemoGymServer:
    """One NeMo Gym server instance an environment needs (a top-level key of the merged config).

    `server_class` ("module:Class") is imported inside the NeMo Gym environment, not by the core: it is
    the installed upstream class, or a plugin's subclass of it. `config` holds the instance's own
    fields (max_steps, references to other servers...); host and port are assigned by the launcher.
    """

    name: str
    kind: ServerKind
    implementation: str  # the upstream directory, e.g. "simple_agent"
    server_class: str
    config: Mapping[str, Any] = field(factory=dict)


@frozen(kw_only=True)
class CleanupContract:
    """How a run's remote state is released and proven released, by rollout id.

    stateless=True means there is nothing to release once the /run call is closed: cleanup is confirmed
    without calls. Otherwise each path (with "{rollout_id}") is called on `server`: abort and force are
    POSTed, the probe is a GET answering {"clean": true} when nothing is left.
    """

    stateless: bool = False
    server: str | None = None
    abort_path: str | None = None
    force_path: str | None = None
    probe_path: str | None = None


STATELESS = CleanupContract(stateless=True)


@frozen(kw_only=True)
class EnvironmentDefinition:
    """An environment a plugin provides: registered (environment, config) pairs and how to run them."""

    name: str
    configs: tuple[str, ...]
    agent: str  # the server instance whose POST /run runs one trial
    servers: tuple[NemoGymServer, ...]
    description: str = ""
    interrupt_policy: InterruptPolicy = InterruptPolicy.PROTECTED
    max_deadline_s: float = 1800.0
    max_concurrency: int = 8
    queue_capacity: int = 32
    # Servers whose GET / must answer before the environment is ready (default: all of them).
    readiness: tuple[str, ...] | None = None


@frozen(kw_only=True)
class VerifierProbe:
    """A known output for a row and the reward the real verifier must give it.

    `row` is a raw NeMo Gym row; `output` is the list of Responses output items an agent would produce
    (function calls and messages). Probes are data, so they also drive oracle policies and reports.
    """

    name: str
    row: Mapping[str, Any]
    output: tuple[Mapping[str, Any], ...]
    expected_reward: float


def verify_body(
    row: Mapping[str, Any], output: Sequence[Mapping[str, Any]], *, model: str = "probe"
) -> dict[str, Any]:
    """A NeMo Gym ``POST /verify`` body: the raw row plus a response around ``output`` (with the fields
    NeMo Gym's response model requires). How probes, and tools built on them, ask the real verifier."""
    params = row.get("responses_create_params")
    params = params if isinstance(params, Mapping) else {}
    return {
        **copy.deepcopy(dict(row)),
        "response": {
            "id": f"resp_{model}",
            "object": "response",
            "created_at": 0,
            "model": model,
            "output": copy.deepcopy([dict(item) for item in output]),
            "parallel_tool_calls": bool(params.get("parallel_tool_calls", False)),
            "tool_choice": "auto",
            "tools": copy.deepcopy(params.get("tools", [])),
        },
    }


def relax_row_problem(row: object) -> str | None:
    """What is wrong with a converted row, or None: a Relax row is exactly
    ``{"input": [messages...], "metadata": {...}}`` of finite JSON (it is written to a JSONL file and read
    back by Relax, which sends ``input`` as the session's messages and ``metadata`` beside them)."""
    if not isinstance(row, dict) or set(row) != {"input", "metadata"}:
        keys = sorted(row) if isinstance(row, dict) else type(row).__name__
        return f"must return exactly {{'input': [...], 'metadata': {{...}}}}, got {keys}"
    if not isinstance(row["input"], list):
        return f"input must be a list of messages, got {type(row['input']).__name__}"
    if not isinstance(row["metadata"], dict):
        return f"metadata must be an object, got {type(row['metadata']).__name__}"
    if not is_finite_json(row):
        return "the converted row must be finite JSON (it is written to a JSONL file)"
    return None


class RowError(ValueError):
    """A raw row cannot be converted; the message says which field and why."""


class EnvironmentFailure(RuntimeError):
    """A run ended in an infrastructure failure (not a model failure): never a reward of 0.

    `kind` names the failure ("verifier_error", "sandbox_lost", ...) and is reported in the trial error.
    """

    def __init__(self, message: str, *, kind: str) -> None:
        super().__init__(message)
        self.kind = kind
