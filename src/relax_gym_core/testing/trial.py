"""The conformance kit's real trial: one known-good probe row through the environment's own agent, as Relax
runs it (`relax-gym up`, the gateway, the bridge), its model calls answered by the oracle (the probe's known
output), so the wiring, the /run body and the result mapping are tested, not only /verify.

Needs the gateway's web stack (the oracle is a real HTTP server): imported by the kit's test when it runs.
"""

from __future__ import annotations

import secrets

import anyio

from relax_gym_core.client import ClientOptions, GatewayClient, run_trial
from relax_gym_core.plugin import VerifierProbe
from relax_gym_core.plugin.host import Hooks, converted_row
from relax_gym_core.policies.oracle import OracleScript
from relax_gym_core.policies.server import ScriptedPolicy
from relax_gym_core.protocol import (
    PROTOCOL_VERSION,
    CreateTrialRequest,
    EnvironmentRef,
    ModelEndpoint,
    SessionInfo,
    TrialSnapshot,
)
from relax_gym_core.testing.contract import ConformanceError

DEADLINE_S = 600.0  # a bound for a hung environment, not a timing


def known_good(hooks: Hooks, environment: str) -> VerifierProbe:
    """The environment's first probe the oracle can play that its verifier scores 1.0."""
    probes = [p for p in hooks.environments.get(environment).verifier_probes() if p.skip is None]
    for probe in probes:
        if probe.expected_reward == 1.0:
            return probe
    raise ConformanceError(
        f"environment {environment!r} has no verifier probe expecting 1.0 to play as a trial"
    )


def check_trial(hooks: Hooks, environment: str, gateway_url: str) -> TrialSnapshot:
    """One trial of the known-good probe row through the gateway at `gateway_url` (which runs the
    environment): it must complete with the probe's reward. Returns its final snapshot."""
    definition = hooks.environments.get(environment)
    probe = known_good(hooks, environment)
    row = converted_row(definition, dict(probe.row))
    token = f"kit-{secrets.token_hex(8)}"
    with ScriptedPolicy(OracleScript([probe]), require_token=token) as policy:
        request = CreateTrialRequest(
            protocol_version=PROTOCOL_VERSION,
            request_id=f"kit-{environment}-{secrets.token_hex(8)}",
            session=SessionInfo(session_id=token, group_id="kit", rollout_mode="eval"),
            environment=EnvironmentRef(
                name=environment,
                config=definition.configs[0],
                task={"messages": row["input"], "metadata": row["metadata"]},
            ),
            model_endpoint=ModelEndpoint(base_url=policy.base_url, api_key=token, model="oracle"),
            interrupt_policy=definition.interrupt_policy,
            deadline_s=min(DEADLINE_S, definition.max_deadline_s),
            lease_s=min(300.0, definition.max_deadline_s),
        )

        async def trial() -> TrialSnapshot:
            async with GatewayClient(gateway_url, options=ClientOptions(poll_interval_s=0.05)) as client:
                return await run_trial(request, client=client)

        try:
            snapshot = anyio.run(trial)
        except Exception as exc:  # the trial failed: the kit's finding, said in one line
            raise ConformanceError(
                f"environment {environment!r}: probe {probe.name!r} as a real trial did not complete: {exc}"
            ) from exc
    if snapshot.reward != probe.expected_reward:
        raise ConformanceError(
            f"environment {environment!r}: probe {probe.name!r} as a real trial scored {snapshot.reward!r}, "
            f"its verifier {probe.expected_reward!r} (the /run body or the result mapping is not /verify's)"
        )
    return snapshot
