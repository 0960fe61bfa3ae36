"""The bridge end to end, with the official `openai` and `anthropic` SDKs as the agent and the scripted
policy server as Relax's per-session model API. Everything goes over real loopback HTTP.

Each call checks both sides: what the policy received (path, session token, forced alias, sampling
overrides, no capability, no agent headers) and what the SDK parsed.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

import pydantic
import pytest

from relax_gym_core.bridge import ROLLOUT_TAG
from relax_gym_core.policies.formats import responses_object
from relax_gym_core.testing import (
    Gate,
    ModelReply,
    RecordedRequest,
    ScriptedReply,
    ToolCall,
    reply_error,
    reply_json,
    reply_raw,
    reply_text,
    reply_tool_calls,
)
from relax_gym_core.testing.web import ScriptedPolicy, run_policy

from . import sdks
from .conftest import AGENT_KEY, SDK_TIMEOUT_S, BridgeGateway, Trial

RESOURCES = ("chat/completions", "responses", "messages")
WEATHER = ToolCall("get_weather", {"city": "Paris", "unit": "C"}, id="call_0123456789abcdef01234567")
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}}
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}]
RESPONSES_TOOLS = [{"type": "function", "name": "get_weather", "parameters": SCHEMA, "strict": False}]
MESSAGES_TOOLS = [{"name": "get_weather", "description": "Weather by city", "input_schema": SCHEMA}]
USER: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
SAMPLING = {"temperature": 0.3}  # the trial's override; agents ask for 1.5 and must not get it


def assert_forwarded(seen: RecordedRequest, trial: Trial, resource: str, **fields: Any) -> None:
    """The policy got exactly this trial's call: its path, its token, its alias, nothing of the agent's."""
    assert (seen.method, seen.path) == ("POST", f"/agentic_api/v1/{resource}")
    assert seen.headers["authorization"] == f"Bearer {trial.token}"
    assert seen.headers["content-type"] == "application/json"
    leaked = {k: v for k, v in seen.headers.items() if AGENT_KEY in v or trial.rollout_id in v}
    assert leaked == {}
    agent_headers = [
        h for h in seen.headers if h.startswith(("x-stainless", "openai-", "anthropic-", "x-api-key"))
    ]
    assert agent_headers == []
    assert isinstance(seen.body, dict)
    assert seen.body["model"] == trial.model
    raw = seen.raw_body.decode()
    assert ROLLOUT_TAG not in raw
    assert trial.rollout_id not in raw
    for key, value in fields.items():
        assert seen.body[key] == value, key


# ---- a NeMo Gym-style check of Responses answers -----------------------------------------------------
# NeMoGymResponse (OpenAI's Response model as pinned by NeMo Gym, openai 2.7) requires these fields; the
# bridge must fill what Relax leaves out. (The openai SDK installed here is newer and asks for more.)


class _InputDetails(pydantic.BaseModel):
    cached_tokens: int


class _OutputDetails(pydantic.BaseModel):
    reasoning_tokens: int


class _Usage(pydantic.BaseModel):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: _InputDetails
    output_tokens_details: _OutputDetails


class _Summary(pydantic.BaseModel):
    type: Literal["summary_text"]
    text: str


class _Reasoning(pydantic.BaseModel):
    type: Literal["reasoning"]
    id: str
    summary: list[_Summary]


class _Item(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")
    type: Literal["message", "function_call"]


class NeMoGymLikeResponse(pydantic.BaseModel):
    id: str
    created_at: float
    model: str
    object: Literal["response"]
    output: list[_Reasoning | _Item]
    parallel_tool_calls: bool
    tool_choice: str | dict[str, Any]
    tools: list[dict[str, Any]]
    usage: _Usage | None = None


# ---- helpers -----------------------------------------------------------------------------------------


def sdk_call(gateway: BridgeGateway, rollout_id: str, resource: str, *, stream: bool = False) -> str:
    """One minimal model call through the official SDK; returns the assistant text."""
    if resource == "chat/completions":
        chat = gateway.openai_client(rollout_id).chat.completions
        if stream:
            chunks = chat.create(model="agent-model", messages=USER, stream=True)
            return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return chat.create(model="agent-model", messages=USER).choices[0].message.content or ""
    if resource == "responses":
        responses = gateway.openai_client(rollout_id).responses
        if stream:
            with responses.stream(model="agent-model", input="hi") as events:
                return events.get_final_response().output_text
        return responses.create(model="agent-model", input="hi").output_text
    messages = gateway.anthropic_client(rollout_id).messages
    if stream:
        with messages.stream(model="claude-agent", max_tokens=64, messages=USER) as events:
            final = events.get_final_message()
    else:
        final = messages.create(model="claude-agent", max_tokens=64, messages=USER)
    return "".join(block.text for block in final.content if block.type == "text")


def assert_unavailable(exc: BaseException, resource: str, stream: bool, *, in_flight: bool = False) -> None:
    """410 with the bridge's detail. A capability already unavailable is refused before any stream starts;
    a Messages stream in flight is already 200, so an abort during it comes in-band."""
    assert isinstance(exc, (sdks.openai.APIStatusError, sdks.anthropic.APIStatusError))
    if resource == "messages" and stream and in_flight:
        assert exc.status_code == 200
        assert exc.body == {
            "type": "error",
            "error": {"type": "api_error", "message": "callback capability is unavailable"},
        }
    else:
        assert exc.status_code == 410
        assert exc.response.json() == {"detail": "callback capability is unavailable"}


def sse_events(text: str) -> list[tuple[str | None, str]]:
    """(event name, data) of each SSE frame; comment-only frames become (":", comment)."""
    events: list[tuple[str | None, str]] = []
    for frame in text.split("\n\n"):
        if not frame.strip():
            continue
        name: str | None = None
        data: list[str] = []
        comments: list[str] = []
        for line in frame.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
            elif line.startswith(":"):
                comments.append(line[1:].strip())
        events.append((name, "\n".join(data)) if name or data else (":", "\n".join(comments)))
    return events


@pytest.fixture
def trial(gateway: BridgeGateway, policy: ScriptedPolicy) -> Trial:
    return gateway.create_trial(policy.base_url, sampling_params=SAMPLING)


# ---- Chat Completions --------------------------------------------------------------------------------


def test_chat_completion(gateway: BridgeGateway, policy: ScriptedPolicy, trial: Trial) -> None:
    policy.enqueue(reply_tool_calls(WEATHER, text="Let me check.", reasoning="Needs a lookup."))
    completion = gateway.openai_client(trial.rollout_id).chat.completions.create(
        model="agent-picked-model",
        messages=USER,
        tools=CHAT_TOOLS,
        temperature=1.5,
        max_tokens=64,
    )

    [seen] = policy.model_requests()
    assert_forwarded(
        seen, trial, "chat/completions", temperature=0.3, max_tokens=64, messages=USER, tools=CHAT_TOOLS
    )
    assert not seen.stream
    choice = completion.choices[0]
    assert completion.model == trial.model  # Relax echoes the alias it was sent
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    assert (choice.message.model_extra or {})["reasoning_content"] == "Needs a lookup."
    [call] = choice.message.tool_calls or []
    assert call.type == "function"
    assert (call.id, call.function.name) == (WEATHER.id, "get_weather")
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "C"}
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.total_tokens) == (11, 18)


def test_chat_completion_stream(gateway: BridgeGateway, policy: ScriptedPolicy, trial: Trial) -> None:
    client = gateway.openai_client(trial.rollout_id)
    policy.enqueue(reply_text("Sunny, 21 C."))
    chunks = list(
        client.chat.completions.create(
            model="agent-model",
            messages=USER,
            temperature=1.5,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Sunny, 21 C."
    assert [c.choices[0].finish_reason for c in chunks if c.choices] == ["stop"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 7

    # The SDK's accumulating helper rebuilds tool calls from the one buffered chunk.
    policy.enqueue(reply_tool_calls(WEATHER))
    with client.chat.completions.stream(
        model="agent-model",
        messages=USER,
        tools=CHAT_TOOLS,
    ) as stream:
        final = stream.get_final_completion()
    [call] = final.choices[0].message.tool_calls or []
    assert (call.id, call.function.name, call.function.arguments) == (
        WEATHER.id,
        "get_weather",
        '{"city":"Paris","unit":"C"}',
    )
    assert final.choices[0].finish_reason == "tool_calls"

    first, second = policy.model_requests()
    assert_forwarded(first, trial, "chat/completions", temperature=0.3, stream=True)
    assert first.body["stream_options"] == {"include_usage": True}
    assert_forwarded(second, trial, "chat/completions", temperature=0.3, stream=True, tools=CHAT_TOOLS)


# ---- Responses ---------------------------------------------------------------------------------------


def test_responses_are_repaired_for_nemo_gym(
    gateway: BridgeGateway, policy: ScriptedPolicy, trial: Trial
) -> None:
    reply = reply_tool_calls(WEATHER, text="Checking.", reasoning="Weather needs a tool.")
    # Control: what Relax sends is not a valid NeMo Gym response on its own.
    with pytest.raises(pydantic.ValidationError):
        NeMoGymLikeResponse.model_validate(responses_object(reply, model=trial.model))

    policy.enqueue(reply)
    raw = gateway.openai_client(trial.rollout_id).responses.with_raw_response.create(
        model="agent-model",
        input="What is the weather in Paris?",
        tools=RESPONSES_TOOLS,
        parallel_tool_calls=False,
        temperature=1.5,
    )
    response = raw.parse()

    [seen] = policy.model_requests()
    assert_forwarded(
        seen,
        trial,
        "responses",
        temperature=0.3,
        input="What is the weather in Paris?",
        tools=RESPONSES_TOOLS,
        parallel_tool_calls=False,
    )
    NeMoGymLikeResponse.model_validate(json.loads(raw.text))
    assert response.model == trial.model
    assert response.output_text == "Checking."
    assert [item.type for item in response.output] == ["reasoning", "message", "function_call"]
    reasoning, _message, call = response.output
    assert reasoning.type == "reasoning"
    assert [(s.type, s.text) for s in reasoning.summary] == [("summary_text", "Weather needs a tool.")]
    assert call.type == "function_call"
    assert (call.call_id, call.name, json.loads(call.arguments)) == (
        WEATHER.id,
        "get_weather",
        {"city": "Paris", "unit": "C"},
    )
    # Filled from the request when Relax leaves them out.
    assert response.parallel_tool_calls is False
    assert response.tool_choice == "auto"
    assert [tool.name for tool in response.tools if tool.type == "function"] == ["get_weather"]
    assert response.usage is not None
    assert response.usage.input_tokens_details.cached_tokens == 0
    assert response.usage.output_tokens_details.reasoning_tokens == 0
    assert response.usage.total_tokens == 18


def test_responses_stream(gateway: BridgeGateway, policy: ScriptedPolicy, trial: Trial) -> None:
    client = gateway.openai_client(trial.rollout_id)
    policy.enqueue(reply_text("Sunny."))
    events = list(client.responses.create(model="agent-model", input="hi", temperature=1.5, stream=True))
    types = [event.type for event in events]
    assert types[0] == "response.created"
    assert types[-1] == "response.completed"
    assert "response.output_text.delta" in types
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == "Sunny."

    policy.enqueue(reply_tool_calls(WEATHER, text="One moment."))
    with client.responses.stream(
        model="agent-model",
        input="What is the weather in Paris?",
        tools=RESPONSES_TOOLS,
    ) as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert deltas == ["One moment."]
    assert final.output_text == "One moment."
    [call] = [item for item in final.output if item.type == "function_call"]
    assert (call.call_id, call.name) == (WEATHER.id, "get_weather")

    first, second = policy.model_requests()
    assert_forwarded(first, trial, "responses", temperature=0.3, stream=True, input="hi")
    assert_forwarded(second, trial, "responses", temperature=0.3, stream=True, tools=RESPONSES_TOOLS)


# ---- Anthropic Messages ------------------------------------------------------------------------------


def test_messages(gateway: BridgeGateway, policy: ScriptedPolicy, trial: Trial) -> None:
    policy.enqueue(reply_tool_calls(WEATHER, text="Let me look.", reasoning="Use the tool."))
    message = gateway.anthropic_client(trial.rollout_id).messages.create(
        model="claude-agent",
        max_tokens=256,
        system="Be brief.",
        messages=USER,
        tools=MESSAGES_TOOLS,
        extra_body={"temperature": 0.9},  # this SDK no longer types it; agents still send it
    )

    [seen] = policy.model_requests()
    assert_forwarded(
        seen, trial, "messages", temperature=0.3, max_tokens=256, system="Be brief.", tools=MESSAGES_TOOLS
    )
    assert message.model == trial.model
    assert message.stop_reason == "tool_use"
    assert [block.type for block in message.content] == ["thinking", "text", "tool_use"]
    thinking, text, tool_use = message.content
    assert thinking.type == "thinking" and thinking.thinking == "Use the tool."
    assert text.type == "text" and text.text == "Let me look."
    assert tool_use.type == "tool_use"
    assert (tool_use.id, tool_use.name, tool_use.input) == (
        WEATHER.id,
        "get_weather",
        {"city": "Paris", "unit": "C"},
    )
    assert (message.usage.input_tokens, message.usage.output_tokens) == (11, 7)


def test_messages_stream(gateway: BridgeGateway, policy: ScriptedPolicy, trial: Trial) -> None:
    client = gateway.anthropic_client(trial.rollout_id)
    policy.enqueue(reply_tool_calls(WEATHER, text="Let me look."))
    with client.messages.stream(
        model="claude-agent",
        max_tokens=128,
        messages=USER,
        tools=MESSAGES_TOOLS,
        extra_body={"temperature": 0.9},  # this SDK no longer types it; agents still send it
    ) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert texts == ["Let me look."]
    assert final.stop_reason == "tool_use"
    tool_use = final.content[-1]
    assert tool_use.type == "tool_use"
    assert (tool_use.id, tool_use.input) == (WEATHER.id, {"city": "Paris", "unit": "C"})

    policy.enqueue(reply_text("Sunny."))
    events = list(
        client.messages.create(
            model="claude-agent",
            max_tokens=128,
            messages=USER,
            stream=True,
        )
    )
    types = [event.type for event in events]  # the SDK drops pings
    assert types == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]

    first, second = policy.model_requests()
    assert_forwarded(first, trial, "messages", temperature=0.3, stream=True, max_tokens=128)
    assert_forwarded(second, trial, "messages", temperature=0.3, stream=True)


def test_messages_stream_pings_before_the_upstream_answers(
    gateway_factory: Any, policy: ScriptedPolicy
) -> None:
    # No periodic ping could arrive during the test: the first one must be the immediate one.
    gateway = gateway_factory(keepalive_s=3600)
    trial = gateway.create_trial(policy.base_url)
    gate = Gate()
    policy.enqueue(reply_text("after the gate").held(gate))
    body = {"model": "claude-agent", "max_tokens": 8, "messages": USER, "stream": True}
    url = f"/ng-rollout/{trial.rollout_id}/v1/messages"
    with gateway.http.stream("POST", url, json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        lines = response.iter_lines()
        # Read while the upstream call is still held: the ping cannot come from the upstream answer.
        assert [next(lines), next(lines), next(lines)] == ["event: ping", 'data: {"type":"ping"}', ""]
        policy.wait_for_requests(1)
        assert not gate.is_open
        gate.open()
        rest = "\n".join(lines) + "\n"
    names = [name for name, _data in sse_events(rest)]
    # Then Relax's own buffered stream, verbatim (it starts with Relax's ping).
    assert names == [
        "ping",
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert "after the gate" in rest


def test_messages_stream_keeps_pinging_while_the_upstream_works(
    gateway_factory: Any, policy: ScriptedPolicy
) -> None:
    gateway = gateway_factory(keepalive_s=0.01)
    trial = gateway.create_trial(policy.base_url)
    gate = Gate()
    policy.enqueue(reply_text("done").held(gate))
    body = {"model": "claude-agent", "max_tokens": 8, "messages": USER, "stream": True}
    with gateway.http.stream("POST", f"/ng-rollout/{trial.rollout_id}/v1/messages", json=body) as response:
        lines = response.iter_lines()
        pings = [next(lines) for _ in range(9)]  # three ping frames while the answer is held
        gate.open()
        rest = "\n".join(lines)
    assert pings == ["event: ping", 'data: {"type":"ping"}', ""] * 3
    assert "event: message_stop" in rest


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        pytest.param(
            reply_error(400, "prompt is too long: 40000 tokens > 32768 maximum"),
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "prompt is too long: 40000 tokens > 32768 maximum",
                },
            },
            id="anthropic-error-verbatim",
        ),
        pytest.param(
            reply_json(404, {"error": {"message": "session discarded", "code": "session_discarded"}}),
            {"type": "error", "error": {"type": "api_error", "message": "Upstream model callback failed"}},
            id="other-json-error",
        ),
        pytest.param(
            reply_raw(400, "<html>Bad Request</html>", content_type="text/html"),
            {
                "type": "error",
                "error": {
                    "type": "api_error",
                    "message": "Upstream model callback returned a non-JSON response",
                },
            },
            id="non-json-error",
        ),
        pytest.param(
            reply_json(200, {"type": "message", "content": []}),
            {
                "type": "error",
                "error": {
                    "type": "api_error",
                    "message": "Upstream model callback returned a non-SSE response",
                },
            },
            id="json-instead-of-sse",
        ),
    ],
)
def test_messages_stream_upstream_error_is_in_band(
    gateway: BridgeGateway,
    policy: ScriptedPolicy,
    trial: Trial,
    reply: ScriptedReply,
    expected: dict[str, Any],
) -> None:
    policy.enqueue(reply)
    body = {"model": "claude-agent", "max_tokens": 8, "messages": USER, "stream": True}
    response = gateway.http.post(f"/ng-rollout/{trial.rollout_id}/v1/messages", json=body)
    assert response.status_code == 200
    assert sse_events(response.text) == [
        ("ping", '{"type":"ping"}'),
        ("error", json.dumps(expected, separators=(",", ":"))),
    ]

    policy.enqueue(reply)
    with (
        pytest.raises(sdks.anthropic.APIStatusError) as info,
        gateway.anthropic_client(trial.rollout_id).messages.stream(
            model="claude-agent",
            max_tokens=8,
            messages=USER,
        ) as stream,
    ):
        stream.get_final_message()
    assert info.value.body == expected
    assert expected["error"]["message"] in str(info.value)


# ---- the un-prefixed form (capability in metadata) ----------------------------------------------------


def test_unprefixed_call_carries_the_capability_in_metadata(
    gateway: BridgeGateway, policy: ScriptedPolicy, trial: Trial
) -> None:
    client = sdks.openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=AGENT_KEY, max_retries=0)
    with client:
        response = client.responses.create(
            model="agent-model", input="hi", metadata={ROLLOUT_TAG: trial.rollout_id, "keep": "x"}
        )
        assert response.output_text == "ok"
        assert response.metadata in (None, {})  # Relax does not echo metadata; the tag surely not
        completion = client.chat.completions.create(
            model="agent-model",
            messages=USER,
            metadata={ROLLOUT_TAG: trial.rollout_id},
        )
        assert completion.choices[0].message.content == "ok"

        with pytest.raises(sdks.openai.NotFoundError):  # no capability at all
            client.responses.create(model="agent-model", input="hi", metadata={"keep": "x"})
        with pytest.raises(sdks.openai.APIStatusError) as info:  # a capability nobody holds
            client.responses.create(model="agent-model", input="hi", metadata={ROLLOUT_TAG: "0" * 32 + "-0"})
        assert_unavailable(info.value, "responses", stream=False)

    first, second = policy.model_requests()
    assert_forwarded(first, trial, "responses", temperature=0.3, metadata={"keep": "x"})
    assert_forwarded(second, trial, "chat/completions", temperature=0.3)
    assert "metadata" not in second.body  # only the tag was there


# ---- capability lifetime -----------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("resource", RESOURCES)
def test_unknown_rollout_is_gone(
    gateway: BridgeGateway, policy: ScriptedPolicy, resource: str, stream: bool
) -> None:
    gateway.create_trial(policy.base_url)  # a live trial exists; its capability is not this one
    with pytest.raises((sdks.openai.APIStatusError, sdks.anthropic.APIStatusError)) as info:
        sdk_call(gateway, "f" * 32 + "-0", resource, stream=stream)
    assert_unavailable(info.value, resource, stream)
    assert policy.requests == []


def test_aborted_trial_is_gone(gateway: BridgeGateway, policy: ScriptedPolicy, trial: Trial) -> None:
    assert sdk_call(gateway, trial.rollout_id, "chat/completions") == "ok"
    gateway.abort(trial)
    for resource in RESOURCES:
        for stream in (False, True):
            with pytest.raises((sdks.openai.APIStatusError, sdks.anthropic.APIStatusError)) as info:
                sdk_call(gateway, trial.rollout_id, resource, stream=stream)
            assert_unavailable(info.value, resource, stream)
    assert len(policy.requests) == 1  # nothing after the abort reached the policy


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("resource", "stream"),
    [("chat/completions", False), ("responses", True), ("messages", False), ("messages", True)],
)
async def test_abort_cancels_an_in_flight_call(
    gateway: BridgeGateway, policy: ScriptedPolicy, trial: Trial, resource: str, stream: bool
) -> None:
    gate = Gate()  # never opened before the abort: the upstream call is still running when it lands
    policy.enqueue(reply_text("too late").held(gate))
    call = asyncio.ensure_future(
        asyncio.to_thread(sdk_call, gateway, trial.rollout_id, resource, stream=stream)
    )
    await policy.wait_for_requests_async(1)
    gateway.abort(trial)
    with pytest.raises((sdks.openai.APIStatusError, sdks.anthropic.APIStatusError)) as info:
        await call
    assert_unavailable(info.value, resource, stream, in_flight=True)
    assert not gate.is_open


# ---- errors, status passthrough ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("resource", "stream"),
    # (A Messages stream is committed to 200 first: see test_messages_stream_upstream_error_is_in_band.)
    [
        ("chat/completions", False),
        ("chat/completions", True),
        ("responses", False),
        ("responses", True),
        ("messages", False),
    ],
)
def test_upstream_400_reaches_the_sdk(
    gateway: BridgeGateway, policy: ScriptedPolicy, trial: Trial, resource: str, stream: bool
) -> None:
    message = "This model's maximum context length is 32768 tokens."
    policy.enqueue(reply_error(400, message, code="context_length_exceeded", param="messages"))
    with pytest.raises((sdks.openai.BadRequestError, sdks.anthropic.BadRequestError)) as info:
        sdk_call(gateway, trial.rollout_id, resource, stream=stream)
    error = info.value
    assert isinstance(error, (sdks.openai.BadRequestError, sdks.anthropic.BadRequestError))
    assert error.status_code == 400
    assert message in str(error)
    if isinstance(error, sdks.openai.BadRequestError):
        assert (error.code, error.param, error.type) == (
            "context_length_exceeded",
            "messages",
            "invalid_request_error",
        )
    else:
        assert error.body == {"type": "error", "error": {"type": "invalid_request_error", "message": message}}


@pytest.mark.parametrize("resource", ["chat/completions", "messages"])
def test_relax_no_retry_hint_reaches_the_sdk(
    gateway: BridgeGateway, policy: ScriptedPolicy, trial: Trial, resource: str
) -> None:
    """Relax answers a turn it may already have recorded with 500 + `x-should-retry: false`; the bridge does
    not retry it, and an agent SDK with its default retries must not replay it either (a replay forks the
    session's history)."""
    rendering = reply_error(
        500,
        "Internal error while rendering agentic response.",
        type="internal_error",
        code="internal_error",
        headers={"x-should-retry": "false"},
    )

    def call(base_url: str, api_key: str) -> None:
        if resource == "chat/completions":
            openai = sdks.openai
            with openai.OpenAI(base_url=f"{base_url}/v1", api_key=api_key, timeout=SDK_TIMEOUT_S) as client:
                client.chat.completions.create(model="m", messages=USER)
        else:
            anthropic = sdks.anthropic
            with anthropic.Anthropic(base_url=base_url, api_key=api_key, timeout=SDK_TIMEOUT_S) as client:
                client.messages.create(model="m", max_tokens=8, messages=USER)

    # Control: an SDK talking to Relax directly obeys the hint and makes exactly one call.
    policy.enqueue(rendering, reply_text("replayed"))
    with pytest.raises((sdks.openai.InternalServerError, sdks.anthropic.InternalServerError)):
        call(policy.base_url, trial.token)
    assert len(policy.requests) == 1
    policy.clear()

    policy.enqueue(rendering, reply_text("replayed"))
    error: Exception | None = None
    try:
        call(f"{gateway.url}/ng-rollout/{trial.rollout_id}", AGENT_KEY)
    except (sdks.openai.InternalServerError, sdks.anthropic.InternalServerError) as exc:
        error = exc
    replays = len(policy.requests) - 1
    assert replays == 0, (
        f"the agent SDK replayed the rendering-error turn {replays} time(s) through the bridge"
    )
    assert isinstance(error, (sdks.openai.InternalServerError, sdks.anthropic.InternalServerError))
    assert error.response.headers.get("x-should-retry") == "false"


def test_upstream_rejecting_the_session_token_is_a_401(gateway: BridgeGateway) -> None:
    with run_policy(require_token="the-real-session") as policy:
        good = gateway.create_trial(policy.base_url, token="the-real-session")
        stale = gateway.create_trial(policy.base_url, token="a-finished-session")
        assert sdk_call(gateway, good.rollout_id, "chat/completions") == "ok"
        with pytest.raises(sdks.openai.AuthenticationError) as info:
            sdk_call(gateway, stale.rollout_id, "responses")
        assert info.value.status_code == 401
        with pytest.raises(sdks.anthropic.AuthenticationError):
            sdk_call(gateway, stale.rollout_id, "messages")
        assert [r.bearer for r in policy.requests] == [
            "the-real-session",
            "a-finished-session",
            "a-finished-session",
        ]


# ---- upstream URL and headers ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("suffix", "query"),
    [("", ""), ("/", ""), ("/v1", ""), ("/v1/", ""), ("?tenant=a", "tenant=a"), ("/v1?tenant=a", "tenant=a")],
)
def test_upstream_url_rule(gateway: BridgeGateway, policy: ScriptedPolicy, suffix: str, query: str) -> None:
    trial = gateway.create_trial(policy.base_url + suffix)
    for resource in RESOURCES:
        assert sdk_call(gateway, trial.rollout_id, resource) == "ok"
    assert [(r.path, r.query) for r in policy.requests] == [
        (f"/agentic_api/v1/{resource}", query) for resource in RESOURCES
    ]


def test_custom_auth_header_and_extra_headers(gateway: BridgeGateway, policy: ScriptedPolicy) -> None:
    trial = gateway.create_trial(
        policy.base_url,
        token="sess-7",
        api_key_header="X-Relax-Session",
        api_key_prefix="",
        headers={"X-Trace-Id": "trace-1"},
    )
    for resource in RESOURCES:
        assert sdk_call(gateway, trial.rollout_id, resource) == "ok"
    for seen in policy.requests:
        assert seen.headers["x-relax-session"] == "sess-7"
        assert seen.headers["x-trace-id"] == "trace-1"
        assert "authorization" not in seen.headers  # the agent's Bearer agent-side-key is dropped
        assert "x-api-key" not in seen.headers


# ---- keep-alive path of Chat / Responses streams ------------------------------------------------------


@pytest.mark.parametrize("resource", ["chat/completions", "responses"])
def test_slow_openai_stream_commits_and_keeps_alive(
    gateway_factory: Any, policy: ScriptedPolicy, resource: str
) -> None:
    """Past the keep-alive interval a Chat/Responses stream is committed (200, SSE comments), and the
    upstream answer or error then arrives in-band; the openai SDK parses both."""
    gateway = gateway_factory(keepalive_s=0.01)
    trial = gateway.create_trial(policy.base_url)
    gate = Gate()
    policy.enqueue(reply_text("slow answer").held(gate))
    body: dict[str, Any] = {"model": "m", "stream": True}
    body.update({"messages": USER} if resource == "chat/completions" else {"input": "hi"})
    with gateway.http.stream("POST", f"/ng-rollout/{trial.rollout_id}/v1/{resource}", json=body) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        assert [next(lines), next(lines)] == [": keep-alive", ""]
        gate.open()
        rest = "\n".join(lines)
    assert "slow answer" in rest

    # Each gate opens only once the SDK has the response headers: the stream was committed before the
    # upstream answered, whatever the scheduling.
    gates: list[Gate] = []

    def open_gate(_response: Any) -> None:
        gates.pop(0).open()

    http_client = sdks.openai.DefaultHttpxClient(event_hooks={"response": [open_gate]})
    with sdks.openai.OpenAI(
        base_url=f"{gateway.url}/ng-rollout/{trial.rollout_id}/v1",
        api_key=AGENT_KEY,
        max_retries=0,
        timeout=SDK_TIMEOUT_S,
        http_client=http_client,
    ) as client:

        def stream_text() -> str:
            if resource == "chat/completions":
                chunks = client.chat.completions.create(model="m", messages=USER, stream=True)
                return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            with client.responses.stream(model="m", input="hi") as events:
                return events.get_final_response().output_text

        gates.append(Gate())
        policy.enqueue(reply_text("slow again").held(gates[0]))
        assert stream_text() == "slow again"

        gates.append(Gate())
        policy.enqueue(reply_error(400, "context too long", code="context_length_exceeded").held(gates[0]))
        with pytest.raises(sdks.openai.APIError) as info:
            stream_text()
        assert not isinstance(info.value, sdks.openai.APIStatusError)  # in-band, not an HTTP 400
        assert info.value.message == "context too long"
        assert info.value.body == {
            "message": "context too long",
            "type": "invalid_request_error",
            "param": None,
            "code": "context_length_exceeded",
        }


# ---- two trials at once ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_concurrent_trials_never_cross(gateway: BridgeGateway, policy: ScriptedPolicy) -> None:
    trials = [
        gateway.create_trial(
            policy.base_url, token="session-a", model="alias-a", sampling_params={"seed": 1}
        ),
        gateway.create_trial(
            policy.base_url, token="session-b", model="alias-b", sampling_params={"seed": 2}
        ),
    ]
    gate = Gate()

    def script(request: RecordedRequest) -> ScriptedReply:
        return ModelReply(text=f"{request.bearer}|{request.model}", gate=gate)

    policy.script = script
    openai_clients = [gateway.async_openai_client(t.rollout_id) for t in trials]
    anthropic_clients = [gateway.async_anthropic_client(t.rollout_id) for t in trials]

    async def call(i: int) -> str:
        marker = f"call-{i}"
        stream = i % 4 == 3
        resource = RESOURCES[i % 3]
        if resource == "chat/completions":
            chat = openai_clients[i % 2].chat.completions
            messages: Any = [{"role": "user", "content": marker}]
            if stream:
                chunks = await chat.create(model="m", messages=messages, stream=True)
                return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
            return (await chat.create(model="m", messages=messages)).choices[0].message.content or ""
        if resource == "responses":
            responses = openai_clients[i % 2].responses
            if stream:
                async with responses.stream(model="m", input=marker) as events:
                    return (await events.get_final_response()).output_text
            return (await responses.create(model="m", input=marker)).output_text
        messages_api = anthropic_clients[i % 2].messages
        content: Any = [{"role": "user", "content": marker}]
        if stream:
            async with messages_api.stream(model="c", max_tokens=8, messages=content) as events:
                final = await events.get_final_message()
        else:
            final = await messages_api.create(model="c", max_tokens=8, messages=content)
        return "".join(block.text for block in final.content if block.type == "text")

    async def release() -> None:
        await policy.wait_for_requests_async(20)  # all 20 are in flight at once before any answer
        gate.open()

    try:
        *answers, _ = await asyncio.gather(*(call(i) for i in range(20)), release())
    finally:
        for client in openai_clients:
            await client.close()
        for aclient in anthropic_clients:
            await aclient.close()

    for i, answer in enumerate(answers):
        owner = trials[i % 2]
        assert answer == f"{owner.token}|{owner.model}", i
    seen = policy.model_requests()
    assert len(seen) == 20
    for request in seen:
        [i] = [i for i in range(20) if f'"call-{i}"' in request.raw_body.decode()]
        owner = trials[i % 2]
        assert_forwarded(request, owner, RESOURCES[i % 3], seed=1 + i % 2)
