"""The r2e_gym resources server (runs INSIDE the NeMo Gym environment): a NeMo Gym resources server whose
tools act on a per-rollout checkout inside a bubblewrap sandbox, and whose /verify runs the hidden tests.

Built on the INSTALLED ``nemo_gym.base_resources_server.SimpleResourcesServer`` (session cookies,
/seed_session, /verify) and driven by NeMo Gym's unchanged ``simple_agent``, which calls a tool by POSTing
its arguments to ``/<tool name>`` with the session's cookies:

- ``POST /seed_session``: the /run row names a bundled task (``repo_name``, ``instance_id``,
  ``base_commit``, all checked); the rollout gets its own uid and a clone of the task's repository at the
  base commit. The rollout id is ``f"{_ng_task_index}-{_ng_rollout_index}"`` (else the trial tag in
  ``responses_create_params.metadata.relax_gym_rollout``). A seed for a rollout that was already cleaned
  up is refused (409): an abort that overtakes the seed cannot leak a sandbox.
- ``POST /bash`` ``{command, timeout?}``, ``POST /view`` ``{path, start_line?, end_line?}``,
  ``POST /str_replace`` ``{path, old_str, new_str}``: one sandbox per call, in the rollout's checkout.
- ``POST /verify``: the checkout's diff against the base commit (untracked files included), then the
  workspace is destroyed; the patch is applied to a fresh checkout in a fresh sandbox and the hidden tests
  run with a timeout. reward 1.0 when resolved, 0.1 when a patch exists but does not resolve, else 0.0,
  with ``resolved``, ``patch_exists``, test counts and timings beside it. A verify without a workspace
  (``relax-gym probe``, re-scoring a stored trajectory) replays the trajectory's tool calls in a fresh
  workspace first; one that names a rollout whose workspace is gone is refused (409).
- ``POST /cleanup/{rollout_id}`` (abort and force) kills the rollout's sandbox (and its evaluation, if one
  runs), removes its directories and remembers the id; ``GET /cleanup/{rollout_id}`` ->
  ``{"clean": ...}``, checked on the machine: no process of its uids, no directory left.
- ``GET /relax_gym/sandboxes``: live rollouts, running commands and evaluations, directories and sandbox
  processes, the state directory and the uid block.

Imports: the standard library, NeMo Gym / FastAPI / pydantic, relax_gym_core.ingym (the wire names and
the cleanup protocol, standard library only: never the rest of relax_gym_core, which needs what the NeMo
Gym environment lacks) and this plugin's stdlib-only modules. State changes happen on the server's event
loop.
"""

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import PlainTextResponse
from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.server_utils import SESSION_ID_KEY
from pydantic import BaseModel, ConfigDict, PrivateAttr
from relax_gym_core.ingym import CLEANUP_PATH, CleanedRollouts, rollout_id_of

from relax_gym_r2e import tasks
from relax_gym_r2e.sandbox import Limits, SandboxError, processes_of
from relax_gym_r2e.workspace import (
    Evaluation,
    Host,
    Prepared,
    Settings,
    Workspace,
    WorkspaceClosed,
    evaluate,
)

SANDBOXES_PATH = "/relax_gym/sandboxes"
SHAPING_REWARD = 0.1  # a patch that exists but does not resolve (Relax's R2E shaping)
TOOLS = ("bash", "view", "str_replace")


class R2EResourcesServerConfig(BaseResourcesServerConfig):  # type: ignore[misc]
    state_dir: str = ""  # empty: a fresh temporary directory, removed when the server stops
    # Sandbox uids: [uid_base, uid_base + uid_count), never used by anything else on the machine; each
    # server claims a block of 256 of them (a live rollout and an evaluation take one each).
    uid_base: int = 2_100_000
    uid_count: int = 65_536
    command_timeout_s: float = 30.0
    max_command_timeout_s: float = 300.0
    tests_timeout_s: float = 120.0
    setup_timeout_s: float = 60.0
    max_output_bytes: int = 16_000
    max_patch_bytes: int = 1 << 20
    sandbox_python: str = "/usr/bin/python3"
    max_processes: int = 64
    max_memory_mb: int = 1024
    max_file_mb: int = 64
    max_open_files: int = 512
    max_cpu_s: int = 600
    tmp_mb: int = 64
    remembered_cleanups: int = 100_000


class RolloutSeedSessionRequest(BaseSeedSessionRequest):  # type: ignore[misc]
    model_config = ConfigDict(extra="allow")  # the whole /run row arrives here


class BashRequest(BaseModel):
    command: str
    timeout: float | None = None


class ViewRequest(BaseModel):
    path: str
    start_line: int | None = None
    end_line: int | None = None


class StrReplaceRequest(BaseModel):
    path: str
    old_str: str
    new_str: str = ""


class R2EVerifyRequest(BaseVerifyRequest):  # type: ignore[misc]
    model_config = ConfigDict(extra="allow")  # the row's fields and _ng_task_index / _ng_rollout_index


class R2EVerifyResponse(BaseVerifyResponse):  # type: ignore[misc]
    model_config = ConfigDict(extra="allow")
    instance_id: str
    resolved: bool
    patch_exists: bool
    patch_applied: bool
    patch_bytes: int
    eval_timed_out: bool
    tests_total: int
    tests_passed: int
    fail_to_pass_passed: int
    fail_to_pass_total: int
    pass_to_pass_passed: int
    pass_to_pass_total: int
    test_results: dict[str, str]
    commands: int
    command_timeouts: int
    replayed: bool
    tests_seconds: float
    verify_seconds: float
    agent_seconds: float | None


class Rollout:
    def __init__(self, key: str, rollout_id: str | None, session_id: str, workspace: Workspace) -> None:
        self.key = key
        self.rollout_id = rollout_id
        self.session_id = session_id
        self.workspace = workspace


class R2EResourcesServer(SimpleResourcesServer):  # type: ignore[misc]
    config: R2EResourcesServerConfig

    _host: Host | None = PrivateAttr(default=None)
    _rollouts: dict[str, Rollout] = PrivateAttr(default_factory=dict)  # by key (rollout id, else session)
    _sessions: dict[str, str] = PrivateAttr(default_factory=dict)  # session id -> key
    _cleaned: CleanedRollouts = PrivateAttr(default_factory=CleanedRollouts)  # sized by the config
    # What a finished rollout left that could not be proven gone: key -> [(uid, directory)].
    _residue: dict[str, list[tuple[int, Path]]] = PrivateAttr(default_factory=dict)
    # Evaluations in flight by rollout key: a cleanup of the rollout ends them (and waits for that).
    _verifying: dict[str, "asyncio.Task[Evaluation]"] = PrivateAttr(default_factory=dict)

    # ---- set-up --------------------------------------------------------------------------------------------

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        config = self.config
        settings = Settings(
            command_timeout_s=config.command_timeout_s,
            max_command_timeout_s=config.max_command_timeout_s,
            tests_timeout_s=config.tests_timeout_s,
            setup_timeout_s=config.setup_timeout_s,
            max_output_bytes=config.max_output_bytes,
            max_patch_bytes=config.max_patch_bytes,
            python=config.sandbox_python,
            limits=Limits(
                processes=config.max_processes,
                memory_bytes=config.max_memory_mb << 20,
                file_bytes=config.max_file_mb << 20,
                open_files=config.max_open_files,
                cpu_seconds=config.max_cpu_s,
                tmp_bytes=config.tmp_mb << 20,
            ),
        )
        self._host = Host.create(
            state_dir=config.state_dir or None,
            uid_base=config.uid_base,
            uid_count=config.uid_count,
            settings=settings,
        )
        self._cleaned = CleanedRollouts(config.remembered_cleanups)
        for name in tasks.load_tasks():  # ready before the server answers GET /
            self._host.prepare(name)
        app.post("/bash")(self.bash)
        app.post("/view")(self.view)
        app.post("/str_replace")(self.str_replace)
        app.post(CLEANUP_PATH)(self.cleanup)
        app.get(CLEANUP_PATH)(self.cleanup_status)
        app.get(SANDBOXES_PATH)(self.sandboxes)
        upstream_lifespan = app.router.lifespan_context

        @asynccontextmanager
        async def lifespan(app: FastAPI) -> AsyncIterator[Any]:
            async with upstream_lifespan(app) as state:
                try:
                    yield state
                finally:
                    await self._shutdown()

        app.router.lifespan_context = lifespan
        return app

    @property
    def host(self) -> Host:
        if self._host is None:
            raise RuntimeError("setup_webserver() was not called")
        return self._host

    async def _shutdown(self) -> None:
        """The server stops: no sandbox and no directory of ours may outlive it."""
        for rollout in list(self._rollouts.values()):
            await self._finish(rollout)
        await self.host.close()

    # ---- bookkeeping ---------------------------------------------------------------------------------------

    async def _finish(self, rollout: Rollout) -> bool:
        """Forget the rollout and destroy its workspace; what cannot be proven gone is kept as residue."""
        if self._rollouts.get(rollout.key) is rollout:
            del self._rollouts[rollout.key]
        if self._sessions.get(rollout.session_id) == rollout.key:
            del self._sessions[rollout.session_id]
        proven = await rollout.workspace.destroy()
        if not proven:
            self._residue.setdefault(rollout.key, []).append(
                (rollout.workspace.uid, rollout.workspace.directory)
            )
        return proven

    async def _is_clean(self, key: str) -> bool:
        """Checked on the machine: nothing live, no directory, no process of any uid it kept."""
        if key in self._rollouts or key in self._verifying:
            return False
        if self.host.rollout_dir(key).exists():
            return False
        left = []
        for uid, directory in self._residue.pop(key, []):
            if not await self.host.release(uid, directory):
                left.append((uid, directory))
        if left:
            self._residue[key] = left
        return not left

    def _task_for(self, fields: dict[str, Any]) -> Prepared:
        """The prepared bundled task a row names, checked field by field (HTTP 422 naming the field)."""
        name = fields.get("repo_name")
        known = tasks.load_tasks()
        if not isinstance(name, str) or name not in known:
            raise HTTPException(
                422, f"row field repo_name {name!r} is not a bundled task ({', '.join(sorted(known))})"
            )
        prepared = self.host.prepare(name)
        built = prepared.built
        for field, expected in (("instance_id", built.instance_id), ("base_commit", built.base_commit)):
            if fields.get(field) != expected:
                raise HTTPException(
                    422, f"row field {field} {fields.get(field)!r} does not match task {name!r} ({expected})"
                )
        return prepared

    def _rollout_of(self, request: Request) -> Rollout:
        key = self._sessions.get(request.session[SESSION_ID_KEY])
        rollout = self._rollouts.get(key) if key is not None else None
        if rollout is None:
            raise HTTPException(
                409, "no workspace for this session: it was never seeded or already cleaned up"
            )
        return rollout

    # ---- routes --------------------------------------------------------------------------------------------

    async def seed_session(
        self, request: Request, body: RolloutSeedSessionRequest
    ) -> BaseSeedSessionResponse:
        fields = body.model_extra or {}
        rollout_id = rollout_id_of(fields)
        if rollout_id is not None and rollout_id in self._cleaned:
            raise HTTPException(409, f"rollout {rollout_id!r} was already cleaned up; refusing to seed it")
        prepared = self._task_for(fields)
        session_id = request.session[SESSION_ID_KEY]
        key = rollout_id or f"session:{session_id}"
        for stale in {self._sessions.get(session_id), key}:  # a re-seed starts over
            if stale is not None and stale in self._rollouts:
                await self._finish(self._rollouts[stale])
        try:
            workspace = await Workspace.create(self.host, prepared, key)
        except SandboxError as exc:
            raise HTTPException(503, f"the sandbox could not be set up: {exc}") from exc
        rollout = Rollout(key, rollout_id, session_id, workspace)
        self._rollouts[key] = rollout
        self._sessions[session_id] = key
        if rollout_id is not None and rollout_id in self._cleaned:  # cleaned while we were cloning
            await self._finish(rollout)
            raise HTTPException(409, f"rollout {rollout_id!r} was cleaned up while it was being seeded")
        return BaseSeedSessionResponse()

    async def _tool(self, request: Request, name: str, arguments: dict[str, Any]) -> PlainTextResponse:
        rollout = self._rollout_of(request)
        try:
            answer = await rollout.workspace.call(name, arguments)
        except WorkspaceClosed as exc:
            raise HTTPException(409, str(exc)) from exc
        except SandboxError as exc:
            raise HTTPException(503, f"the sandbox failed: {exc}") from exc
        return PlainTextResponse(answer or "")

    async def bash(self, request: Request, body: BashRequest) -> PlainTextResponse:
        return await self._tool(request, "bash", body.model_dump())

    async def view(self, request: Request, body: ViewRequest) -> PlainTextResponse:
        return await self._tool(request, "view", body.model_dump())

    async def str_replace(self, request: Request, body: StrReplaceRequest) -> PlainTextResponse:
        return await self._tool(request, "str_replace", body.model_dump())

    async def _replayed_patch(self, prepared: Prepared, output: list[Any]) -> tuple[bytes, bool, int, int]:
        """No workspace: rebuild one from the trajectory's tool calls, diff it, destroy it."""
        workspace = await Workspace.create(self.host, prepared, f"replay:{uuid.uuid4().hex}")
        try:
            for item in output:
                if (
                    not isinstance(item, dict)
                    or item.get("type") != "function_call"
                    or item.get("name") not in TOOLS
                ):
                    continue
                try:
                    arguments = json.loads(item.get("arguments") or "{}")
                except ValueError:
                    continue  # simple_agent answers malformed arguments without calling the tool
                if isinstance(arguments, dict):
                    await workspace.call(str(item["name"]), arguments)
            patch, too_large = await workspace.diff()
            return patch, too_large, workspace.commands, workspace.command_timeouts
        finally:
            if not await workspace.destroy():
                self._residue.setdefault(workspace.key, []).append((workspace.uid, workspace.directory))

    async def verify(self, request: Request, body: R2EVerifyRequest) -> R2EVerifyResponse:
        started = time.monotonic()
        fields = body.model_extra or {}
        rollout_id = rollout_id_of(fields, body.responses_create_params)
        key = self._sessions.get(request.session[SESSION_ID_KEY]) or rollout_id
        rollout = self._rollouts.get(key) if key is not None else None
        agent_seconds: float | None = None
        if rollout is None:
            if rollout_id is not None:
                raise HTTPException(
                    409,
                    f"rollout {rollout_id!r} has no workspace: it was cleaned up (aborted) or never seeded",
                )
            prepared = self._task_for(fields)
            output = body.response.model_dump(mode="json").get("output") or []
            try:
                patch, too_large, commands, timeouts = await self._replayed_patch(prepared, output)
            except SandboxError as exc:
                raise HTTPException(503, f"the sandbox failed: {exc}") from exc
            replayed = True
        else:
            workspace = rollout.workspace
            prepared = workspace.prepared
            agent_seconds = started - workspace.created
            try:
                patch, too_large = await workspace.diff()
            except WorkspaceClosed as exc:
                raise HTTPException(409, str(exc)) from exc
            except SandboxError as exc:
                raise HTTPException(503, f"the sandbox failed: {exc}") from exc
            finally:
                await self._finish(rollout)  # the trial is over: nothing of it stays
                if rollout.rollout_id is not None:
                    self._cleaned.add(rollout.rollout_id)
            commands, timeouts, replayed = workspace.commands, workspace.command_timeouts, False
        evaluation = await self._evaluate(key, prepared, patch, too_large=too_large)
        if not evaluation.released and evaluation.uid is not None and evaluation.directory is not None:
            self._residue.setdefault(key or "evaluations", []).append((evaluation.uid, evaluation.directory))
        return self._answer(
            body=body,
            prepared=prepared,
            evaluation=evaluation,
            patch=patch,
            commands=commands,
            timeouts=timeouts,
            replayed=replayed,
            started=started,
            agent_seconds=agent_seconds,
        )

    async def _evaluate(
        self, key: str | None, prepared: Prepared, patch: bytes, *, too_large: bool
    ) -> Evaluation:
        """Evaluate, visibly to a cleanup of the rollout (which cancels it: its sandbox is killed and its
        checkout removed on the way out)."""
        task = asyncio.ensure_future(evaluate(self.host, prepared, patch, too_large=too_large))
        if key is not None:
            self._verifying[key] = task
        try:
            return await task
        except SandboxError as exc:
            raise HTTPException(503, f"the evaluation sandbox failed: {exc}") from exc
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and current is not None and not current.cancelling():
                raise HTTPException(
                    409, f"rollout {key!r} was cleaned up while its patch was evaluated"
                ) from None
            task.cancel()  # this request itself was cancelled: so is its evaluation
            raise
        finally:
            if key is not None and self._verifying.get(key) is task:
                del self._verifying[key]

    def _answer(
        self,
        *,
        body: R2EVerifyRequest,
        prepared: Prepared,
        evaluation: Evaluation,
        patch: bytes,
        commands: int,
        timeouts: int,
        replayed: bool,
        started: float,
        agent_seconds: float | None,
    ) -> R2EVerifyResponse:
        if evaluation.resolved:
            reward = 1.0
        elif evaluation.patch_exists:
            reward = SHAPING_REWARD
        else:
            reward = 0.0
        verdict = {
            "reward": reward,
            "instance_id": prepared.built.instance_id,
            "resolved": evaluation.resolved,
            "patch_exists": evaluation.patch_exists,
            "patch_applied": evaluation.patch_applied,
            "patch_bytes": len(patch),
            "eval_timed_out": evaluation.timed_out,
            "tests_total": len(evaluation.results),
            "tests_passed": evaluation.tests_passed,
            "fail_to_pass_passed": evaluation.fail_to_pass[0],
            "fail_to_pass_total": evaluation.fail_to_pass[1],
            "pass_to_pass_passed": evaluation.pass_to_pass[0],
            "pass_to_pass_total": evaluation.pass_to_pass[1],
            "test_results": evaluation.results,
            "commands": commands,
            "command_timeouts": timeouts,
            "replayed": replayed,
            "tests_seconds": round(evaluation.seconds, 3),
            "verify_seconds": round(time.monotonic() - started, 3),
            "agent_seconds": None if agent_seconds is None else round(agent_seconds, 3),
        }
        # The row's own fields (e.g. its instance_id) give way to the verdict's.
        answer: R2EVerifyResponse = R2EVerifyResponse.model_validate({**body.model_dump(), **verdict})
        return answer

    async def cleanup(self, rollout_id: str) -> dict[str, Any]:
        self._cleaned.add(rollout_id)
        rollout = self._rollouts.get(rollout_id)
        if rollout is not None:
            await self._finish(rollout)
        evaluation = self._verifying.get(rollout_id)
        if evaluation is not None:
            evaluation.cancel()
            await asyncio.gather(evaluation, return_exceptions=True)
        return {"accepted": True, "rollout_id": rollout_id, "clean": await self._is_clean(rollout_id)}

    async def cleanup_status(self, rollout_id: str) -> dict[str, Any]:
        return {"rollout_id": rollout_id, "clean": await self._is_clean(rollout_id)}

    async def sandboxes(self) -> dict[str, Any]:
        host = self.host
        return {
            "rollouts": len(self._rollouts),
            "running": sum(rollout.workspace.running for rollout in self._rollouts.values()),
            "evaluating": len(self._verifying),
            "directories": len(host.run_dirs()),
            "sandbox_processes": len(await asyncio.to_thread(processes_of, host.uids.all_uids())),
            "uids_in_use": len(host.uids.in_use),
            "residue": sum(len(left) for left in self._residue.values()),
            "state_dir": str(host.root),
            "uid_range": [host.uids.base, host.uids.base + host.uids.size],
        }
