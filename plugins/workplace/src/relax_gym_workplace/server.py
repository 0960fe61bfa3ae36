"""The workplace resources server with per-rollout cleanup (runs INSIDE the NeMo Gym environment).

Upstream's ``WorkbenchResourcesServer`` (nemo-gym 0.4.0) keeps every seeded session's tool databases
(about 644 KB each) forever: no end-of-session hook, no delete route. This subclass of the INSTALLED
class (nothing vendored, nothing patched) adds:

- ``POST /seed_session`` also accepts the ``/run`` row's extra fields and records which rollout the
  session belongs to (rollout id = ``f"{_ng_task_index}-{_ng_rollout_index}"``, else the trial's tag
  ``responses_create_params.metadata.relax_gym_rollout``, which holds the same id). A seed for a rollout
  that was already cleaned up is refused (HTTP 409): an abort that overtakes the seed cannot leak a session.
- ``POST /verify`` scores with upstream's verify, then always (finally) drops the session's tool
  databases and mappings: the trial is over (upstream's verify replays the calls on fresh databases and
  never reads the session's own). Its answer then states the rollout released (ingym.mark_released, in
  ``responses_create_params.metadata``), which the agent passes on in the /run answer: the gateway
  needs no cleanup probe after a run that ended this way.
- ``POST /cleanup/{rollout_id}`` drops every session of that rollout and remembers the id (bounded) ->
  ``{"accepted": true, ...}``; ``GET /cleanup/{rollout_id}`` -> ``{"rollout_id", "clean"}``, clean when
  no tool databases of that rollout are left.
- ``GET /relax_gym/sessions`` -> ``{"sessions": <live tool databases>, ...}``, for leak checks.

Imports: the standard library, what the NeMo Gym environment provides, and relax_gym_core.ingym (the wire
names and the cleanup protocol, standard library only; never the rest of relax_gym_core). All state
changes happen on the server's event loop between awaits, so no locks are needed.
"""

from typing import Any

from fastapi import FastAPI, HTTPException, Request
from nemo_gym.base_resources_server import BaseSeedSessionRequest, BaseSeedSessionResponse
from nemo_gym.server_utils import SESSION_ID_KEY
from pydantic import ConfigDict, PrivateAttr
from relax_gym_core.ingym import CLEANUP_PATH, CleanedRollouts, mark_released, rollout_id_of
from resources_servers.workplace_assistant.app import (
    WorkbenchResourcesServer,
    WorkbenchResourcesServerConfig,
    WorkbenchVerifyRequest,
    WorkbenchVerifyResponse,
)

SESSIONS_PATH = "/relax_gym/sessions"


class CleanupWorkbenchResourcesServerConfig(WorkbenchResourcesServerConfig):  # type: ignore[misc]
    # How many cleaned-up rollout ids are remembered to refuse late seeds (oldest forgotten first).
    remembered_cleanups: int = 100_000


class RolloutSeedSessionRequest(BaseSeedSessionRequest):  # type: ignore[misc]
    model_config = ConfigDict(extra="allow")  # the whole /run row arrives here


class RolloutVerifyRequest(WorkbenchVerifyRequest):  # type: ignore[misc]
    model_config = ConfigDict(extra="allow")  # keeps _ng_task_index / _ng_rollout_index


class CleanupWorkbenchResourcesServer(WorkbenchResourcesServer):  # type: ignore[misc]
    config: CleanupWorkbenchResourcesServerConfig

    _session_rollout: dict[str, str] = PrivateAttr(default_factory=dict)
    _rollout_sessions: dict[str, set[str]] = PrivateAttr(default_factory=dict)
    _cleaned: CleanedRollouts = PrivateAttr(default_factory=CleanedRollouts)

    def model_post_init(self, context: Any) -> None:
        super().model_post_init(context)
        self._cleaned = CleanedRollouts(self.config.remembered_cleanups)  # sized by the config

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        before = len(app.router.routes)
        app.post(CLEANUP_PATH)(self.cleanup)
        app.get(CLEANUP_PATH)(self.cleanup_status)
        app.get(SESSIONS_PATH)(self.sessions)
        # Ahead of upstream's catch-all tool route POST /{path}, so no tool name can shadow ours.
        ours = app.router.routes[before:]
        del app.router.routes[before:]
        app.router.routes[0:0] = ours
        return app

    # ---- bookkeeping ----------------------------------------------------------------------------

    def _drop_session(self, session_id: str) -> None:
        self.session_id_to_tool_env.pop(session_id, None)
        rollout_id = self._session_rollout.pop(session_id, None)
        if rollout_id is not None:
            sessions = self._rollout_sessions.get(rollout_id, set())
            sessions.discard(session_id)
            if not sessions:
                self._rollout_sessions.pop(rollout_id, None)

    def _drop_rollout(self, rollout_id: str) -> int:
        sessions = self._rollout_sessions.pop(rollout_id, set())
        for session_id in sessions:
            self.session_id_to_tool_env.pop(session_id, None)
            self._session_rollout.pop(session_id, None)
        return len(sessions)

    def _refuse_cleaned(self, rollout_id: str) -> HTTPException:
        return HTTPException(
            status_code=409,
            detail=f"rollout {rollout_id!r} was already cleaned up; refusing to seed a session for it",
        )

    # ---- routes ---------------------------------------------------------------------------------

    async def seed_session(
        self, request: Request, body: RolloutSeedSessionRequest
    ) -> BaseSeedSessionResponse:
        rollout_id = rollout_id_of(body.model_extra)
        if rollout_id is not None and rollout_id in self._cleaned:
            raise self._refuse_cleaned(rollout_id)
        session_id = request.session[SESSION_ID_KEY]
        self._drop_session(session_id)  # a re-seeded session starts over, under its new rollout
        response = await super().seed_session(request, body)
        if rollout_id is not None:
            if rollout_id in self._cleaned:  # cleaned while upstream was seeding
                self._drop_session(session_id)
                raise self._refuse_cleaned(rollout_id)
            self._session_rollout[session_id] = rollout_id
            self._rollout_sessions.setdefault(rollout_id, set()).add(session_id)
        return response

    async def verify(self, request: Request, body: RolloutVerifyRequest) -> WorkbenchVerifyResponse:
        session_id = request.session[SESSION_ID_KEY]
        rollout_id = rollout_id_of(body.model_extra, body.responses_create_params)
        try:
            response: WorkbenchVerifyResponse = await super().verify(body)
        finally:
            self._drop_session(session_id)
            if rollout_id is not None:
                self._drop_rollout(rollout_id)
        if rollout_id is not None and rollout_id not in self._rollout_sessions:
            # What GET /cleanup/{rollout_id} would answer now, said in the answer: no probe after the run.
            mark_released(response.responses_create_params, rollout_id)
        return response

    async def cleanup(self, rollout_id: str) -> dict[str, Any]:
        dropped = self._drop_rollout(rollout_id)
        self._cleaned.add(rollout_id)
        return {"accepted": True, "rollout_id": rollout_id, "dropped_sessions": dropped}

    async def cleanup_status(self, rollout_id: str) -> dict[str, Any]:
        return {"rollout_id": rollout_id, "clean": rollout_id not in self._rollout_sessions}

    async def sessions(self) -> dict[str, int]:
        return {
            "sessions": len(self.session_id_to_tool_env),
            "rollouts": len(self._rollout_sessions),
            "remembered_cleanups": len(self._cleaned),
        }
