"""What plugins describe: environments, the NeMo Gym servers they need, probes and cleanup contracts.

Plain frozen data, so the gateway, `relax-gym up`, the conformance kit and (later) a durable ledger
can all read it without calling plugin code.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

from attrs import field, frozen

from relax_gym_core.protocol import InterruptPolicy
from relax_gym_core.protocol.jsonutil import is_finite_json
from relax_gym_core.trials.records import Admission

type ServerKind = Literal["resources_servers", "responses_api_agents", "responses_api_models"]

_ADMISSION = Admission()


class Limits(Protocol):
    """Anything that carries an environment's admission limits (a definition, a spec)."""

    @property
    def interrupt_policy(self) -> InterruptPolicy: ...
    @property
    def max_deadline_s(self) -> float: ...
    @property
    def max_concurrency(self) -> int: ...
    @property
    def queue_capacity(self) -> int: ...


def admission_of(limits: Limits) -> Admission:
    return Admission(
        max_concurrency=limits.max_concurrency,
        queue_capacity=limits.queue_capacity,
        max_deadline_s=limits.max_deadline_s,
        interrupt_policy=limits.interrupt_policy,
    )


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
class CleanupURLs:
    """A run's cleanup endpoints as the runtimes read them: full URLs, each with "{rollout_id}".

    stateless=True means nothing is left once the /run call is closed: cleanup is confirmed without
    calls. Otherwise abort and force cleanup are POSTed and the probe is a GET answering
    {"clean": true} when nothing is left. Field names are the environments file's keys.
    """

    stateless: bool = False
    abort_url: str | None = None
    force_cleanup_url: str | None = None
    cleanup_probe_url: str | None = None


@frozen(kw_only=True)
class CleanupContract:
    """How a plugin's runs are released and proven released: paths on one of its servers.

    `relax-gym up` resolves it against the server's address (resolve()) into the CleanupURLs the
    runtime reads: the one translation between the two.
    """

    stateless: bool = False
    server: str | None = None
    abort_path: str | None = None
    force_path: str | None = None
    probe_path: str | None = None

    @classmethod
    def at(cls, server: str, path: str) -> CleanupContract:
        """The usual contract: one route of `server` (with "{rollout_id}") that POST releases (abort and
        force alike) and GET probes."""
        return cls(server=server, abort_path=path, force_path=path, probe_path=path)

    def resolve(self, base_url: str | None) -> CleanupURLs:
        """The URLs of this contract on a server at `base_url` (None when the contract names none)."""
        if self.stateless:
            return CleanupURLs(stateless=True)

        def url(path: str | None) -> str | None:
            return f"{base_url.rstrip('/')}{path}" if base_url is not None and path is not None else None

        return CleanupURLs(
            abort_url=url(self.abort_path),
            force_cleanup_url=url(self.force_path),
            cleanup_probe_url=url(self.probe_path),
        )


STATELESS = CleanupContract(stateless=True)


@frozen(kw_only=True)
class EnvironmentDefinition:
    """An environment a plugin provides: registered (environment, config) pairs and how to run them."""

    name: str
    configs: tuple[str, ...]
    agent: str  # the server instance whose POST /run runs one trial
    servers: tuple[NemoGymServer, ...]
    description: str = ""
    # Admission limits; their defaults are Admission's (the reference's), the one source of them.
    interrupt_policy: InterruptPolicy = _ADMISSION.interrupt_policy
    max_deadline_s: float = _ADMISSION.max_deadline_s
    max_concurrency: int = _ADMISSION.max_concurrency
    queue_capacity: int = _ADMISSION.queue_capacity
    # Servers whose GET / must answer before the environment is ready (default: all of them).
    readiness: tuple[str, ...] | None = None
    # Which runtime runs its trials: "nemo_gym" (its agent server's POST /run), or a runtime a plugin
    # registers with register_runtimes (then `servers` may be empty and `agent` names no server).
    runtime: str = "nemo_gym"

    @property
    def admission(self) -> Admission:
        return admission_of(self)


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
