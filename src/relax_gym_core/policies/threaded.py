"""Serve an ASGI app with real uvicorn on a loopback socket, in a background thread (for test servers)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import uvicorn
from starlette.applications import Starlette


class ThreadedServer:
    """Real uvicorn on a loopback socket (port 0 by default) in a daemon thread; stop() ends it."""

    def __init__(self, app: Starlette, *, host: str = "127.0.0.1", port: int = 0) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        bound_host, bound_port = self._sock.getsockname()[:2]
        self.url = (
            f"http://[{bound_host}]:{bound_port}"
            if ":" in bound_host
            else f"http://{bound_host}:{bound_port}"
        )
        config = uvicorn.Config(
            app,
            log_level="warning",
            log_config=None,  # leave the process's logging configuration alone
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=5,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name=f"uvicorn {self.url}", daemon=True)
        self._failure: BaseException | None = None
        self._started = False

    def _run(self) -> None:
        try:
            self._server.run(sockets=[self._sock])
        except BaseException as exc:  # noqa: BLE001 - reported to the starting thread (SystemExit included)
            self._failure = exc

    def start(self, timeout_s: float = 30.0) -> None:
        self._thread.start()
        self._started = True
        stop_at = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > stop_at:
                self.stop()
                raise RuntimeError(f"server at {self.url} did not start") from self._failure
            time.sleep(0.005)

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._started:
            self._server.should_exit = True
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(timeout_s)
        self._sock.close()

    def __enter__(self) -> ThreadedServer:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def serve_in_thread(app: Starlette, *, host: str = "127.0.0.1", port: int = 0) -> Iterator[ThreadedServer]:
    """Serve `app` until the block exits; yields the server (`.url`)."""
    with ThreadedServer(app, host=host, port=port) as server:
        yield server
