"""What the gsm8k and math_with_judge environments are: upstream's math_with_judge resources server (our
subclass, verifier.py: an answer math-verify did not decide fails the trial, never a reward of 0) and
simple_agent, under the names Relax launch scripts use, with the limits of the relax-nemo-gym/v1 recipes.

Both are stateless (the verifier reads the answer out of the final message and keeps nothing), so their
cleanup contract is STATELESS. Upstream's benchmarks/gsm8k config clones math_with_judge under its own
server names; so do we, so `relax-gym up gsm8k math_with_judge` runs two independent pairs.
"""

from __future__ import annotations

from relax_gym_core.plugin import EnvironmentDefinition, NemoGymServer

from relax_gym_gsm8k.judge import JudgeSettings, resources_config

GSM8K = "gsm8k"
MATH = "math_with_judge"
ENVIRONMENTS = (GSM8K, MATH)
# Upstream's math_with_judge server, but an answer math-verify did not decide fails /verify (verifier.py).
RESOURCES_CLASS = "relax_gym_gsm8k.verifier:DecidedMathResourcesServer"
AGENT_CLASS = "responses_api_agents.simple_agent.app:SimpleAgent"

GSM8K_RESOURCES = "gsm8k_math_with_judge_resources_server"
GSM8K_AGENT = "gsm8k_math_with_judge_simple_agent"
MATH_RESOURCES = "math_with_judge"
MATH_AGENT = "math_with_judge_simple_agent"


def _resources(name: str, judge: JudgeSettings | None, verify_timeout: float | None) -> NemoGymServer:
    return NemoGymServer(
        name=name,
        kind="resources_servers",
        implementation="math_with_judge",
        server_class=RESOURCES_CLASS,
        config=resources_config(judge, verify_timeout=verify_timeout),
    )


def _agent(name: str, resources: str) -> NemoGymServer:
    return NemoGymServer(
        name=name,
        kind="responses_api_agents",
        implementation="simple_agent",
        server_class=AGENT_CLASS,
        config={
            # One model call per trial. Upstream leaves max_steps unset (unlimited), and a reply with
            # neither a message nor a tool call (reasoning only) would then loop forever.
            "max_steps": 1,
            "resources_server": {"type": "resources_servers", "name": resources},
            "model_server": {"type": "responses_api_models", "name": "policy_model"},
        },
    )


def definitions(
    judge: JudgeSettings | None = None, verify_timeout: float | None = None
) -> tuple[EnvironmentDefinition, ...]:
    """Both environments; with a judge, each resources server calls the judge's own model server;
    `verify_timeout` bounds one math-verify check (None: upstream's default)."""
    extra = (judge.server(),) if judge is not None else ()
    gsm8k = EnvironmentDefinition(
        name=GSM8K,
        configs=("gsm8k-v1",),
        agent=GSM8K_AGENT,
        servers=(
            _resources(GSM8K_RESOURCES, judge, verify_timeout),
            _agent(GSM8K_AGENT, GSM8K_RESOURCES),
            *extra,
        ),
        description=(
            "GSM8K grade-school math on NeMo Gym's math_with_judge: the boxed answer checked by "
            "math-verify (stateless, one model call per trial)."
        ),
        max_deadline_s=1800.0,
        max_concurrency=8,
        queue_capacity=32,
    )
    math = EnvironmentDefinition(
        name=MATH,
        configs=("math-with-judge-v1",),
        agent=MATH_AGENT,
        servers=(
            _resources(MATH_RESOURCES, judge, verify_timeout),
            _agent(MATH_AGENT, MATH_RESOURCES),
            *extra,
        ),
        description=(
            "NeMo Gym math_with_judge: a boxed final answer checked by math-verify, LLM judge optional "
            "(stateless, one model call per trial)."
        ),
        max_deadline_s=1800.0,
        max_concurrency=256,
        queue_capacity=1024,
    )
    return (gsm8k, math)
