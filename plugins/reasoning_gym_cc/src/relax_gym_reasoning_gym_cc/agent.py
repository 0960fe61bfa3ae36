"""NeMo Gym's claude_code_agent, one confined Claude Code CLI per trial (runs in the NeMo Gym environment).

A subclass of the installed ``responses_api_agents.claude_code_agent.app.ClaudeCodeAgent`` (seed session,
instruction, stream-json parsing, /verify and the settings layering stay upstream's). What changes:

- the CLI is the project-local Claude Code 2.1.237 (claude.py), never installed at start or trial time;
- each trial gets its own directories (trials.py: config, workspace = cwd and HOME, tmp), a fresh
  process group, and the rollout marker in its environment; the CLI's environment is built from nothing
  (no proxy, no host secret); its model calls go to this trial's bridge,
  ``<gateway>/ng-rollout/<_ng_task_index>-<_ng_rollout_index>`` (the CLI appends /v1/messages; the rollout
  id rides in the path because the CLI cannot tag a body), as NeMo Gym >= 0.5's claude_code_agent sets
  ANTHROPIC_BASE_URL with observability on (here whatever the NeMo Gym version and its observability);
- the methods it overrides take what every NeMo Gym passes them and answer in the shape it expects:
  ``_run_claude_code`` gets a ``rollout_id`` from the commit Relax pins on (accepted and checked against the
  run's own), and from v0.5.0 an ``observation_collector`` (called on the CLI's config directory before it
  is removed) and must answer the parsed output with the run's metadata instead of the raw stdout
  (PARSED_ANSWER, read from the installed class's signature);
- Bash runs in a bubblewrap sandbox (sandbox.py); without one the agent refuses to start, unless
  RELAX_GYM_CC_UNSANDBOXED=1, and then GET / says "unsandboxed";
- the process group is killed on the agent's timeout, on abort and when the run ends, the directories
  are removed, both checked; ``POST /cleanup/{rollout_id}`` does that for a rollout (and refuses to start
  it afterwards), ``GET /cleanup/{rollout_id}`` answers ``{"rollout_id", "clean"}`` from /proc and the
  trials directory, ``GET /relax_gym/trials`` lists what is live.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import json
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import uuid4

from fastapi import FastAPI, HTTPException, Request
from nemo_gym.skills import stage_skills
from pydantic import PrivateAttr
from relax_gym_core.ingym import BRIDGE_PREFIX, CLEANUP_PATH, CleanedRollouts, rollout_id_of, tag_of
from relax_gym_core.ingym.sandbox import SEARCH_PATH
from responses_api_agents.claude_code_agent.app import (
    ClaudeCodeAgent,
    ClaudeCodeAgentConfig,
    ClaudeCodeAgentRunRequest,
    ClaudeCodeAgentVerifyResponse,
    parse_stream_json,
)

from relax_gym_reasoning_gym_cc import claude, trials
from relax_gym_reasoning_gym_cc.sandbox import (
    UNSANDBOXED_ENV,
    Sandbox,
    SandboxError,
    TrialPaths,
    sandbox_or_refusal,
)

LOG = logging.getLogger("relax_gym.reasoning_gym_cc")

TRIALS_PATH = "/relax_gym/trials"
_CLEANED_KEPT = 65536  # rollout ids remembered as cleaned (a later /run for one is refused)
# NeMo Gym >= 0.5.0's claude_code_agent parses the CLI's output inside _run_claude_code and answers
# (output items, model, run metadata), its observations collected from the CLI's config directory; before,
# it answered (stdout, model) and its caller parsed.
PARSED_ANSWER = "observation_collector" in inspect.signature(ClaudeCodeAgent._run_claude_code).parameters

type Collector = Callable[[Path, dict[str, Any]], None]


@dataclass
class _CliRun:
    """What one CLI run left: its stream-json stdout, exit code (None: it never ran or was killed on the
    timeout), whether it timed out, and how long it took."""

    stdout: str = ""
    returncode: int | None = None
    timed_out: bool = False
    seconds: float = 0.0

    @functools.cached_property
    def run_metadata(self) -> tuple[list[Any], dict[str, Any]]:
        """NeMo Gym >= 0.5's view of it, read once the run is over (the observation collector and the answer
        share it, as upstream's do): the parsed output, and the run's metadata with its status (completed,
        incomplete, failed) and error type, as upstream's claude_code_agent reports them."""
        items, metadata = parse_stream_json(self.stdout)
        metadata.setdefault("duration_ms", self.seconds * 1000)
        subtype = metadata.get("subtype")
        status, error = "incomplete", "result_missing"
        if self.timed_out:
            status, error, items = "incomplete", "timeout", []
        elif subtype == "error_max_turns":
            status, error = "incomplete", subtype
        elif metadata.get("is_error") is True or (isinstance(subtype, str) and subtype.startswith("error_")):
            status, error = "failed", subtype if isinstance(subtype, str) else "agent_error"
        elif self.returncode not in (0, None):
            status, error = "failed", f"process_exit_{self.returncode}"
        elif subtype == "success":
            status, error = "completed", ""
        metadata["status"] = status
        if error:
            metadata["error_type"] = error
        return items, metadata


@dataclass
class _Run:
    """What run() knows about the trial, for the CLI start below it (a context variable carries it):
    its rollout id, and whether the gateway issued it (then the CLI's model calls go to its bridge)."""

    rollout_id: str
    bridged: bool


@dataclass
class _Live:
    """The CLI processes (their group leaders, not yet reaped or just reaped) of one rollout."""

    processes: set[asyncio.subprocess.Process] = field(default_factory=set)

    def pgids(self) -> frozenset[int]:
        return frozenset(process.pid for process in self.processes)


_RUN: contextvars.ContextVar[_Run | None] = contextvars.ContextVar("relax_gym_cc_run", default=None)


def run_identity(body: ClaudeCodeAgentRunRequest) -> _Run:
    """The rollout id, joined from _ng_task_index/_ng_rollout_index as NeMo Gym joins them (else the
    gateway's tag, else a fresh one for a plain NeMo Gym rollout). A run the gateway tagged is a trial:
    its model calls go to the trial's bridge; any other goes to the model server unprefixed."""
    params = body.responses_create_params
    rollout_id = rollout_id_of(body.model_extra, params)
    if rollout_id is None:
        return _Run(f"local-{uuid4().hex}", bridged=False)
    return _Run(rollout_id, bridged=tag_of(params) is not None)


class SandboxedClaudeCodeAgentConfig(ClaudeCodeAgentConfig):  # type: ignore[misc]
    # Where trials' directories live; default <tmp>/relax-gym-reasoning-gym-cc. Rollout ids name them, so
    # one directory may serve several agents of one gateway.
    trials_dir: str | None = None


class SandboxedClaudeCodeAgent(ClaudeCodeAgent):  # type: ignore[misc]
    config: SandboxedClaudeCodeAgentConfig
    _claude: claude.ClaudeCode = PrivateAttr()
    _sandbox: Sandbox | None = PrivateAttr(default=None)
    _sandbox_report: str = PrivateAttr(default="")
    _trials_root: Path = PrivateAttr()
    _live: dict[str, _Live] = PrivateAttr(default_factory=dict)
    _cleaned: CleanedRollouts = PrivateAttr(default_factory=lambda: CleanedRollouts(_CLEANED_KEPT))

    def model_post_init(self, __context: Any) -> None:
        # Not super(): upstream's would install Claude Code (npm -g, or a Node download) when it is missing.
        self.sem = asyncio.Semaphore(self.config.concurrency)
        root = self.config.trials_dir or str(Path(tempfile.gettempdir()) / "relax-gym-reasoning-gym-cc")
        self._trials_root = Path(root).absolute()
        try:
            self._claude = claude.require()
            self._trials_root.mkdir(mode=0o700, parents=True, exist_ok=True)
            scratch = Path(tempfile.mkdtemp(prefix="sandbox-check.", dir=self._trials_root))
            self._sandbox, self._sandbox_report = sandbox_or_refusal(scratch)
        except (claude.ClaudeCodeMissing, SandboxError, OSError) as exc:
            # The reason, not a stack trace: the operator's to fix (relax-gym up shows this log's tail).
            print(f"reasoning_gym agent refuses to start: {exc}", file=sys.stderr, flush=True)  # noqa: T201
            raise SystemExit(1) from None
        if self._sandbox is None:
            LOG.warning("reasoning_gym agent is UNSANDBOXED (%s=1): Bash runs on the host", UNSANDBOXED_ENV)
        LOG.warning("reasoning_gym agent: %s; sandbox: %s", self._claude.describe(), self._sandbox_report)

    # ---- routes -----------------------------------------------------------------------------------------

    def setup_liveness(self, app: FastAPI) -> None:
        @app.get("/", include_in_schema=False)  # type: ignore[untyped-decorator]
        async def _liveness() -> dict[str, str]:
            return {"status": "ok", "sandbox": self._sandbox_report, "claude_code": self._claude.describe()}

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post(CLEANUP_PATH)(self.cleanup)
        app.get(CLEANUP_PATH)(self.cleanup_probe)
        app.get(TRIALS_PATH)(self.live_trials)
        return app

    async def cleanup(self, rollout_id: str) -> dict[str, Any]:
        """Abort and force cleanup: never start the rollout again, kill its processes, remove its dirs."""
        self._cleaned.add(rollout_id)
        live = self._live.get(rollout_id)
        if live is not None:
            for process in live.processes:
                if process.returncode is None:  # not reaped: its pid (the group id) cannot be reused
                    trials.kill_group(process.pid)
        reaped = await trials.reap(rollout_id, live.pgids() if live is not None else frozenset())
        removed = trials.remove_directories(self._trials_root, rollout_id)
        return {"rollout_id": rollout_id, "accepted": True, "clean": reaped and removed}

    async def cleanup_probe(self, rollout_id: str) -> dict[str, Any]:
        """Clean means checked now: no live process of the rollout and none of its directories."""
        live = self._live.get(rollout_id)
        pgids = live.pgids() if live is not None else frozenset()
        clean = not trials.processes_of(rollout_id, pgids) and not trials.directories_of(
            self._trials_root, rollout_id
        )
        return {"rollout_id": rollout_id, "clean": clean}

    async def live_trials(self) -> dict[str, Any]:
        """What is live now: rollouts with a CLI, and every trial directory (for operators and tests)."""
        return {
            "sandbox": self._sandbox_report,
            "claude_code": self._claude.describe(),
            "trials_dir": str(self._trials_root),
            "live": sorted(self._live),
            "directories": sorted(path.name for path in self._trials_root.iterdir()),
        }

    # ---- one trial --------------------------------------------------------------------------------------

    async def run(self, request: Request, body: ClaudeCodeAgentRunRequest) -> ClaudeCodeAgentVerifyResponse:
        identity = run_identity(body)
        if identity.rollout_id in self._cleaned:
            raise HTTPException(409, f"rollout {identity.rollout_id!r} was already cleaned up")
        token = _RUN.set(identity)
        try:
            return await super().run(request, body)
        finally:
            _RUN.reset(token)

    def _build_settings(self) -> dict[str, Any]:
        settings = super()._build_settings()  # telemetry off, the configured settings file on top
        ours = claude.SETTINGS
        return {**settings, **ours, "env": {**settings.get("env", {}), **ours["env"]}}

    def _bridge_url(self, run: _Run | None) -> str:
        """This trial's bridge: the policy model server (our gateway) + the rollout prefix."""
        base = str(self._resolve_base_url() or "").rstrip("/")
        if run is None or not run.bridged or not base:
            return base
        return f"{base}{BRIDGE_PREFIX}{run.rollout_id}"

    def _environment(
        self, dirs: trials.TrialDirs, rollout_id: str, base_url: str, model: str
    ) -> dict[str, str]:
        environment = {
            "PATH": SEARCH_PATH,
            "LANG": "C.UTF-8",
            "HOME": str(dirs.workspace),
            "TMPDIR": str(dirs.tmp),
            "TMP": str(dirs.tmp),
            "TEMP": str(dirs.tmp),
            "CLAUDE_CODE_TMPDIR": str(dirs.tmp),
            "CLAUDE_CONFIG_DIR": str(dirs.config),
            "IS_SANDBOX": "1",  # lets the CLI accept --dangerously-skip-permissions (as upstream sets it)
            "DISABLE_COMPACT": "1",
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "ANTHROPIC_MODEL": model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
            "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
            "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
            "CLAUDE_CODE_SUBAGENT_MODEL": model,
            "ANTHROPIC_BASE_URL": base_url,
            # The bridge authenticates upstream with the trial's own token; the CLI never holds it.
            "ANTHROPIC_AUTH_TOKEN": self.config.anthropic_api_key or "relax-gym",
            "ANTHROPIC_API_KEY": "",
            trials.MARKER: rollout_id,
        }
        if self._sandbox is not None:
            paths = TrialPaths(workspace=dirs.workspace, tmp=dirs.tmp, snapshots=dirs.snapshots)
            shell = self._sandbox.write_shell(dirs.sandbox, paths, (trials.MARKER, rollout_id))
            environment["CLAUDE_CODE_SHELL"] = str(shell)
            environment["SHELL"] = str(shell)
        return environment

    async def _run_claude_code(  # noqa: PLR0917 - upstream's signature
        self,
        instruction: str,
        system_prompt: str | None = None,
        mcp_config: str | None = None,
        skills_path: str | None = None,
        rollout_id: str | None = None,
        observation_collector: Collector | None = None,
    ) -> tuple[str, str] | tuple[list[Any], str, dict[str, Any]]:
        """Run the CLI for this trial; nothing of it outlives the call: its group is killed and its
        directories removed, both checked. Answers in the installed NeMo Gym's shape (PARSED_ANSWER):
        (stream-json stdout, model), or from v0.5.0 (output items, model, run metadata).

        `rollout_id` is what NeMo Gym passes from the commit Relax pins on (its capture id; None with
        observability off, never passed by 0.4.0): when given it is the id run() joined from the same body
        fields. `observation_collector` (v0.5.0+) reads the CLI's config directory before it is removed."""
        model = self.config.model
        cli = await self._run_cli(
            instruction,
            system_prompt=system_prompt,
            mcp_config=mcp_config,
            skills_path=skills_path,
            rollout_id=rollout_id,
            observation_collector=observation_collector,
        )
        if not PARSED_ANSWER:
            return cli.stdout, model
        items, metadata = cli.run_metadata
        return items, model, metadata

    async def _run_cli(
        self,
        instruction: str,
        *,
        system_prompt: str | None,
        mcp_config: str | None,
        skills_path: str | None,
        rollout_id: str | None,
        observation_collector: Collector | None,
    ) -> _CliRun:
        run = _RUN.get()
        if rollout_id is not None and run is not None and rollout_id != run.rollout_id:
            LOG.warning(
                "NeMo Gym names rollout %s, the run body %s: using the body's", rollout_id, run.rollout_id
            )
        rollout_id = run.rollout_id if run is not None else f"local-{uuid4().hex}"
        model = self.config.model
        outcome = _CliRun()
        if rollout_id in self._cleaned:
            return outcome
        live = self._live.setdefault(rollout_id, _Live())
        process: asyncio.subprocess.Process | None = None
        dirs = trials.TrialDirs.create(self._trials_root, rollout_id)
        started = time.monotonic()
        try:
            (dirs.config / "settings.json").write_text(json.dumps(self._build_settings()))
            if skills_path:
                stage_skills(skills_path, dirs.config / "skills")
            base_url = self._bridge_url(run)
            if not base_url:  # the CLI would go to api.anthropic.com: loopback only, never
                LOG.error(
                    "no model server for rollout %s: set model_server (or anthropic_base_url)", rollout_id
                )
                return outcome
            command = self._build_command(
                model,
                instruction,
                system_prompt=system_prompt,
                mcp_config=mcp_config,
                skills_active=bool(skills_path),
            )
            command[0] = str(self._claude.path)
            process = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=dirs.workspace,
                env=self._environment(dirs, rollout_id, base_url, model),
                start_new_session=True,  # its own process group, killed as one
            )
            live.processes.add(process)
            if rollout_id in self._cleaned:  # cleaned up while it was starting
                trials.kill_group(process.pid)
            try:
                stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=self.config.timeout)
            except TimeoutError:
                LOG.warning("claude-code timed out after %ds (rollout %s)", self.config.timeout, rollout_id)
                outcome.timed_out = True
                return outcome
            outcome.stdout, outcome.returncode = stdout.decode(errors="replace"), process.returncode
            if process.returncode not in (0, None) and rollout_id not in self._cleaned:
                LOG.warning(
                    "claude-code exited %d (rollout %s): %s",
                    process.returncode,
                    rollout_id,
                    stderr.decode(errors="replace")[-500:] or outcome.stdout[-500:],
                )
            return outcome
        finally:
            outcome.seconds = time.monotonic() - started
            if observation_collector is not None:
                await self._collect(observation_collector, dirs.config, outcome)
            await self._end(rollout_id, live, process, dirs)

    @staticmethod
    async def _collect(collector: Collector, config_dir: Path, outcome: _CliRun) -> None:
        """NeMo Gym's observations of the run, read from the CLI's config directory while it still exists
        (shielded like the cleanup after it); a collector that fails costs the observations, not the run."""
        _items, metadata = outcome.run_metadata
        try:
            await asyncio.shield(asyncio.to_thread(collector, config_dir, metadata))
        except Exception:
            LOG.exception("failed to collect Claude Code observations")

    async def _end(
        self,
        rollout_id: str,
        live: _Live,
        process: asyncio.subprocess.Process | None,
        dirs: trials.TrialDirs,
    ) -> None:
        """Kill the trial's group (timeout, abort, cancellation, or leftovers of a finished CLI), wait
        until none of its processes is left, remove its directories; shielded so a cancelled run still
        cleans up."""

        async def end() -> None:
            if process is not None and process.returncode is None:
                trials.kill_group(process.pid)
                await process.wait()
            if not await trials.reap(rollout_id, live.pgids()):
                LOG.error("processes of rollout %s survived SIGKILL", rollout_id)
            shutil.rmtree(dirs.root, ignore_errors=True)
            if dirs.root.exists():
                LOG.error("directory of rollout %s could not be removed", rollout_id)
            if process is not None:
                live.processes.discard(process)
            if not live.processes and self._live.get(rollout_id) is live:
                del self._live[rollout_id]

        await asyncio.shield(asyncio.ensure_future(end()))


if __name__ == "__main__":
    SandboxedClaudeCodeAgent.run_webserver()
