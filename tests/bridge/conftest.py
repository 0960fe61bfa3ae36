"""Fixtures for the bridge: a real in-process gateway (uvicorn in a thread) and the scripted policy server.

A trial's rollout id is not in its snapshot (only its environment sees it), so the gateway runs in this
process and the tests read it from the app's trial book.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from attrs import frozen

from relax_gym_core.bridge import CallbackPolicy
from relax_gym_core.gateway import GatewaySettings, create_app, parse_environments
from relax_gym_core.testing.web import ScriptedPolicy, ThreadedServer, run_policy, serve_in_thread

from . import sdks

ECHO_SPECS = {"echo": {"environment": "echo", "runtime": "echo", "max_concurrency": 8, "queue_capacity": 8}}
AGENT_KEY = "agent-side-key"  # what the agent's SDK is configured with; must never reach the policy
SDK_TIMEOUT_S = 60  # a safety net so a broken bridge fails a test instead of hanging it


@frozen
class Trial:
    request_id: str
    rollout_id: str
    token: str  # the session token the gateway must present upstream
    model: str  # the alias the gateway must force on every forwarded body


class BridgeGateway:
    """A gateway whose bridge may call back to 127.0.0.1, plus helpers to make trials and SDK clients."""

    def __init__(self, server: ThreadedServer, app: Any, make_body: Any) -> None:
        self.url = server.url
        self._make_body = make_body
        self.app = app
        self.http = httpx.Client(base_url=server.url, timeout=30, trust_env=False)
        self._closers: list[Any] = []
        self._clients: dict[tuple[str, str], object] = {}

    def close(self) -> None:
        for close in reversed(self._closers):
            close()
        self.http.close()

    def rollout_id(self, request_id: str) -> str:
        return self.app.state.gateway.service.book.get(request_id).rollout_id  # what model calls carry

    def create_trial(
        self,
        base_url: str,
        *,
        token: str | None = None,
        model: str = "policy-alias",
        sampling_params: dict[str, Any] | None = None,
        **endpoint: Any,
    ) -> Trial:
        token = token or f"agentic_session_shard_0.session-{secrets.token_hex(8)}"
        body = self._make_body(
            echo={"sleep_s": 600},  # the run stays active while the test makes model calls
            model_endpoint={"base_url": base_url, "api_key": token, "model": model, **endpoint},
        )
        if sampling_params is not None:
            body["generation"] = {"sampling_params": sampling_params}
        response = self.http.post("/v1/trials", json=body)
        assert response.status_code == 202, response.text
        request_id = body["request_id"]
        self._closers.append(lambda: self.http.post(f"/v1/trials/{request_id}/abort"))
        return Trial(request_id, self.rollout_id(request_id), token, model)

    def abort(self, trial: Trial) -> None:
        response = self.http.post(f"/v1/trials/{trial.request_id}/abort")
        assert response.status_code == 202, response.text

    def openai_client(self, rollout_id: str) -> sdks.openai.OpenAI:
        """One SDK client per rollout id, reused (building clients is the slow part of a call)."""
        client = self._clients.get(("openai", rollout_id))
        if client is None:
            client = sdks.openai.OpenAI(
                base_url=f"{self.url}/ng-rollout/{rollout_id}/v1",
                api_key=AGENT_KEY,
                max_retries=0,
                timeout=SDK_TIMEOUT_S,
            )
            self._clients["openai", rollout_id] = client
            self._closers.append(client.close)
        assert isinstance(client, sdks.openai.OpenAI)
        return client

    def async_openai_client(self, rollout_id: str) -> sdks.openai.AsyncOpenAI:
        # Closed by the test (an async client must be closed on its own loop).
        return sdks.openai.AsyncOpenAI(
            base_url=f"{self.url}/ng-rollout/{rollout_id}/v1",
            api_key=AGENT_KEY,
            max_retries=0,
            timeout=SDK_TIMEOUT_S,
        )

    def anthropic_client(self, rollout_id: str) -> sdks.anthropic.Anthropic:
        client = self._clients.get(("anthropic", rollout_id))
        if client is None:
            client = sdks.anthropic.Anthropic(
                base_url=f"{self.url}/ng-rollout/{rollout_id}",
                api_key=AGENT_KEY,
                max_retries=0,
                timeout=SDK_TIMEOUT_S,
            )
            self._clients["anthropic", rollout_id] = client
            self._closers.append(client.close)
        assert isinstance(client, sdks.anthropic.Anthropic)
        return client

    def async_anthropic_client(self, rollout_id: str) -> sdks.anthropic.AsyncAnthropic:
        return sdks.anthropic.AsyncAnthropic(
            base_url=f"{self.url}/ng-rollout/{rollout_id}",
            api_key=AGENT_KEY,
            max_retries=0,
            timeout=SDK_TIMEOUT_S,
        )


@pytest.fixture
def policy() -> Iterator[ScriptedPolicy]:
    with run_policy() as server:
        yield server


@pytest.fixture
def gateway_factory(make_body: Any) -> Iterator[Callable[..., BridgeGateway]]:
    """Start gateways (settings overrides as keywords); all are stopped after the test."""
    with contextlib.ExitStack() as stack:

        def make(*, observers: tuple[Any, ...] = (), **overrides: Any) -> BridgeGateway:
            settings = GatewaySettings(
                environments=parse_environments(json.dumps(ECHO_SPECS), source="test"),
                callback_policy=CallbackPolicy.parse(hosts=[], networks=["127.0.0.1/32"], proxy=None),
                public_url=None,
                **{"scan_interval_s": 0.05, "cleanup_grace_s": 5, **overrides},
            )
            app = create_app(settings, observers=observers)
            server = stack.enter_context(serve_in_thread(app))
            bridge_gateway = BridgeGateway(server, app, make_body)
            stack.callback(bridge_gateway.close)  # runs before its server stops
            return bridge_gateway

        yield make


@pytest.fixture
def gateway(gateway_factory: Callable[..., BridgeGateway]) -> BridgeGateway:
    return gateway_factory()
