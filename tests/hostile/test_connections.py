"""A request must arrive whole in bounded time, and open connections are bounded.

The case: 1,000 half-sent requests stayed open forever, and 1,100 of them (past the process's descriptor
limit) made every new request get an empty reply.
"""

from __future__ import annotations

import resource
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from relax_gym_core.gateway.server import FD_RESERVE, connection_cap, raise_fd_limit

from .conftest import SAFETY_S, closed_by_peer, connect, gateway_with, head

HALF_HEAD = b"GET /healthz HTTP/1.1\r\nHost: gateway\r\n"  # the blank line that ends a head never comes


@pytest.fixture
def many_sockets() -> Iterator[None]:
    """Room for this test's own 1,100+ sockets, restored afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
    if wanted < 1500:
        pytest.skip(f"this process may open only {hard} descriptors")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_request_head_that_never_completes_is_closed() -> None:
    with gateway_with({"RELAX_GYM_HEADER_TIMEOUT_S": "1"}) as gateway:
        silent = connect(gateway)  # says nothing at all
        partial = connect(gateway)
        partial.sendall(HALF_HEAD)
        with silent, partial:
            assert closed_by_peer(silent)
            assert closed_by_peer(partial)
        assert httpx.get(f"{gateway.url}/healthz", trust_env=False, timeout=SAFETY_S).status_code == 200


def test_a_body_that_never_completes_is_closed() -> None:
    with gateway_with({"RELAX_GYM_BODY_TIMEOUT_S": "1"}) as gateway, connect(gateway) as sock:
        sock.sendall(head("POST", "/v1/trials", **{"Content-Length": 100}) + b'{"protocol_version":')
        assert closed_by_peer(sock)


def test_an_idle_keep_alive_connection_that_trickles_is_closed() -> None:
    # One byte of a next request cancels uvicorn's keep-alive timer; the head deadline still holds.
    env = {"RELAX_GYM_HEADER_TIMEOUT_S": "1", "RELAX_GYM_KEEPALIVE_TIMEOUT_S": "60"}
    with gateway_with(env) as gateway, connect(gateway) as sock:
        sock.sendall(head("GET", "/healthz"))
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        sock.sendall(b"G")
        assert closed_by_peer(sock)


@pytest.mark.usefixtures("many_sockets")
def test_eleven_hundred_half_sent_requests_do_not_lock_anyone_out() -> None:
    # A long head timeout: whatever closes the stalled connections here is the connection cap.
    env = {"RELAX_GYM_MAX_CONNECTIONS": "256", "RELAX_GYM_HEADER_TIMEOUT_S": "600"}
    with gateway_with(env) as gateway:
        stalled: list[socket.socket] = []
        try:
            for _ in range(1100):
                sock = connect(gateway)
                sock.sendall(HALF_HEAD)
                stalled.append(sock)
            for _ in range(3):
                answer = httpx.get(f"{gateway.url}/healthz", trust_env=False, timeout=SAFETY_S)
                assert answer.status_code == 200
            # The oldest stalled connections made room: at least all but the cap's worth are gone.
            deadline = time.monotonic() + SAFETY_S
            closed = sum(
                closed_by_peer(sock, timeout_s=max(0.0, deadline - time.monotonic()))
                for sock in stalled[:800]
            )
            assert closed == 800
        finally:
            for sock in stalled:
                sock.close()


def test_the_connection_cap_leaves_descriptors_for_upstream_calls() -> None:
    assert connection_cap(2048, 1024) == (1024 - FD_RESERVE) // 2
    assert connection_cap(2048, 1_000_000) == 2048
    assert connection_cap(2048, resource.RLIM_INFINITY) == 2048
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        assert raise_fd_limit() >= before[0]
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)
