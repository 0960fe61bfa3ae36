"""The callback bridge: every model call of a trial reaches exactly that trial's Relax session."""

from relax_gym_core.bridge.allowlist import CallbackPolicy, upstream_url
from relax_gym_core.bridge.payloads import ROLLOUT_TAG
from relax_gym_core.bridge.routes import Bridge, match_model_call
from relax_gym_core.bridge.upstream import (
    UPSTREAM_CLIENTS,
    AiohttpUpstream,
    Forwarder,
    HttpxUpstream,
    PyreqwestUpstream,
    UpstreamClient,
    UpstreamReply,
)

__all__ = [
    "ROLLOUT_TAG",
    "UPSTREAM_CLIENTS",
    "AiohttpUpstream",
    "Bridge",
    "CallbackPolicy",
    "Forwarder",
    "HttpxUpstream",
    "PyreqwestUpstream",
    "UpstreamClient",
    "UpstreamReply",
    "match_model_call",
    "upstream_url",
]
