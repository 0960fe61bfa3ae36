"""relax-nemo-gym/v1: wire types, the bridge's wire names, the one converter, strict JSON. Imports no web
framework."""

from relax_gym_core.protocol.bridge import (
    BRIDGE_PREFIX,
    ROLLOUT_INDEX,
    ROLLOUT_TAG,
    TASK_INDEX,
    bridge_url,
    run_indices,
    tag_of,
)
from relax_gym_core.protocol.converter import (
    converter,
    parse_create_request,
    parse_snapshot,
    request_to_wire,
    structure,
    unknown_keys,
    unstructure,
)
from relax_gym_core.protocol.types import (
    PROTOCOL_VERSION,
    CleanupState,
    CreateTrialRequest,
    EnvironmentRef,
    ErrorBody,
    Generation,
    InterruptPolicy,
    ModelEndpoint,
    ServiceHealth,
    SessionInfo,
    TrialSnapshot,
    TrialStatus,
)

__all__ = [
    "BRIDGE_PREFIX",
    "PROTOCOL_VERSION",
    "ROLLOUT_INDEX",
    "ROLLOUT_TAG",
    "TASK_INDEX",
    "CleanupState",
    "CreateTrialRequest",
    "EnvironmentRef",
    "ErrorBody",
    "Generation",
    "InterruptPolicy",
    "ModelEndpoint",
    "ServiceHealth",
    "SessionInfo",
    "TrialSnapshot",
    "TrialStatus",
    "bridge_url",
    "converter",
    "parse_create_request",
    "parse_snapshot",
    "request_to_wire",
    "run_indices",
    "structure",
    "tag_of",
    "unknown_keys",
    "unstructure",
]
