"""Free ports for servers we start next, and whether a server answers on its URL yet (standard library only:
also used inside the NeMo Gym environment, by the Ray replicas' actors)."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

__all__ = ["answers_root", "free_ports"]


def answers_root(opener: urllib.request.OpenerDirector, url: str) -> bool:
    """Whether GET `url`/ answers 200 (a NeMo Gym server is up); `opener` reuses one handler chain."""
    try:
        with opener.open(f"{url}/", timeout=2.0) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Ports the kernel just handed out (held together so they differ), for servers we start next."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()
