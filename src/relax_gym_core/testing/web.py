"""The web half of the test support: a scripted policy server and real relax-gym processes.

Kept out of ``relax_gym_core.testing`` so that package (and the pytest plugin that loads it) imports with
the light core plus hypothesis: Relax installs ``relax-gym-core`` without the gateway extra. Importing this
module needs the gateway extra (Starlette, uvicorn).
"""

from relax_gym_core.policies.server import PolicyByToken, ScriptedPolicy, run_policy
from relax_gym_core.policies.threaded import ThreadedServer, serve_in_thread
from relax_gym_core.testing.processes import GatewayProcess, run_cli, start_gateway, start_up

__all__ = [
    "GatewayProcess",
    "PolicyByToken",
    "ScriptedPolicy",
    "ThreadedServer",
    "run_cli",
    "run_policy",
    "serve_in_thread",
    "start_gateway",
    "start_up",
]
