"""Public test support for relax-gym and its plugins: the conformance kit (and EnvironmentContract, the kit
as a test class), Hypothesis strategies, scripted model replies, oracle scripts and replays of recorded
trajectories (relax_gym_core.policies, re-exported), and a recording observer. A plugin's tests also get the
plugin manager here (make_plugin_manager, Hooks, plugin_hooks) and the host's conversion check
(converted_row), re-exported from relax_gym_core.plugin.host, which plugins and their tests never import.

Importable with the light core plus hypothesis (no web stack). The scripted policy server and real
gateway processes live in ``relax_gym_core.testing.web`` (needs the gateway extra).
"""

from relax_gym_core.plugin.host import Hooks, converted_row, make_plugin_manager
from relax_gym_core.policies.oracle import OracleScript
from relax_gym_core.policies.replay import ReplayPlan
from relax_gym_core.policies.replies import (
    ErrorReply,
    Gate,
    ModelReply,
    RawReply,
    RecordedRequest,
    ScriptedReply,
    ToolCall,
    reply_error,
    reply_json,
    reply_raw,
    reply_text,
    reply_tool_calls,
)
from relax_gym_core.testing.contract import (
    REFERENCE_NORMALISED,
    ConformanceError,
    check_conversion,
    check_probes,
    check_registration,
    check_result_mapping,
)
from relax_gym_core.testing.observer import RecordingObserver
from relax_gym_core.testing.strategies import corrupted_rows, create_requests, json_values, snapshots
from relax_gym_core.testing.suite import EnvironmentContract, plugin_hooks, unscored_answers

__all__ = [
    "REFERENCE_NORMALISED",
    "ConformanceError",
    "EnvironmentContract",
    "ErrorReply",
    "Gate",
    "Hooks",
    "ModelReply",
    "OracleScript",
    "RawReply",
    "RecordedRequest",
    "RecordingObserver",
    "ReplayPlan",
    "ScriptedReply",
    "ToolCall",
    "check_conversion",
    "check_probes",
    "check_registration",
    "check_result_mapping",
    "converted_row",
    "corrupted_rows",
    "create_requests",
    "json_values",
    "make_plugin_manager",
    "plugin_hooks",
    "reply_error",
    "reply_json",
    "reply_raw",
    "reply_text",
    "reply_tool_calls",
    "snapshots",
    "unscored_answers",
]
