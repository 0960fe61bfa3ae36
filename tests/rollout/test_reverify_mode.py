"""`relax-gym reverify` asks a resources server whether its /verify can score a stored answer again (NeMo Gym
>= 0.5's GET /reverify_mode): "stateless" re-scores even an environment whose cleanup contract keeps state,
"unsupported" refuses even a stateless one, and where the server says nothing else (0.4.0 has no such route,
"unknown") the environment's own contract decides. Real HTTP servers answer as NeMo Gym's would."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from relax_gym_core.gym.probe import REFUSED_UNSUPPORTED, reverify_mode, reverify_refusal
from relax_gym_core.testing.web import ThreadedServer

OWN = "its verifier reads state each trial held"
ANSWERS: dict[str, Response] = {
    "stateless": JSONResponse("stateless"),
    "unsupported": JSONResponse("unsupported"),
    "unknown": JSONResponse("unknown"),
    "not-json": PlainTextResponse("stateless?"),
    "an-object": JSONResponse({"mode": "stateless"}),
    "error": JSONResponse({"detail": "boom"}, status_code=500),
}


async def mode(request: Request) -> Response:
    return ANSWERS.get(request.path_params["server"], PlainTextResponse("Not Found", status_code=404))


@pytest.fixture(scope="module")
def servers() -> Iterator[str]:
    server = ThreadedServer(Starlette(routes=[Route("/{server}/reverify_mode", mode)]))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("server", "said", "own", "refusal"),
    [
        ("stateless", "stateless", OWN, None),  # the server's word over the contract
        ("unsupported", "unsupported", None, REFUSED_UNSUPPORTED),  # even for a stateless contract
        ("unknown", "unknown", OWN, OWN),
        ("unknown", "unknown", None, None),
        ("missing", None, OWN, OWN),  # NeMo Gym 0.4.0: 404
        ("missing", None, None, None),
        ("not-json", None, OWN, OWN),
        ("an-object", None, None, None),
        ("error", None, OWN, OWN),
    ],
)
def test_the_servers_word_decides_else_the_contract(
    servers: str, server: str, said: str | None, own: str | None, refusal: str | None
) -> None:
    with httpx.Client(trust_env=False, timeout=30) as client:
        assert reverify_mode(client, f"{servers}/{server}") == said
        assert reverify_refusal(client, f"{servers}/{server}", own) == refusal


def test_a_server_that_does_not_answer_says_nothing() -> None:
    with httpx.Client(trust_env=False, timeout=5) as client:
        assert reverify_mode(client, "http://127.0.0.1:9") is None
