"""Hostile and accidental input against real `relax-gym serve` processes (echo runtime), over raw sockets
where an HTTP client would tidy the attack away (half-sent heads, lying lengths, chunked floods)."""

from __future__ import annotations

import contextlib
import select
import socket
import time
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
from attrs import frozen

from relax_gym_core.testing.web import GatewayProcess, start_gateway

ECHO = {"echo": {"environment": "echo", "runtime": "echo", "max_concurrency": 4, "queue_capacity": 16}}
SAFETY_S = 60.0  # bounds waits that only run out when the behaviour under test is broken


def address(gateway: GatewayProcess) -> tuple[str, int]:
    host, port = gateway.url.removeprefix("http://").rsplit(":", 1)
    return host.strip("[]"), int(port)


def connect(gateway: GatewayProcess) -> socket.socket:
    sock = socket.create_connection(address(gateway), timeout=SAFETY_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


@frozen
class RawResponse:
    status: int
    headers: Mapping[str, str]
    body: bytes


def read_response(sock: socket.socket, timeout_s: float = SAFETY_S) -> RawResponse:
    """One HTTP/1.1 response with a Content-Length (every answer of the gateway has one)."""
    sock.settimeout(timeout_s)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"connection closed before a response head: {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {
        name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)
    }
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return RawResponse(int(status_line.split()[1]), headers, body)


def closed_by_peer(sock: socket.socket, timeout_s: float = SAFETY_S) -> bool:
    """True once the server closes (EOF or reset) within `timeout_s`; data before that is skipped."""
    stop = time.monotonic() + timeout_s
    while (left := stop - time.monotonic()) > 0:
        readable, _, _ = select.select([sock], [], [], left)
        if not readable:
            continue
        try:
            if not sock.recv(65536):
                return True
        except (ConnectionResetError, OSError):
            return True
    return False


def head(method: str, path: str, **headers: str | int) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: gateway", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@contextlib.contextmanager
def gateway_with(env: Mapping[str, str] | None = None, specs: Any = None) -> Iterator[GatewayProcess]:
    with start_gateway(specs or ECHO, env=dict(env or {})) as gateway:
        yield gateway


def metric(gateway: GatewayProcess, name: str, **labels: str) -> float:
    """The value of one sample of /metrics (0 when absent)."""
    text = httpx.get(f"{gateway.url}/metrics", trust_env=False, timeout=SAFETY_S).text
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) and all(
            f'{key}="{value}"' in line for key, value in labels.items()
        ):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def logged(gateway: GatewayProcess, needle: str, timeout_s: float = SAFETY_S) -> str | None:
    """The first output line containing `needle`, waiting for the process's output to be read."""
    stop = time.monotonic() + timeout_s
    while True:
        found = next((line for line in list(gateway.output) if needle in line), None)
        if found is not None or time.monotonic() > stop:
            return found
        time.sleep(0.02)
