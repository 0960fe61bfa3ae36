"""Connection guard: every request arrives whole in bounded time, and open connections are bounded.

uvicorn closes idle keep-alive connections, but waits forever for a request head or body that never
finishes, so a client can hold a file descriptor indefinitely; enough of them exhaust the process's
descriptors and every new connection then fails. The ASGI app cannot help: it only runs once a head is
complete. So the guard sits in the HTTP protocol, as a small subclass of uvicorn's httptools protocol that
reports four moments (connected, head complete, body complete, response sent) to a ConnectionGuard:

- it records a deadline when a connection starts waiting for a head (on connect, and after each answer)
  or for a body (once the head is complete), and one sweep a second closes those past it;
- when more than `max_connections` are open, the connection that has waited longest for a request head
  (an idle keep-alive one, or a slow sender) is closed to make room: real clients send a head at once.

The per-request cost is two dict updates; there is no timer per request.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

logger = logging.getLogger("relax_gym.gateway")

type Connection = Any  # a GuardedProtocol; Any keeps uvicorn's internals out of our signatures


class ConnectionGuard:
    def __init__(self, *, header_timeout_s: float, body_timeout_s: float, max_connections: int) -> None:
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        self.max_connections = max_connections
        self.sweep_interval_s = min(1.0, header_timeout_s / 4, body_timeout_s / 4)
        # Connection -> deadline, in the order they started waiting (so deadlines ascend in each dict).
        self._heads: dict[Connection, float] = {}
        self._bodies: dict[Connection, float] = {}
        self._sweeping = False
        self.timed_out = 0  # closed for not sending a head or body in time
        self.evicted = 0  # closed to make room for a new connection

    def connected(self, conn: Connection) -> None:
        self.waiting_for_head(conn)
        if not self._sweeping:
            self._sweeping = True
            conn.loop.call_later(self.sweep_interval_s, self._sweep, conn.loop)
        if len(conn.connections) > self.max_connections:
            self._make_room(conn)

    def waiting_for_head(self, conn: Connection) -> None:
        self._heads.pop(conn, None)  # re-inserted at the end: the dict stays in deadline order
        self._heads[conn] = conn.loop.time() + self.header_timeout_s

    def waiting_for_body(self, conn: Connection) -> None:
        self._heads.pop(conn, None)
        self._bodies.pop(conn, None)
        self._bodies[conn] = conn.loop.time() + self.body_timeout_s

    def request_read(self, conn: Connection) -> None:
        self._bodies.pop(conn, None)

    def forget(self, conn: Connection) -> None:
        self._heads.pop(conn, None)
        self._bodies.pop(conn, None)

    def _make_room(self, newcomer: Connection) -> None:
        for conn in self._heads:
            if conn is not newcomer:
                self.evicted += 1
                self._close(conn)
                return

    def _close(self, conn: Connection) -> None:
        self.forget(conn)
        # Counted out at once: uvicorn only drops it from its set in connection_lost, a loop turn later,
        # and meanwhile would answer the newcomer 503 for a connection already on its way out.
        conn.connections.discard(conn)
        if not conn.transport.is_closing():
            conn.transport.close()

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        for waiting in (self._heads, self._bodies):
            overdue = []
            for conn, deadline in waiting.items():
                if deadline > now:
                    break  # the rest are later
                overdue.append(conn)
            for conn in overdue:
                self.timed_out += 1
                self._close(conn)
        loop.call_later(self.sweep_interval_s, self._sweep, loop)


def guarded_protocol(guard: ConnectionGuard) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol, reporting to `guard` (pass it as uvicorn.Config(http=...))."""

    class GuardedProtocol(HttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            guard.connected(self)

        def on_headers_complete(self) -> None:
            guard.waiting_for_body(self)
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            guard.request_read(self)
            super().on_message_complete()

        def on_response_complete(self) -> None:
            pipelined = bool(self.pipeline)  # a queued request already has its head
            super().on_response_complete()
            if not pipelined and not self.transport.is_closing():
                guard.waiting_for_head(self)

        def connection_lost(self, exc: Exception | None) -> None:
            guard.forget(self)
            super().connection_lost(exc)

    return GuardedProtocol
