"""The thin client Relax runs per agentic session, and its importable async API.

Imports only the protocol, the error tree, httpx and anyio: Relax loads it in its own interpreter.
"""

from relax_gym_core.client.exceptions import (
    ClientConfigError,
    RemoteTrialError,
    TrialCancelledError,
    TrialGoneError,
)
from relax_gym_core.client.http import GatewayClient
from relax_gym_core.client.output import build_output, check_terminal, write_output
from relax_gym_core.client.settings import ClientOptions, ClientSettings
from relax_gym_core.client.trial import run_trial
from relax_gym_core.client.trial_request import (
    build_create_request,
    check_session_input,
    read_session_input,
    resolve_route,
    stable_request_id,
)

__all__ = [
    "ClientConfigError",
    "ClientOptions",
    "ClientSettings",
    "GatewayClient",
    "RemoteTrialError",
    "TrialCancelledError",
    "TrialGoneError",
    "build_create_request",
    "build_output",
    "check_session_input",
    "check_terminal",
    "read_session_input",
    "resolve_route",
    "run_trial",
    "stable_request_id",
    "write_output",
]
