"""`relax-gym rollout [ENV[:CONFIG]] --data RELAX.jsonl --policy URL|oracle[:P]`: the main job.

Every row of the data file runs `--repeats` times as a real trial, through a gateway this command starts
(NeMo Gym servers included, as `relax-gym up` does) or the one given with --gateway; the policy (any
OpenAI- or Anthropic-compatible endpoint, or the oracle built from the plugins' verifier probes) plays
Relax's part, so model calls go gateway -> bridge -> policy. Results go to --out DIR as they come
(trials.jsonl, then summary.json); running the same command again resumes. Everything that can be wrong
with the input (environment, data, policy, gateway, port, NeMo Gym, --out) is found before any trial
starts and before DIR is touched.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import httpx
from attrs import frozen

from relax_gym_core.errors import ConfigError, RelaxGymError
from relax_gym_core.plugin.host import Hooks, make_plugin_manager
from relax_gym_core.protocol import InterruptPolicy
from relax_gym_core.protocol.types import split_http_url
from relax_gym_core.rollout.data import DataRow, config_resolver, load_rows, parse_target
from relax_gym_core.rollout.live import LiveView, Progress
from relax_gym_core.rollout.policy import (
    OracleSpec,
    Policy,
    check_policy,
    oracle_policy,
    parse_policy,
    read_key,
)
from relax_gym_core.rollout.run import (
    Engine,
    Planned,
    ReplayAwareClient,
    TrialSettings,
    client_options,
)
from relax_gym_core.rollout.store import (
    RUN_FILE,
    SUMMARY_FILE,
    TRIALS_FILE,
    RunInfo,
    TrialLog,
    check_same_data,
    check_same_run,
    load_trials,
    read_run,
    write_run,
    write_summary,
)
from relax_gym_core.rollout.summary import summarize

if TYPE_CHECKING:
    from relax_gym_core.rollout.gateway import TrialWatch

DEFAULT_DEADLINE_S = 900.0
INTERRUPTED = 130
GATEWAY_LOG = "gateway.log"  # what the gateway this command starts logs while trials run


@frozen(kw_only=True)
class RolloutOptions:
    data: str
    policy: str
    target: str | None = None
    model: str | None = None
    api_key_env: str | None = None
    repeats: int = 1
    concurrency: int = 8
    limit: int | None = None
    out: str | None = None
    gateway: str | None = None
    port: int = 0
    deadline_s: float = DEFAULT_DEADLINE_S
    seed: int = 0
    pass_threshold: float = 1.0
    resume_command: str = "the same command"


def _status(message: str) -> None:
    print(message, file=sys.stderr, flush=True)  # noqa: T201 - progress for the operator, not data


def _check_numbers(options: RolloutOptions) -> None:
    for name, value in (("--repeats", options.repeats), ("--concurrency", options.concurrency)):
        if value < 1:
            raise ConfigError(f"{name} must be at least 1 (got {value})")
    if options.limit is not None and options.limit < 1:
        raise ConfigError(f"--limit must be at least 1 (got {options.limit})")
    if not options.deadline_s > 0:
        raise ConfigError(f"--deadline-s must be positive (got {options.deadline_s})")


READY_WAIT_S = 30.0  # a gateway "not ready" (its servers slow to answer on a loaded host) is waited for


def check_gateway(url: str, *, ready_wait_s: float = READY_WAIT_S) -> str:
    """GET /readyz of a gateway given with --gateway: reachable and ready (a 503 is asked again for up to
    ready_wait_s: a loaded host's servers can miss one readiness probe), else ConfigError."""
    parts = split_http_url(url)
    if parts is None or parts.query or parts.fragment:
        raise ConfigError("--gateway: expected an http(s) URL without a query or fragment")
    url = url.rstrip("/")
    give_up = time.monotonic() + ready_wait_s
    while True:
        try:
            answer = httpx.get(f"{url}/readyz", trust_env=False, timeout=30.0)
        except httpx.HTTPError as exc:
            raise ConfigError(
                f"cannot reach the gateway at {url} ({type(exc).__name__}): is it running?"
            ) from None
        if answer.status_code != 503 or time.monotonic() >= give_up:
            break
        time.sleep(0.5)
    if answer.status_code == 503:
        try:
            reasons = "; ".join(str(reason) for reason in answer.json().get("reasons", []))
        except (ValueError, AttributeError):
            reasons = ""
        raise ConfigError(f"the gateway at {url} is not ready: {reasons or 'HTTP 503'}")
    if answer.status_code != 200:
        raise ConfigError(f"{url} is not a relax-gym gateway: GET /readyz answered HTTP {answer.status_code}")
    return url


def _route_settings(
    hooks: Hooks, deadline_s: float
) -> tuple[Callable[[str], float], Callable[[str], InterruptPolicy]]:
    """Per environment: the deadline within the environment's maximum, and its registered interrupt policy
    (environments this machine does not know, on a remote gateway, get the client's defaults)."""
    known = {definition.name: definition for definition in hooks.environments}

    def deadline(environment: str) -> float:
        definition = known.get(environment)
        return min(deadline_s, definition.max_deadline_s) if definition is not None else deadline_s

    def interrupt(environment: str) -> InterruptPolicy:
        definition = known.get(environment)
        return definition.interrupt_policy if definition is not None else InterruptPolicy.PROTECTED

    return deadline, interrupt


@frozen
class _Prepared:
    rows: list[DataRow]
    out: Path
    held: RunInfo | None
    finished: dict[tuple[int, int], dict[str, Any]]
    torn: int
    out_existed: bool


def _prepare(options: RolloutOptions, hooks: Hooks) -> _Prepared:
    """Everything checked from the files alone: route, data, and whether --out can hold this run."""
    config_of = config_resolver(hooks, remote=options.gateway is not None)
    target = parse_target(options.target, config_of) if options.target else None
    data = Path(options.data)
    rows = load_rows(data, target, config_of, limit=options.limit)
    out = Path(options.out) if options.out else Path("rollouts") / data.stem
    held = read_run(out)
    finished, torn = load_trials(out, repair=False) if held is not None else ({}, 0)
    check_same_data(out, finished.values(), {row.line: row.digest for row in rows}, data)
    return _Prepared(rows, out, held, finished, torn, out.exists())


def _policy(
    options: RolloutOptions, hooks: Hooks, rows: list[DataRow], stack: contextlib.ExitStack
) -> Policy:
    spec = parse_policy(options.policy)
    if isinstance(spec, OracleSpec):
        environments = {row.route.environment for row in rows}
        tasks = {row.line: row.task for row in rows}
        return stack.enter_context(oracle_policy(hooks, environments, spec, options.seed, tasks))
    key = read_key(options.api_key_env)
    return check_policy(spec, model=options.model, key=key, key_variable=options.api_key_env)


async def _drive(
    engine: Engine, plan: list[Planned], concurrency: int, view: LiveView, log: TrialLog
) -> bool:
    """Run the plan with the live view; SIGINT/SIGTERM stop it (a second one stops without waiting for
    cleanup verdicts). True if it was forced."""
    forced = False
    async with anyio.create_task_group() as tg:

        async def signals() -> None:
            nonlocal forced
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as received:
                async for _ in received:
                    if engine.stop.is_set():
                        forced = True
                        tg.cancel_scope.cancel()
                        return
                    _status(
                        "stopping: aborting the running trials and waiting for their cleanup "
                        "(again to quit now)"
                    )
                    engine.stop.set()

        tg.start_soon(signals)
        tg.start_soon(view.run)
        await engine.run(plan, concurrency)
        await anyio.to_thread.run_sync(log.drain)  # the view's last line counts every trial on disk
        tg.cancel_scope.cancel()
    return forced


def _environment_line(name: str, stats: dict[str, Any]) -> str:
    mean = "-" if stats["mean_reward"] is None else f"{stats['mean_reward']:.3f}"
    shown = list(stats["pass_at_k"].items())
    shown = shown[:1] + shown[-1:] if len(shown) > 1 else shown  # pass@1 and pass@K; the rest is in the file
    passes = " ".join(f"pass@{k} {value:.3f}" for k, value in shown)
    latency = stats["latency_s"]
    p50 = f"; latency p50 {latency['p50']:.2f} s p90 {latency['p90']:.2f} s" if latency else ""
    return (
        f"  {name}: {stats['trials']} trials, mean reward {mean} over {stats['scored']} scored"
        f"{'; ' + passes if passes else ''}; {stats['infra_failures']} infrastructure failures{p50}"
    )


def rollout(options: RolloutOptions) -> int:
    """What `relax-gym rollout` does; returns the exit code (RelaxGymError for bad input or a failed run)."""
    _check_numbers(options)
    hooks = make_plugin_manager()
    prepared = _prepare(options, hooks)
    rows, out = prepared.rows, prepared.out
    environments = {row.route.environment for row in rows}
    gateway_url = check_gateway(options.gateway) if options.gateway else None
    with contextlib.ExitStack() as stack:
        policy = _policy(options, hooks, rows, stack)
        if prepared.held is not None:
            check_same_run(out, prepared.held, policy=policy.label, model=policy.model)
        watch: TrialWatch | None = None
        if gateway_url is None:
            # The web stack is imported only when this command serves the gateway itself.
            try:
                from relax_gym_core.rollout.gateway import TrialWatch, own_gateway  # noqa: PLC0415
            except ImportError as exc:
                raise ConfigError(
                    f"serving a gateway needs the gateway extra (pip install 'relax-gym-core[gateway]'), "
                    f"or give one with --gateway URL ({exc})"
                ) from None

            watch = TrialWatch()
            gateway_url = stack.enter_context(
                own_gateway(
                    hooks,
                    environments,
                    policy_url=policy.base_url,
                    concurrency=options.concurrency,
                    watch=watch,
                    port=options.port,
                )
            )
        assert gateway_url is not None
        # Every check passed: only now is --out created or changed.
        info = prepared.held or RunInfo.new(policy=policy.label, model=policy.model, data=options.data)
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create --out {out}: {exc.strerror}") from None
        if prepared.held is None:
            write_run(out, info)
        if watch is not None:
            from relax_gym_core.rollout.gateway import gateway_log  # noqa: PLC0415

            stack.enter_context(gateway_log(out / GATEWAY_LOG))
        if prepared.held is not None and prepared.torn:
            load_trials(out, repair=True)
            _status(
                f"cut a torn last line ({prepared.torn} bytes) from {out}/trials.jsonl: its trial is "
                "taken again from the gateway, or run again"
            )
        return _run(
            options, hooks=hooks, info=info, prepared=prepared, policy=policy, url=gateway_url, watch=watch
        )


def _run(
    options: RolloutOptions,
    *,
    hooks: Hooks,
    info: RunInfo,
    prepared: _Prepared,
    policy: Policy,
    url: str,
    watch: TrialWatch | None,
) -> int:
    rows, out, finished = prepared.rows, prepared.out, prepared.finished
    keys = [(row.line, repeat) for row in rows for repeat in range(1, options.repeats + 1)]
    plan = [
        Planned(row, repeat)
        for row in rows
        for repeat in range(1, options.repeats + 1)
        if (row.line, repeat) not in finished
    ]
    done_before = sum(1 for key in keys if key in finished)
    verb = "resuming" if info is prepared.held else "starting"
    _status(
        f"{verb} rollout {info.run_id} in {out}: {len(rows)} rows x {options.repeats} repeats, "
        f"{done_before} finished, {len(plan)} to run; policy {policy.label} (model {policy.model}); "
        f"gateway {url}"
    )
    records = dict(finished)
    progress = Progress(
        planned=len(keys), finished={k: finished[k] for k in keys if k in finished}, queued=len(plan)
    )

    def durable(record: dict[str, Any]) -> None:
        records[(record["row"], record["repeat"])] = record
        progress.durable(record)

    deadline, interrupt = _route_settings(hooks, options.deadline_s)
    settings = TrialSettings(
        run_id=info.run_id,
        policy=policy,
        oracle=_oracle_of(options),
        deadline_s=deadline,
        interrupt_policy=interrupt,
    )
    log = TrialLog(out, durable)
    engine: Engine | None = None
    forced = False
    try:

        async def main() -> bool:
            nonlocal engine
            async with ReplayAwareClient(url, options=client_options(options.concurrency)) as client:
                engine = Engine(
                    client, settings, progress, log.append, take_watch=watch.take if watch else None
                )
                return await _drive(engine, plan, options.concurrency, LiveView(progress), log)

        forced = anyio.run(main)
    finally:
        log.close()
        summary = summarize(
            records.values(),
            run={"run_id": info.run_id, "data": options.data, "policy": info.policy, "model": info.model},
            repeats=options.repeats,
            pass_threshold=options.pass_threshold,
            planned=len(keys),
            complete=all(key in records for key in keys),
        )
        summary_path = write_summary(out, summary)
    assert engine is not None
    return _finish(options, prepared, engine, summary, summary_path, forced=forced)


def _oracle_of(options: RolloutOptions) -> tuple[int, float] | None:
    spec = parse_policy(options.policy)
    return (options.seed, spec.bad_rate) if isinstance(spec, OracleSpec) else None


def _discard(out: Path, *, remove_directory: bool) -> None:
    for name in (RUN_FILE, TRIALS_FILE, SUMMARY_FILE, GATEWAY_LOG):
        (out / name).unlink(missing_ok=True)
    if remove_directory:
        with contextlib.suppress(OSError):
            out.rmdir()


def _finish(
    options: RolloutOptions,
    prepared: _Prepared,
    engine: Engine,
    summary: dict[str, Any],
    path: Path,
    *,
    forced: bool,
) -> int:
    out = path.parent
    kept = f"{summary['finished']} of {summary['planned']} trials finished, kept in {out}/trials.jsonl"
    resume = f"resume with: {options.resume_command}"
    if engine.fatal is not None and not summary["finished"] and prepared.held is None:
        _discard(out, remove_directory=not prepared.out_existed)  # a new run that never ran a trial
        raise RelaxGymError(f"{engine.fatal} (nothing was run; {out} is left as it was)")
    if engine.fatal is not None:
        status = getattr(engine.fatal, "status_code", 0)
        hint = " (the gateway did not keep up: a lower --concurrency may help)" if status is None else ""
        raise RelaxGymError(f"{engine.fatal}; the run stopped{hint} ({kept}); {resume}")
    print(f"rollout {summary['run']['run_id']}: {kept}")  # noqa: T201 - the command's result
    for name, stats in summary["environments"].items():
        print(_environment_line(name, stats))  # noqa: T201
    print(f"summary: {path}; report: relax-gym report {out}")  # noqa: T201
    if engine.stop.is_set() or forced:
        aborted = [verdict for verdict in engine.interrupted if verdict != "not_created"]
        confirmed = sum(1 for verdict in aborted if verdict == "confirmed")
        how = (
            "stopped without waiting for cleanup verdicts"
            if forced
            else f"cleanup confirmed for {confirmed} of {len(aborted)}"
        )
        _status(f"interrupted: {len(aborted)} running trials aborted ({how}); {kept}")
        _status(resume)
        return INTERRUPTED
    return 0
