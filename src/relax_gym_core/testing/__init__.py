"""Public test support: run a real gateway process, a scripted Relax policy server, and (later) the plugin
conformance kit."""

from relax_gym_core.testing.contract import (
    ConformanceError,
    check_conversion,
    check_probes,
    check_registration,
    check_result_mapping,
)
from relax_gym_core.testing.observer import RecordingObserver
from relax_gym_core.testing.policy import (
    ErrorReply,
    Gate,
    ModelReply,
    RawReply,
    RecordedRequest,
    ScriptedPolicy,
    ScriptedReply,
    ThreadedServer,
    ToolCall,
    reply_error,
    reply_json,
    reply_raw,
    reply_text,
    reply_tool_calls,
    run_policy,
    serve_in_thread,
)
from relax_gym_core.testing.processes import GatewayProcess, start_gateway, start_up
from relax_gym_core.testing.strategies import corrupted_rows, create_requests, json_values, snapshots

__all__ = [
    "ConformanceError",
    "ErrorReply",
    "Gate",
    "GatewayProcess",
    "ModelReply",
    "RawReply",
    "RecordedRequest",
    "RecordingObserver",
    "ScriptedPolicy",
    "ScriptedReply",
    "ThreadedServer",
    "ToolCall",
    "check_conversion",
    "check_probes",
    "check_registration",
    "check_result_mapping",
    "corrupted_rows",
    "create_requests",
    "json_values",
    "reply_error",
    "reply_json",
    "reply_raw",
    "reply_text",
    "reply_tool_calls",
    "run_policy",
    "serve_in_thread",
    "snapshots",
    "start_gateway",
    "start_up",
]
