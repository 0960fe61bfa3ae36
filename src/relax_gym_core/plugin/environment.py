"""An environment: what it is (its servers, admission, deadlines, readiness, cleanup contract) and what it
does (convert a row, the /run body, map the result, its verifier probes), in one object.

The methods' defaults are the relax-nemo-gym/v1 reference behaviour (reference.py): a plugin subclasses
EnvironmentDefinition, overrides only what differs, and registers an instance. The gateway looks the
object up once per (environment, config) and calls it on every trial: no hook runs on a trial's path.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from attrs import field, frozen
from attrs.validators import in_

from relax_gym_core.errors import ConfigError, PluginError
from relax_gym_core.plugin import reference
from relax_gym_core.plugin.cleanup import STATELESS, CleanupContract
from relax_gym_core.plugin.probes import VerifierProbe
from relax_gym_core.plugin.runs import RunResult
from relax_gym_core.plugin.servers import NemoGymServer
from relax_gym_core.protocol import Generation, InterruptPolicy
from relax_gym_core.protocol.bridge import MODEL_APIS
from relax_gym_core.protocol.jsonutil import is_finite_json

# The reference's admission limits: the defaults of every environment (below) and spec (specs.py), and of
# the trial engine's Admission, the one source of them.
DEFAULT_MAX_CONCURRENCY = 1
DEFAULT_QUEUE_CAPACITY = 8
DEFAULT_MAX_DEADLINE_S = 3600.0
DEFAULT_INTERRUPT_POLICY = InterruptPolicy.PROTECTED


@frozen(kw_only=True)
class EnvironmentDefinition:
    """An environment a plugin provides: its registered (environment, config) pairs, how to run them, and
    (as methods, reference behaviour by default) how its rows, run bodies and results are shaped."""

    name: str
    configs: tuple[str, ...]
    agent: str  # the server instance whose POST /run runs one trial
    servers: tuple[NemoGymServer, ...]
    cleanup: CleanupContract  # how a run is released and proven released (STATELESS: nothing outlives it)
    description: str = ""
    # What it needs beyond the NeMo Gym environment and a text policy (a vision policy, a pip package, a
    # sandbox...), one short phrase each: `relax-gym plugins` lists them.
    needs: tuple[str, ...] = ()
    # Admission limits (the trial engine admits trials by them); the reference's by default.
    interrupt_policy: InterruptPolicy = DEFAULT_INTERRUPT_POLICY
    max_deadline_s: float = DEFAULT_MAX_DEADLINE_S
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY
    queue_capacity: int = DEFAULT_QUEUE_CAPACITY
    # Servers whose GET / must answer before the environment is ready (default: all of them).
    readiness: tuple[str, ...] | None = None
    # Which runtime runs its trials: "nemo_gym" (its agent server's POST /run), or a runtime a plugin
    # registers with register_runtimes (then `servers` may be empty and `agent` names no server).
    runtime: str = "nemo_gym"
    # How its agent calls the policy through the bridge: the model API ("responses", "chat/completions" or
    # "messages"; the trainer must serve that route), and whether it adds tools of its own to those calls
    # (a coding agent's shell) beyond any its rows carry. `relax-gym relax-args` turns both into flags.
    model_api: str = field(default="responses", validator=in_(MODEL_APIS))
    agent_tools: bool = False

    # ---- behaviour (override what differs from the reference) ---------------------------------------

    def check_row(self, row: dict[str, Any]) -> None:
        """Raise ``RowError`` naming the field for a raw row that cannot be used (the CLI adds file and
        line): what the verifier would otherwise score as a silent 0. The default convert_row checks each
        row with it, and the default build_run_body checks each /run body (the row's fields again)."""
        del row

    def convert_row(self, row: dict[str, Any]) -> dict[str, Any]:
        """One raw NeMo Gym dataset row -> a Relax row ``{"input": [...], "metadata": {...}}``: checked
        (check_row), then the reference conversion."""
        self.check_row(row)
        return reference.convert_row(row)

    def drop_reason(self, row: dict[str, Any]) -> str | None:
        """Why a converted Relax row should be left out of a training mix, or None to keep it
        (`relax-gym mix` counts what it drops by reason, e.g. a row any do-nothing answer scores 1.0)."""
        del row
        return None

    def build_run_body(self, task: dict[str, Any], generation: Generation, rollout_id: str) -> dict[str, Any]:
        """The body of the agent's ``POST /run`` for a trial's task (the Relax session input): the
        reference body, checked like a row (a task that lost its verifier fields fails here, not as a 422
        inside the agent). The gateway adds the trial's model-call tag afterwards; keep the rollout id's
        _ng_task_index/_ng_rollout_index."""
        body = reference.build_run_body(task, generation, rollout_id)
        self.check_row(body)
        return body

    def map_result(self, body: dict[str, Any]) -> RunResult:
        """The agent's ``/run`` answer -> the trial's result. Raise ``EnvironmentFailure(kind=...)`` when
        the answer shows an infrastructure failure: that must never become a reward of 0. The reference
        (and reference.verified_answer / verified_result, which overrides build on) already raises it for a
        failure the environment reports itself (reference.reported_failure: a failed judge, a masked
        sample); an override that knows better decides for itself."""
        return reference.map_result(body, self.name)

    def verifier_probes(self) -> Sequence[VerifierProbe]:
        """Known outputs for real rows and the reward the real verifier must give each (see probes.py)."""
        return ()

    def unavailable(self) -> str | None:
        """What this machine or its configuration lacks to start the environment's servers (one line,
        e.g. an LLM judge endpoint no variable names), or None. `relax-gym up`, `probe` and `rollout`
        refuse to start it with that line (exit 2); `relax-gym plugins` still lists it."""
        return None


def startable(definitions: Iterable[EnvironmentDefinition]) -> None:
    """ConfigError naming the first environment that cannot start here, and what it lacks."""
    for definition in definitions:
        problem = definition.unavailable()
        if problem is not None:
            raise ConfigError(f"environment {definition.name!r} cannot start here: {problem}")


def reference_environment(name: str) -> EnvironmentDefinition:
    """The reference behaviour for an environment no plugin registers (one an environments file names for
    `relax-gym serve`): no servers of its own, its run bodies and results the reference's."""
    return EnvironmentDefinition(name=name, configs=(), agent="", servers=(), cleanup=STATELESS)


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


def converted_row(environment: EnvironmentDefinition, row: dict[str, Any]) -> dict[str, Any]:
    """`environment.convert_row(row)`, checked: a PluginError names the environment if its conversion
    broke the Relax row shape (RowError, the row's own fault, passes through)."""
    converted = environment.convert_row(row)
    problem = relax_row_problem(converted)
    if problem is not None:
        raise PluginError(f"convert_row of environment {environment.name!r}: {problem}")
    return converted
