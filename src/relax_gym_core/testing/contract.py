"""The plugin conformance kit: the checks every environment plugin's own test suite runs.

    from relax_gym_core.testing import (
        check_conversion, check_probes, check_registration, check_result_mapping,
    )

    def test_contract(relax_gym_hooks):
        check_registration(relax_gym_hooks, "workplace")
        check_conversion(relax_gym_hooks, "workplace", SAMPLE_ROWS)
        check_result_mapping(relax_gym_hooks, "workplace", failure_bodies=[CRASHED_RUN])

    def test_verifier(relax_gym_hooks, real_verifier):
        check_probes(relax_gym_hooks, "workplace", real_verifier)

Each check raises ConformanceError (an AssertionError, so pytest reports it as a failure) listing every
rule the plugin broke, with the row or probe it broke it on. Do not call the checks from inside a
hypothesis test: check_conversion runs its own.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from relax_gym_core.errors import PluginError
from relax_gym_core.plugin import EnvironmentDefinition, EnvironmentFailure, RowError
from relax_gym_core.plugin.host import Hooks, converted_row
from relax_gym_core.plugin.runs import RunResult
from relax_gym_core.plugin.servers import SERVER_KINDS
from relax_gym_core.protocol import ROLLOUT_ID, ROLLOUT_INDEX, TASK_INDEX, Generation
from relax_gym_core.protocol.jsonutil import is_finite_json
from relax_gym_core.runtimes.builtin import BUILTIN_RUNTIMES

type Verify = Callable[[dict[str, Any], list[dict[str, Any]]], float]

# Keys the built-in converter changes on purpose: GSM8K's expected_answer is stringified.
REFERENCE_NORMALISED: frozenset[str] = frozenset({"expected_answer"})
_SERVER_CLASS = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_ROLLOUT_ID = "{rollout_id}"


class ConformanceError(AssertionError):
    """A plugin broke the relax-gym plugin contract; the message lists each rule broken and where."""


def _fail_if(problems: Sequence[str], what: str) -> None:
    if problems:
        raise ConformanceError(f"{what}:\n" + "\n".join(f"  - {problem}" for problem in problems))


# ---- registration ----------------------------------------------------------------------------------------


def _server_problems(definition: EnvironmentDefinition) -> list[str]:
    problems: list[str] = []
    names = [server.name for server in definition.servers]
    if len(set(names)) != len(names):
        problems.append(f"server names repeat: {names!r}")
    for server in definition.servers:
        where = f"server {server.name!r}"
        if not server.name.strip():
            problems.append("a server has an empty name")
        if server.kind not in SERVER_KINDS:
            problems.append(f"{where}: kind {server.kind!r} is not one of {sorted(SERVER_KINDS)}")
        if not _SERVER_CLASS.fullmatch(server.server_class):
            problems.append(f"{where}: server_class {server.server_class!r} is not 'module:Class'")
        if not server.implementation.strip():
            problems.append(f"{where}: implementation (the upstream directory) is empty")
        if not is_finite_json(dict(server.config)):
            problems.append(f"{where}: config must be a JSON object")
    problems += [
        f"readiness names {name!r}, which is not one of its servers {names!r}"
        for name in definition.readiness or ()
        if name not in names
    ]
    if definition.runtime != "nemo_gym":
        return problems  # its own runtime runs it: no agent server is needed
    agents = [server for server in definition.servers if server.name == definition.agent]
    if not agents:
        problems.append(f"agent {definition.agent!r} is not one of its servers {names!r}")
    elif agents[0].kind != "responses_api_agents":
        problems.append(f"agent {definition.agent!r} must be a responses_api_agents server (it serves /run)")
    return problems


def _definition_problems(definition: EnvironmentDefinition) -> list[str]:
    problems: list[str] = []
    configs = list(definition.configs)
    if not configs:
        problems.append("configs is empty: register at least one config")
    if any(not isinstance(config, str) or not config.strip() for config in configs):
        problems.append(f"configs must be non-empty strings, got {configs!r}")
    if len(set(configs)) != len(configs):
        problems.append(f"configs repeat a name: {configs!r}")
    if not (math.isfinite(definition.max_deadline_s) and definition.max_deadline_s > 0):
        problems.append(f"max_deadline_s must be a positive number, got {definition.max_deadline_s!r}")
    if definition.max_concurrency < 1:
        problems.append(f"max_concurrency must be at least 1, got {definition.max_concurrency!r}")
    if definition.queue_capacity < 0:
        problems.append(f"queue_capacity must not be negative, got {definition.queue_capacity!r}")
    return problems + _server_problems(definition)


def _cleanup_problems(definition: EnvironmentDefinition) -> list[str]:
    contract = definition.cleanup
    paths = {
        "abort_path": contract.abort_path,
        "force_path": contract.force_path,
        "probe_path": contract.probe_path,
    }
    if contract.stateless:
        set_paths = [key for key, path in paths.items() if path is not None]
        if contract.server is not None or set_paths:
            return [f"cleanup is stateless but also names {contract.server=!r} {set_paths}"]
        return []
    problems: list[str] = []
    names = [server.name for server in definition.servers]
    if contract.server not in names:
        problems.append(f"cleanup.server {contract.server!r} is not one of its servers {names!r}")
    if contract.probe_path is None:
        problems.append("a stateful cleanup contract needs a probe_path to prove a run released")
    for key, path in paths.items():
        if path is not None and (not path.startswith("/") or _ROLLOUT_ID not in path):
            problems.append(f"cleanup.{key} {path!r} must be an absolute path containing {_ROLLOUT_ID}")
    return problems


def check_registration(hooks: Hooks, environment: str, *, installed: bool = True) -> EnvironmentDefinition:
    """The environment is registered with a runnable definition by an identifiable plugin.

    Checks the definition (configs, servers, agent, readiness, limits, a registered runtime), its
    cleanup contract (stateless, or a server and a probe path with "{rollout_id}"), and, unless
    `installed` is False (plugins registered in-process by a test), that the plugin came from a
    distribution with a name and version.
    Returns the definition.
    """
    definition = hooks.environments.get(environment)  # UnknownEnvironmentError names what is installed
    owner = hooks.environments.owner(environment)
    problems = _definition_problems(definition)
    runtimes = {*BUILTIN_RUNTIMES, *hooks.runtimes}
    if definition.runtime not in runtimes:
        registered = ", ".join(sorted(runtimes))
        problems.append(
            f"runtime {definition.runtime!r} is not registered (registered: {registered}); "
            "register it with the register_runtimes hook"
        )
    problems += _cleanup_problems(definition)
    info = hooks.owner(environment)
    if installed and (info is None or not info.distribution or not info.version):
        problems.append(
            f"plugin {owner!r} is not an installed distribution with a version "
            f"(relax-gym plugins shows {info!r}); install it with an entry point in group 'relax_gym'"
        )
    _fail_if(problems, f"environment {environment!r} (plugin {owner!r}) is not registered correctly")
    return definition


# ---- conversion ------------------------------------------------------------------------------------------


def _params_problems(
    raw_params: dict[str, Any], params: dict[str, Any], normalised: Collection[str]
) -> list[str]:
    problems: list[str] = []
    for key, value in raw_params.items():
        if key in normalised or (key == "instructions" and not value):
            continue  # the reference drops falsy instructions
        if key not in params:
            problems.append(f"responses_create_params.{key} did not reach the /run body")
        elif params[key] != value:
            problems.append(f"responses_create_params.{key} came back as {params[key]!r}, expected {value!r}")
    return problems


def _round_trip_problems(
    environment: EnvironmentDefinition,
    *,
    row: Mapping[str, Any],
    converted: dict[str, Any],
    index: int,
    normalised: Collection[str],
) -> list[str]:
    task = {"messages": converted["input"], "metadata": converted["metadata"]}
    sent = copy.deepcopy(task)
    task_index = f"{index:032x}"
    body = environment.build_run_body(sent, Generation(), f"{task_index}-0")
    problems: list[str] = []
    if sent != task:
        problems.append("build_run_body mutated the task it was given")
    params = body.get("responses_create_params") if isinstance(body, dict) else None
    if not isinstance(params, dict):
        return [*problems, "build_run_body must return an object with a responses_create_params object"]
    raw_params = row.get("responses_create_params")
    if isinstance(raw_params, dict):
        problems += _params_problems(raw_params, params, normalised)
    elif params.get("input") != converted["input"]:
        problems.append("the /run input is not the converted prompt")
    for key, value in row.items():
        if key == "responses_create_params":
            continue
        if key not in body:
            problems.append(f"top-level field {key!r} did not come back at the top level of the /run body")
        elif key not in normalised and body[key] != value:
            problems.append(f"top-level field {key!r} came back as {body[key]!r}, expected {value!r}")
    indices = (body.get(TASK_INDEX), body.get(ROLLOUT_INDEX))
    if indices != (task_index, "0"):
        problems.append(f"{TASK_INDEX}/{ROLLOUT_INDEX} are {indices!r}, expected {(task_index, '0')!r}")
    if body.get(ROLLOUT_ID) != f"{task_index}-0":  # NeMo Gym main reads it before the pair
        problems.append(f"{ROLLOUT_ID} is {body.get(ROLLOUT_ID)!r}, expected {f'{task_index}-0'!r}")
    return problems


def _check_rejection(
    environment: EnvironmentDefinition, rows: Sequence[Mapping[str, Any]], max_examples: int
) -> None:
    from hypothesis import HealthCheck, given, settings  # noqa: PLC0415 - only this check needs it

    from relax_gym_core.testing.strategies import corrupted_rows  # noqa: PLC0415

    @settings(
        max_examples=max_examples,
        deadline=None,
        report_multiple_bugs=False,  # one ConformanceError, not an exception group
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(corrupted_rows(rows))
    def broken_rows_convert_or_raise_row_error(broken: dict[str, Any]) -> None:
        try:
            converted_row(environment, broken)  # checks the row shape
        except RowError:
            return
        except PluginError as exc:
            raise ConformanceError(f"{exc} (broken row: {json.dumps(broken)[:500]})") from exc
        except Exception as exc:
            raise ConformanceError(
                f"convert_row raised {type(exc).__name__}: {exc} for a broken row; raise RowError "
                f"naming the field instead (row: {json.dumps(broken)[:500]})"
            ) from exc

    broken_rows_convert_or_raise_row_error()


def check_conversion(
    hooks: Hooks,
    environment: str,
    rows: Iterable[Mapping[str, Any]],
    *,
    normalised: Collection[str] = REFERENCE_NORMALISED,
    max_examples: int = 60,
) -> list[dict[str, Any]]:
    """Real raw rows convert, survive the trip to the /run body, and broken rows fail cleanly.

    Every row must convert (without being mutated) to exactly {"input": list, "metadata": dict} of
    finite JSON. Sent back through build_run_body as a Relax session input, the body must carry the raw
    row's responses_create_params (input included; falsy instructions may be dropped), every other
    top-level field of the raw row unchanged at the top level (keys in `normalised` need only be
    present), and _ng_task_index/_ng_rollout_index from the rollout id. Then `max_examples` random
    corruptions of the rows must each convert or raise RowError, never another exception.
    Returns the converted rows.
    """
    definition = hooks.environments.get(environment)
    samples = [copy.deepcopy(dict(row)) for row in rows]
    if not samples:
        raise ValueError("check_conversion needs at least one real row of the environment")
    problems: list[str] = []
    converted_rows: list[dict[str, Any]] = []
    for index, row in enumerate(samples):
        given_row = copy.deepcopy(row)
        try:
            converted = converted_row(definition, given_row)
        except RowError as exc:
            problems.append(f"rows[{index}]: a good row was refused: {exc}")
            continue
        except PluginError as exc:  # the row shape is broken
            problems.append(f"rows[{index}]: {exc}")
            continue
        if given_row != row:
            problems.append(f"rows[{index}]: convert_row mutated the raw row")
        converted_rows.append(converted)
        problems += [
            f"rows[{index}]: {problem}"
            for problem in _round_trip_problems(
                definition, row=row, converted=converted, index=index, normalised=normalised
            )
        ]
    _fail_if(problems, f"environment {environment!r}: conversion contract broken")
    _check_rejection(definition, samples, max_examples)
    return converted_rows


# ---- results ---------------------------------------------------------------------------------------------


def _map(environment: EnvironmentDefinition, body: dict[str, Any]) -> RunResult | EnvironmentFailure:
    try:
        result = environment.map_result(body)
    except EnvironmentFailure as failure:
        return failure
    if not isinstance(result, RunResult):
        raise ConformanceError(f"map_result must return a RunResult, got {type(result).__name__}")
    return result


def _mapped(
    environment: EnvironmentDefinition, body: dict[str, Any], what: str, problems: list[str], advice: str
) -> RunResult | EnvironmentFailure | None:
    """_map, with any other exception recorded as a problem of `what` (None then): a crash of map_result
    is a finding of the kit, not an error in the plugin's test."""
    try:
        return _map(environment, body)
    except ConformanceError:
        raise
    except Exception as exc:  # noqa: BLE001 - the finding is the exception itself
        problems.append(f"{what} raised {type(exc).__name__}: {exc}; {advice}")
        return None


def check_result_mapping(
    hooks: Hooks,
    environment: str,
    *,
    body: Mapping[str, Any] | None = None,
    failure_bodies: Iterable[Mapping[str, Any]] = (),
    failure_kind: str | None = None,
    reported_failures: bool = True,
) -> None:
    """map_result keeps real rewards and never turns a missing answer or an infrastructure failure into 0.

    `body` is a normal /run answer of the environment (default: an empty response); with its reward set
    to 1.0 and to 0.0 it must map to exactly that reward. Without a reward (reward absent, null, or an
    empty body) the result must be reward None or an EnvironmentFailure. Every one of
    `failure_bodies` (answers the plugin recognises as infrastructure failures) must raise
    EnvironmentFailure with a kind: `failure_kind`, when given (e.g. "verifier_error" for answers the
    verifier never scored, as testing.unscored_answers makes them). With `reported_failures`, `body` in each
    shape NeMo Gym reports a failure in (reported_answers: a failed judge, a masked sample), whatever its
    reward, must raise EnvironmentFailure of the kind that names it.
    """
    definition = hooks.environments.get(environment)
    base = copy.deepcopy(dict(body)) if body is not None else {"response": {"output": []}}
    problems: list[str] = []
    for reward in (1.0, 0.0):
        what = f"a normal body with reward {reward}"
        outcome = _mapped(
            definition, {**copy.deepcopy(base), "reward": reward}, what, problems, "map it to its reward"
        )
        if outcome is None:
            continue
        if isinstance(outcome, EnvironmentFailure):
            problems.append(f"{what} raised EnvironmentFailure({outcome.kind!r})")
        elif outcome.reward != reward or isinstance(outcome.reward, bool):
            problems.append(f"{what} mapped to reward {outcome.reward!r}")
    unscored = {key: value for key, value in base.items() if key != "reward"}
    for label, candidate in (
        ("without a reward", unscored),
        ("with reward null", {**unscored, "reward": None}),
        ("that is empty", {}),
    ):
        advice = "return reward None or raise EnvironmentFailure"
        outcome = _mapped(definition, copy.deepcopy(candidate), f"a body {label}", problems, advice)
        if isinstance(outcome, RunResult) and outcome.reward is not None:
            problems.append(
                f"a body {label} mapped to reward {outcome.reward!r}: a missing reward must stay None "
                "(or raise EnvironmentFailure), never become a score"
            )
    for index, failure in enumerate(failure_bodies):
        what = f"failure_bodies[{index}]"
        outcome = _mapped(
            definition, copy.deepcopy(dict(failure)), what, problems, "raise EnvironmentFailure with a kind"
        )
        if outcome is None:
            continue
        if not isinstance(outcome, EnvironmentFailure):
            problems.append(
                f"failure_bodies[{index}] mapped to a result with reward {outcome.reward!r} instead of "
                "raising EnvironmentFailure: an infrastructure failure must never be scored"
            )
        elif not isinstance(outcome.kind, str) or not outcome.kind:
            problems.append(f"failure_bodies[{index}] raised EnvironmentFailure without a kind")
        elif failure_kind is not None and outcome.kind != failure_kind:
            raised = f"EnvironmentFailure({outcome.kind!r})"
            problems.append(f"failure_bodies[{index}] raised {raised}, not kind {failure_kind!r}")
    if reported_failures:
        _check_reported(definition, base, problems)
    _fail_if(problems, f"environment {environment!r}: result mapping contract broken")


def _check_reported(definition: EnvironmentDefinition, base: dict[str, Any], problems: list[str]) -> None:
    for label, (kind, candidate) in reported_answers(base).items():
        what = f"a body with {label}"
        outcome = _mapped(definition, candidate, what, problems, f"raise kind {kind!r}")
        if isinstance(outcome, RunResult):
            problems.append(
                f"{what} mapped to reward {outcome.reward!r}: the environment says it could not score it "
                "(build on reference.verified_answer or reference.map_result)"
            )
        elif isinstance(outcome, EnvironmentFailure) and outcome.kind != kind:
            problems.append(f"{what} raised EnvironmentFailure({outcome.kind!r}), not {kind!r}")


def reported_answers(body: Mapping[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    """A scored answer `body` as NeMo Gym says it could not score it, by label: (the kind it must end as,
    the answer). A failed judge (v0.5.0+'s judge_failsafe: HTTP 200, reward 0.0), a sample masked at the top
    level with its kind and reason (0.7.0) and one masked in its instance config (swe_agents), each with a
    reward of 1.0 and 0.0 where the environment could give either."""
    answers: dict[str, tuple[str, dict[str, Any]]] = {}
    for reward in (1.0, 0.0):
        shapes: dict[str, tuple[str, dict[str, Any]]] = {
            "a failed judge": (
                "judge_failed",
                {"_ng_failure_class": "judge_failed", "_ng_failure_judge_error": "JudgeError: HTTP 500"},
            ),
            "mask_sample and failure_kind": (
                "masked:agent_timeout",
                {"mask_sample": True, "failure_kind": "agent_timeout", "failure_reason": "ran out of time"},
            ),
            "instance_config.mask_sample": ("masked", {"instance_config": {"mask_sample": True}}),
            "a failure_kind alone": ("masked:sandbox_lost", {"failure_kind": "sandbox_lost"}),
        }
        for label, (kind, fields) in shapes.items():
            answers[f"{label}, reward {reward}"] = (
                kind,
                {**copy.deepcopy(dict(body)), "reward": reward, **fields},
            )
    return answers


# ---- verifier probes -------------------------------------------------------------------------------------


def check_probes(hooks: Hooks, environment: str, verify: Verify, *, require_contrast: bool = True) -> None:
    """Every verifier probe of the environment gets its expected reward from the real verifier.

    `verify(row, output) -> float` is supplied by the plugin's test and must call the real verifier
    (a running resources server), not a copy of its logic. Probe rows must also convert. With
    `require_contrast`, the probes must expect at least two different rewards, so a verifier that
    always answers the same number cannot pass. A replay probe needs the environment's agent, not only
    its verifier (relax_gym_core.gym.probe replays it), and a skipped one is never scored: neither is
    checked here.
    """
    definition = hooks.environments.get(environment)
    probes = [p for p in definition.verifier_probes() if not p.replay and p.skip is None]
    if not probes:
        raise ConformanceError(f"environment {environment!r} declares no verifier probes (verifier_probes)")
    problems: list[str] = []
    names = [probe.name for probe in probes]
    if len(set(names)) != len(names):
        problems.append(f"probe names repeat: {names!r}")
    if require_contrast and len({probe.expected_reward for probe in probes}) < 2:
        problems.append("all probes expect the same reward: add a known-bad (or known-good) output")
    for probe in probes:
        try:
            converted_row(definition, copy.deepcopy(dict(probe.row)))
        except (RowError, PluginError) as exc:
            problems.append(f"probe {probe.name!r}: its row does not convert: {exc}")
        reward = verify(copy.deepcopy(dict(probe.row)), [copy.deepcopy(dict(item)) for item in probe.output])
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            problems.append(f"probe {probe.name!r}: verify returned {reward!r}, not a finite number")
        elif not math.isclose(reward, probe.expected_reward, rel_tol=0.0, abs_tol=1e-9):
            problems.append(
                f"probe {probe.name!r}: the verifier gave reward {reward!r}, "
                f"expected {probe.expected_reward!r}"
            )
    _fail_if(problems, f"environment {environment!r}: verifier probes failed")


__all__ = [
    "REFERENCE_NORMALISED",
    "ConformanceError",
    "Verify",
    "check_conversion",
    "check_probes",
    "check_registration",
    "check_result_mapping",
]
