"""The catalogue's server classes as they run INSIDE the NeMo Gym environment:
``relax_gym_catalogue.servers:<server>`` is upstream's INSTALLED class (nothing vendored, nothing patched),
built on first use, for the servers that need one of two things.

REQUIRES: the PyPI packages a server imports beyond NeMo Gym (some only inside /verify, where a missing one
would be a 500 on every trial). They are imported first, so a missing one stops the server at start with one
line naming the package (`relax-gym up` and `probe` show it).

STATE: where a server keeps something per NeMo Gym session (a counter, a tool environment, a Python
subprocess, a game, a sandbox, a slot of a pool) that it never drops, or drops only when the run ends as
upstream's agent ends it: an aborted trial, or one that ran out of steps, would leak it for the life of the
server (or until a timeout). Such a server runs as a subclass with:

- the session a trial's ``/seed_session`` or ``/reset`` opens recorded under the trial's rollout id (the
  ``/run`` row's ``_ng_task_index``/``_ng_rollout_index``, else its tag), a seed for a rollout already
  cleaned up refused with HTTP 409 (an abort that overtook the seed cannot leak it);
- the session released when the trial is over: after ``/verify``, a ``/step`` that ends the game, or the
  route its agent closes it with (``State.close``);
- ``POST /cleanup/{rollout_id}`` (release everything of that rollout), ``GET /cleanup/{rollout_id}``
  (``{"rollout_id", "clean"}``, checked against the server's own state) and ``GET /relax_gym/sessions``
  (the live state, for leak checks).

The plugin reads both tables (at module level this file imports only the standard library and
relax_gym_core.ingym): which servers run from here, which need the cleanup contract, what to list as needs.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
import json
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any, Final, NamedTuple

from relax_gym_core.ingym import CLEANUP_PATH, CleanedRollouts, rollout_id_of

SESSIONS_PATH: Final = "/relax_gym/sessions"
SESSION_ID_KEY: Final = "session_id"  # nemo_gym.server_utils.SESSION_ID_KEY (checked on first use)
_SEEDS = frozenset({"/seed_session", "/reset"})  # a trial's session starts here (simple/gymnasium agent)
_TRACKED = _SEEDS | {"/verify", "/step"}


class State(NamedTuple):
    """Where an upstream server keeps its per-session state: the dict keyed by session id, and the method
    that releases one session (None: dropping the entry is all)."""

    attribute: str
    release: str | None = None
    close: str | None = None  # the route its agent ends a session with (released after it too)


# server -> {PyPI distribution: the module it provides}
REQUIRES: Final[dict[str, dict[str, str]]] = {
    "asr_with_pc": {"jiwer": "jiwer", "whisper-normalizer": "whisper_normalizer"},
    "grl_sokoban": {"gymnasium": "gymnasium", "gym-sokoban": "gym_sokoban"},
    "grl_tetris": {"gymnasium": "gymnasium"},
    "ruler2": {"editdistance": "editdistance"},
    "structeval": {"xmltodict": "xmltodict", "toml": "toml"},
    "structured_outputs": {
        "openapi-schema-validator": "openapi_schema_validator",
        "tomli-w": "tomli_w",
        "xmltodict": "xmltodict",
    },
    "terminal_multi_harness": {"openapi-schema-validator": "openapi_schema_validator"},
    "terminus_judge": {"openapi-schema-validator": "openapi_schema_validator"},
}

STATE: Final[dict[str, State]] = {
    "example_session_state_mgmt": State("session_id_to_counter"),
    "indirect_prompt_injection": State("session_id_to_env"),
    "math_with_code": State("_sessions", "_cleanup_session"),
    "litmus_agent": State("_sessions", "_cleanup_session"),  # a sandbox, made at a row's first tool call
    "example_multi_turn_gymnasium": State("session_turns"),
    "blackjack": State("session_state"),
    "grl_sokoban": State("session_id_to_state", "_close_env"),
    "grl_tetris": State("session_id_to_state", "_close_env"),
    # one slot of its backend's fixed pool (32) per episode: upstream frees it at the game's end, at the
    # /close its agent (main's gymnasium_agent) posts after a run, or after an hour idle: an aborted trial
    # would hold it that hour
    "openair_congestion": State("session_state", "_release_session", close="/close"),
}

type Scope = MutableMapping[str, Any]
type Message = MutableMapping[str, Any]
type Receive = Callable[[], Awaitable[Message]]
type Send = Callable[[Message], Awaitable[None]]
type ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Sessions:
    """Which sessions each rollout holds on one server, and how to release them."""

    def __init__(self, server: Any, state: State, remembered: int = 100_000) -> None:
        self._server = server
        self.state = state
        self._rollout_of: dict[str, str] = {}
        self._of_rollout: dict[str, set[str]] = {}
        self.cleaned = CleanedRollouts(remembered)

    def live(self) -> MutableMapping[str, Any]:
        state: MutableMapping[str, Any] = getattr(self._server, self.state.attribute)
        return state

    def opened(self, session_id: str, rollout_id: str) -> None:
        self._rollout_of[session_id] = rollout_id
        self._of_rollout.setdefault(rollout_id, set()).add(session_id)

    async def release(self, session_id: str) -> None:
        if self.state.release is None:
            self.live().pop(session_id, None)
        elif session_id in self.live():
            done = getattr(self._server, self.state.release)(session_id)
            if inspect.isawaitable(done):
                await done
        rollout_id = self._rollout_of.pop(session_id, None)
        if rollout_id is not None:
            held = self._of_rollout.get(rollout_id, set())
            held.discard(session_id)
            if not held:
                self._of_rollout.pop(rollout_id, None)

    async def release_rollout(self, rollout_id: str) -> int:
        self.cleaned.add(rollout_id)
        held = list(self._of_rollout.get(rollout_id, ()))
        for session_id in held:
            await self.release(session_id)
        return len(held)

    def clean(self, rollout_id: str) -> bool:
        live = self.live()
        return not any(session_id in live for session_id in self._of_rollout.get(rollout_id, ()))

    def counts(self) -> dict[str, int]:
        return {"sessions": len(self.live()), "rollouts": len(self._of_rollout), "cleaned": len(self.cleaned)}


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


class TrackSessions:
    """ASGI middleware, innermost (the session id is in scope["session"] by then): records which rollout a
    seed opens a session for, refuses a seed of a cleaned rollout, releases a finished trial's session."""

    def __init__(self, app: ASGIApp, sessions: Sessions) -> None:
        self.app = app
        self.sessions = sessions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        closing = self.sessions.state.close
        if scope["type"] != "http" or scope.get("method") != "POST" or path not in {*_TRACKED, closing}:
            await self.app(scope, receive, send)
            return
        session_id = (scope.get("session") or {}).get(SESSION_ID_KEY)
        if path in _SEEDS:
            replayed = await self._seed(scope, receive, send, session_id)
            if replayed is None:
                return
            receive = replayed
        answer: list[bytes] = []

        async def send_and_keep(message: Message) -> None:
            if message["type"] == "http.response.body" and path == "/step":
                answer.append(message.get("body", b""))
            await send(message)

        await self.app(scope, receive, send_and_keep)
        if not isinstance(session_id, str):
            return
        step = _json(b"".join(answer)) if path == "/step" else None
        game_over = isinstance(step, dict) and bool(step.get("terminated") or step.get("truncated"))
        if path in ("/verify", closing) or game_over:
            await self.sessions.release(session_id)

    async def _seed(self, scope: Scope, receive: Receive, send: Send, session_id: Any) -> Receive | None:
        """Read the seed's body (kept for the route), record or refuse its rollout; None when refused."""
        chunks: list[bytes] = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        fields = _json(body)
        rollout_id = rollout_id_of(fields) if isinstance(fields, dict) else None
        if rollout_id is not None and rollout_id in self.sessions.cleaned:
            detail = f"rollout {rollout_id!r} was already cleaned up; refusing to start a session for it"
            payload = json.dumps({"detail": detail}).encode()
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
            ]
            await send({"type": "http.response.start", "status": 409, "headers": headers})
            await send({"type": "http.response.body", "body": payload})
            return None
        if rollout_id is not None and isinstance(session_id, str):
            await self.sessions.release(session_id)  # a re-seeded session starts over, under its new rollout
            self.sessions.opened(session_id, rollout_id)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay


def _required(name: str) -> None:
    """Find what `name` needs beyond NeMo Gym (found, not imported: upstream may prepare its import, as
    grl_sokoban shims gym-sokoban's); a missing package is named in one line."""
    for distribution, module in REQUIRES.get(name, {}).items():
        if importlib.util.find_spec(module) is None:
            raise ModuleNotFoundError(
                f"{name} needs the PyPI package {distribution} in the NeMo Gym environment "
                f"(`make gym` installs it: plugins/catalogue/nemo-gym-requirements.txt)"
            )


def main_class(app: Path) -> str:
    """The class an upstream `app.py` runs: the X of its ``if __name__ == "__main__": X.run_webserver()``
    (parsed, never run)."""
    try:
        source = app.read_text(encoding="utf-8")
        # Only the module's last top-level `if __name__` block is parsed: a whole app.py costs ten times more,
        # and the catalogue reads every one each time a plugin manager registers it.
        start = source.rfind("\nif __name__")
        module = ast.parse(source[start + 1 :] if start >= 0 else source, filename=str(app))
    except (OSError, SyntaxError) as exc:
        raise LookupError(f"{app}: cannot read it ({exc})") from None
    for node in module.body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            for inner in ast.walk(node):
                if (
                    isinstance(inner, ast.Attribute)
                    and inner.attr == "run_webserver"
                    and isinstance(inner.value, ast.Name)
                ):
                    return inner.value.id
    raise LookupError(f"{app}: no `X.run_webserver()` under `if __name__ == '__main__'`")


def _server(name: str) -> type:
    """Upstream's server class of `name` (a REQUIRES or STATE key), with per-rollout cleanup if stateful."""
    _required(name)
    module = importlib.import_module(f"resources_servers.{name}.app")
    upstream: type = getattr(module, main_class(Path(str(module.__file__))))
    state = STATE.get(name)
    return upstream if state is None else _released(upstream, state)


def _released(upstream: type, state: State) -> type:
    from fastapi import FastAPI  # noqa: PLC0415 - NeMo Gym's environment only
    from nemo_gym import server_utils  # noqa: PLC0415
    from starlette.middleware import Middleware  # noqa: PLC0415

    if server_utils.SESSION_ID_KEY != SESSION_ID_KEY:  # the session key this module reads
        found = server_utils.SESSION_ID_KEY
        raise RuntimeError(f"NeMo Gym's SESSION_ID_KEY is {found!r}, not {SESSION_ID_KEY!r}")

    def setup_webserver(self: Any) -> FastAPI:
        app: FastAPI = upstream.setup_webserver(self)  # type: ignore[attr-defined]
        sessions = Sessions(self, state)
        before = len(app.router.routes)

        async def cleanup(rollout_id: str) -> dict[str, Any]:
            released = await sessions.release_rollout(rollout_id)
            return {"accepted": True, "rollout_id": rollout_id, "released_sessions": released}

        async def cleanup_status(rollout_id: str) -> dict[str, Any]:
            return {"rollout_id": rollout_id, "clean": sessions.clean(rollout_id)}

        async def counts() -> dict[str, int]:
            return sessions.counts()

        app.post(CLEANUP_PATH)(cleanup)
        app.get(CLEANUP_PATH)(cleanup_status)
        app.get(SESSIONS_PATH)(counts)
        ours = app.router.routes[before:]  # ahead of upstream's catch-all tool route POST /{path}
        del app.router.routes[before:]
        app.router.routes[0:0] = ours
        app.user_middleware.append(Middleware(TrackSessions, sessions=sessions))  # innermost
        return app

    return type(upstream.__name__, (upstream,), {"setup_webserver": setup_webserver, "__module__": __name__})


@functools.cache
def __getattr__(name: str) -> type:
    if name not in STATE and name not in REQUIRES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _server(name)
