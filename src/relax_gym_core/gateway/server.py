"""Run the gateway under uvicorn on a socket we bind ourselves, so port 0 works and is reported."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import signal
import socket
import sys
import threading
from types import FrameType
from typing import Any

import uvicorn
from starlette.applications import Starlette

from relax_gym_core.errors import ConfigError
from relax_gym_core.gateway.config import Limits
from relax_gym_core.gateway.connections import ConnectionGuard, guarded_protocol

logger = logging.getLogger("relax_gym.gateway")
DEFAULT_LIMITS = Limits()

LISTENING_LINE = "relax-gym gateway listening on {url}"


def _exit_on_sigterm(_signum: int, _frame: object) -> None:
    raise SystemExit(128 + signal.SIGTERM)


def run(
    app: Starlette, sock: socket.socket, *, log_level: str = "warning", limits: Limits = DEFAULT_LIMITS
) -> None:
    """Serve on uvloop when installed (the gateway extra has it): about half the CPU per request.

    uvicorn shuts down gracefully on SIGINT/SIGTERM and then re-raises the signal; with this SIGTERM
    handler that unwinds as SystemExit, so callers' finally blocks (servers we started) still run.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        import uvloop  # noqa: PLC0415

        loop_factory: Any = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is part of the gateway extra
        loop_factory = None
    stopped_by = asyncio.run(serve(app, sock, log_level=log_level, limits=limits), loop_factory=loop_factory)
    if stopped_by == signal.SIGINT:
        # uvicorn re-raises the signal after its graceful shutdown; where SIGINT was ignored when this
        # process began (a background job of a script: `relax-gym up ... &`), that did nothing and this
        # would end with 0. It ends as an interrupt either way (the CLI's 130).
        raise KeyboardInterrupt


FD_RESERVE = 64  # descriptors for everything but client connections: listeners, logs, runtime files


def raise_fd_limit() -> int:
    """Raise this process's descriptor limit to its hard limit (1024 is a common soft default); return it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft


def connection_cap(configured: int, fd_limit: int) -> int:
    """At most half the descriptors go to client connections: each model call also holds one upstream."""
    if fd_limit == resource.RLIM_INFINITY:
        return configured
    return max(1, min(configured, (fd_limit - FD_RESERVE) // 2))


def listen(host: str, port: int) -> socket.socket:
    try:
        return bind(host, port)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY on accepted connections only when the socket
    # says it is TCP; without it every small response waits ~40 ms for a delayed ACK (Nagle).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()  # a port in use is reported by the caller; the socket must not outlive it
        raise
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _Server(uvicorn.Server):
    """uvicorn's server, telling the app when a signal begins its shutdown (``app.state.shutdown_begins``):
    the open requests it then drains include long polls, which answer at once instead of holding it."""

    def __init__(self, config: uvicorn.Config, app: Starlette) -> None:
        super().__init__(config)
        self._app = app
        self.stopped_by: int | None = None  # the first signal that began the shutdown

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self.stopped_by is None:
            self.stopped_by = sig
        # Any ASGI app may be served here (the bench's floor proxy is a bare function): ours has the hook.
        begins = getattr(getattr(self._app, "state", None), "shutdown_begins", None)
        if begins is not None:
            begins()


async def serve(
    app: Starlette, sock: socket.socket, *, log_level: str = "warning", limits: Limits = DEFAULT_LIMITS
) -> int | None:
    """Serve until SIGINT/SIGTERM (returned: the signal that stopped it); print the listening line once
    the app has started (lifespan done)."""
    max_connections = connection_cap(limits.max_connections, raise_fd_limit())
    if max_connections < limits.max_connections:
        logger.warning(
            "RELAX_GYM_MAX_CONNECTIONS lowered to %d: half of this process's file descriptor limit",
            max_connections,
        )
    guard = ConnectionGuard(
        header_timeout_s=limits.header_timeout_s,
        body_timeout_s=limits.body_timeout_s,
        max_connections=max_connections,
    )
    config = uvicorn.Config(
        app,
        http=guarded_protocol(guard),
        log_level=log_level,
        access_log=False,
        timeout_keep_alive=limits.keepalive_timeout_s,
        # Beyond the cap (once no connection waiting for a head can be closed instead) requests get 503.
        limit_concurrency=max_connections + 1,
        # Open requests get part of the shutdown budget; the lifespan's trial aborts get the rest.
        timeout_graceful_shutdown=limits.drain_s,
        lifespan="on",
        # No X-Forwarded-* rewriting: nothing here reads the client address, and it costs every request.
        proxy_headers=False,
        server_header=False,
    )
    server = _Server(config, app)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not task.done():  # noqa: ASYNC110 - uvicorn offers no startup event
        await asyncio.sleep(0.01)
    if server.started:
        print(LISTENING_LINE.format(url=url_of(sock)), flush=True)  # noqa: T201 - the contract with scripts
    await task
    if not server.started:
        sys.exit(1)
    return server.stopped_by
