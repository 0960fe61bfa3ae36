"""A refused request tells the user the gateway's reason and the client setting to change.

Real `relax-gym serve` processes and the real `relax-gym-client` process with Relax's variables; the
hostile-answer cases use a plain HTTP server on 127.0.0.1 and httpx.MockTransport.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from relax_gym_core.client import ClientOptions, GatewayClient, TrialGoneError, run_trial
from relax_gym_core.client.diagnosis import MAX_ERROR_BODY_BYTES
from relax_gym_core.errors import GatewayRequestError
from relax_gym_core.protocol.text import MAX_DETAIL_CHARS, safe_text
from relax_gym_core.testing.web import GatewayProcess, start_gateway

SAFETY_S = 60  # guards against hangs only
MODULE = [sys.executable, "-m", "relax_gym_core.client"]
FAST = ClientOptions(poll_interval_s=0.05, retry_backoff_s=0.05)
MAX_DEADLINE_S = 60
API_TOKEN = "gateway-api-token-0123456789"
WRONG_TOKEN = "wrong-api-token-9876543210"


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    spec = {
        "echo": {
            "environment": "echo",
            "runtime": "echo",
            "max_concurrency": 2,
            "queue_capacity": 2,
            "max_deadline_s": MAX_DEADLINE_S,
        }
    }
    with start_gateway(spec) as process:
        yield process


@pytest.fixture
def session(tmp_path: Path, environ_for: Any) -> Any:
    """session(gateway_url, **variables) -> (environ, io_dir) of a Relax-like session with its input."""

    def make(gateway_url: str, **variables: str) -> tuple[dict[str, str], Path]:
        io_dir = tmp_path / "relax-agentic-command-1"
        io_dir.mkdir()
        (io_dir / "session_input.json").write_text(
            json.dumps({"messages": [{"role": "user", "content": "hi"}], "metadata": {"echo": {"reward": 1}}})
        )
        base = {k: v for k, v in os.environ.items() if not k.startswith(("RELAX_", "NEMO_GYM_", "OPENAI_"))}
        environ = {
            **base,
            **environ_for(
                gateway_url, str(io_dir), NEMO_GYM_POLL_INTERVAL_S="0.05", NEMO_GYM_DEADLINE_S="30"
            ),
            "RELAX_INPUT_JSON": str(io_dir / "session_input.json"),
            "RELAX_OUTPUT_JSON": str(io_dir / "session_output.json"),
            **variables,
        }
        return environ, io_dir

    return make


def run_client(environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(MODULE, env=environ, capture_output=True, text=True, timeout=SAFETY_S, check=False)


def assert_one_line_failure(result: subprocess.CompletedProcess[str], io_dir: Path, session_id: str) -> str:
    """The Relax contract for a failed session; returns the message."""
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    assert result.stderr.startswith("relax-gym-client: ")
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr
    assert session_id not in result.stderr
    assert not (io_dir / "session_output.json").exists()
    return result.stderr.removeprefix("relax-gym-client: ").rstrip("\n")


# ---- the relax-gym-client process against a real gateway ---------------------------------------------


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        pytest.param(
            {"NEMO_GYM_DEADLINE_S": "120"},
            [
                "Gateway create request failed with HTTP 400: deadline_s exceeds the registered environment "
                "maximum; lower NEMO_GYM_DEADLINE_S (this request's deadline_s=120)"
            ],
            id="deadline-over-the-maximum",
        ),
        pytest.param(
            {"NEMO_GYM_ENVIRONMENT": "workplace", "NEMO_GYM_CONFIG": "workplace-v9"},
            [
                "HTTP 400: environment/config is not registered; NEMO_GYM_ENVIRONMENT / NEMO_GYM_CONFIG "
                "(or the row's metadata.environment / metadata.config) must name a pair the gateway "
                "registers; sent environment='workplace' config='workplace-v9'"
            ],
            id="unknown-environment",
        ),
        pytest.param(
            {"NEMO_GYM_INTERRUPT_POLICY": "interruptible"},
            [
                "HTTP 400: interrupt_policy does not match the registered environment capability; "
                "set NEMO_GYM_INTERRUPT_POLICY to the environment's registered policy (sent 'interruptible')"
            ],
            id="interrupt-policy",
        ),
        pytest.param(
            # Checked against the allowlist only, never resolved or called.
            {"RELAX_BASE_URL": "http://trainer.example:9/agentic_api"},
            [
                "HTTP 400: model_endpoint.base_url host is not in the callback allowlist; the gateway's "
                "NEMO_GYM_CALLBACK_ALLOWED_HOSTS / NEMO_GYM_CALLBACK_ALLOWED_NETWORKS must allow "
                "RELAX_BASE_URL's host 'trainer.example'"
            ],
            id="callback-host-refused",
        ),
    ],
)
def test_a_refused_create_names_the_reason_and_the_setting(
    gateway: GatewayProcess, session: Any, session_id: str, variables: dict[str, str], expected: list[str]
) -> None:
    environ, io_dir = session(gateway.url, **variables)
    message = assert_one_line_failure(run_client(environ), io_dir, session_id)
    for part in expected:
        assert part in message


def test_a_wrong_api_token_is_named_but_never_shown(session: Any, session_id: str) -> None:
    spec = {"echo": {"environment": "echo", "runtime": "echo"}}
    with start_gateway(spec, env={"RELAX_GYM_API_TOKEN": API_TOKEN}) as guarded:
        environ, io_dir = session(guarded.url, RELAX_GYM_API_TOKEN=WRONG_TOKEN)
        wrong = run_client(environ)
        del environ["RELAX_GYM_API_TOKEN"]
        missing = run_client(environ)
    assert assert_one_line_failure(wrong, io_dir, session_id) == (
        "Gateway create request failed with HTTP 401: missing or wrong API token "
        "(Authorization: Bearer ...); RELAX_GYM_API_TOKEN does not match the gateway's token"
    )
    assert assert_one_line_failure(missing, io_dir, session_id).endswith(
        "; the gateway requires an API token: set RELAX_GYM_API_TOKEN to its token"
    )
    for output in (wrong.stdout, wrong.stderr, missing.stderr, *guarded.output):
        assert API_TOKEN not in output
        assert WRONG_TOKEN not in output


# ---- the importable API against a real gateway ---------------------------------------------------------


@pytest.mark.anyio
async def test_run_trial_raises_with_the_gateway_detail(gateway: GatewayProcess, make_request: Any) -> None:
    request = make_request({"reward": 1.0}, NEMO_GYM_DEADLINE_S="90")
    with anyio.fail_after(SAFETY_S), pytest.raises(GatewayRequestError) as caught:
        await run_trial(request, gateway_url=gateway.url, options=FAST)
    error = caught.value
    assert (error.status_code, error.detail) == (400, "deadline_s exceeds the registered environment maximum")
    assert str(error).startswith(
        "Gateway create request failed with HTTP 400: deadline_s exceeds the registered environment maximum; "
        "lower NEMO_GYM_DEADLINE_S (this request's deadline_s=90)"
    )


@pytest.mark.anyio
async def test_gateway_client_names_the_unregistered_route(
    gateway: GatewayProcess, make_request: Any
) -> None:
    request = make_request(NEMO_GYM_ENVIRONMENT="nope", NEMO_GYM_DEADLINE_S="30")
    async with GatewayClient(gateway.url, options=FAST) as client:
        with anyio.fail_after(SAFETY_S), pytest.raises(GatewayRequestError) as caught:
            await client.create(request)
    assert caught.value.detail == "environment/config is not registered"
    assert "environment/config is not registered" in str(caught.value)
    assert "sent environment='nope' config='nope'" in str(caught.value)


@pytest.mark.anyio
async def test_a_lost_trial_points_at_the_retention(gateway: GatewayProcess) -> None:
    async with GatewayClient(gateway.url, options=FAST) as client:
        with anyio.fail_after(SAFETY_S), pytest.raises(TrialGoneError) as caught:
            await client.get("relax-never-created")
    assert caught.value.detail == "trial not found"
    assert str(caught.value).startswith("Gateway get request failed with HTTP 404: trial not found; ")
    assert "RELAX_GYM_TRIAL_RETENTION_S" in str(caught.value)


# ---- hostile or foreign answers ------------------------------------------------------------------------


class _Answer(BaseHTTPRequestHandler):
    """Answers every request with the server's canned (status, content type, body)."""

    def _answer(self) -> None:
        # Read the request first: closing over unread bytes resets the connection under the client.
        self.rfile.read(int(self.headers.get("content-length") or 0))
        status, content_type, body = self.server.answer  # type: ignore[attr-defined]
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def foreign_server() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_huge_multiline_detail_stays_one_bounded_line(
    foreign_server: ThreadingHTTPServer, session: Any, session_id: str
) -> None:
    detail = "refused\n\x1b[2J" + "x" * 500_000
    foreign_server.answer = (400, "application/json", json.dumps({"detail": detail}).encode())  # type: ignore[attr-defined]
    environ, io_dir = session(f"http://127.0.0.1:{foreign_server.server_address[1]}")
    message = assert_one_line_failure(run_client(environ), io_dir, session_id)
    # The escape character is gone (a space); what followed it is inert text.
    assert message.startswith("Gateway create request failed with HTTP 400: refused [2Jxxx")
    assert message.endswith("x...")
    assert "\x1b" not in message
    assert len(message) < MAX_DETAIL_CHARS + 100


def test_a_non_json_answer_is_not_echoed(
    foreign_server: ThreadingHTTPServer, session: Any, session_id: str
) -> None:
    foreign_server.answer = (404, "text/html", b"<html><body>nginx</body></html>\n" * 1000)  # type: ignore[attr-defined]
    environ, io_dir = session(f"http://127.0.0.1:{foreign_server.server_address[1]}")
    assert assert_one_line_failure(run_client(environ), io_dir, session_id) == (
        "Gateway create request failed with HTTP 404; "
        "NEMO_GYM_URL must be the root URL of a relax-gym gateway"
    )


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("body", "headers"),
    [
        pytest.param(b"<html>bad gateway</html>", {"content-type": "text/html"}, id="html"),
        pytest.param(b'{"detail": ["not", "a", "string"]}', {}, id="non-string-detail"),
        pytest.param(b"[" * 100_000 + b"]" * 100_000, {}, id="deeply-nested"),
        pytest.param(
            json.dumps({"detail": "x" * MAX_ERROR_BODY_BYTES}).encode(), {}, id="body-over-the-parse-limit"
        ),
        pytest.param(b'{"detail": " \\n\\u202e "}', {}, id="detail-of-control-characters-only"),
    ],
)
async def test_unusable_error_bodies_give_no_detail(
    fake_gateway: Any, make_client: Any, make_request: Any, body: bytes, headers: dict[str, str]
) -> None:
    gateway = fake_gateway()
    gateway.script["create"] = [httpx.Response(400, content=body, headers=headers)]
    async with make_client(gateway.transport()) as client:
        with pytest.raises(GatewayRequestError) as caught:
            await client.create(make_request())
    assert str(caught.value) == "Gateway create request failed with HTTP 400"
    assert caught.value.detail is None


@pytest.mark.anyio
async def test_exhausted_create_retries_say_so_with_the_detail(
    fake_gateway: Any, make_client: Any, make_request: Any
) -> None:
    gateway = fake_gateway()
    gateway.script["create"] = [httpx.Response(503, json={"detail": "gateway is shutting down"})] * 3
    async with make_client(gateway.transport(), retry_backoff_s=0) as client:
        with pytest.raises(GatewayRequestError) as caught:
            await client.create(make_request())
    assert str(caught.value) == (
        "Gateway create request failed with HTTP 503 after 3 attempts (retries exhausted): gateway is "
        "shutting down; NEMO_GYM_MAX_RETRIES (max_retries=2) and NEMO_GYM_RETRY_BACKOFF_S bound the retries"
    )


@pytest.mark.anyio
async def test_a_redirect_points_at_the_gateway_url(fake_gateway: Any, make_client: Any) -> None:
    gateway = fake_gateway()
    gateway.script["get"] = [httpx.Response(307, headers={"location": "https://elsewhere.test/"})]
    async with make_client(gateway.transport()) as client:
        with pytest.raises(
            GatewayRequestError, match=r"HTTP 307; NEMO_GYM_URL must be the gateway's own URL"
        ):
            await client.get("relax-1")


def test_safe_text_masks_before_it_cuts() -> None:
    secret = "s3cr3t-" + "k" * 40
    text = "y" * (MAX_DETAIL_CHARS - 10) + secret
    cut = safe_text(text, secrets=[secret])
    assert "s3cr3t" not in cut  # the cut would otherwise have kept the secret's first characters
    assert len(cut) == MAX_DETAIL_CHARS
    assert safe_text("a\tb\r\nc\x00d\u200be\u202ef", secrets=[""]) == "a b c d e f"
