"""The gsm8k and math_with_judge environments (entry point ``gsm8k``): upstream's math_with_judge resources
server (our subclass, verifier.py: an answer math-verify did not decide fails the trial, never a reward of
0) and simple_agent, under the names Relax launch scripts use, with the limits of the relax-nemo-gym/v1
recipes.

Both are stateless (the verifier reads the answer out of the final message and keeps nothing), one model
call per trial. Upstream's benchmarks/gsm8k config clones math_with_judge under its own server names; so
do we, so `relax-gym up gsm8k math_with_judge` runs two independent pairs. What differs from the
reference: rows and run bodies are checked and their expected answer becomes the string upstream requires
(rows.py, answers.py), probes box the real rows' answers (probes.py), and a result carries the verifier's
own figures. The optional judge and the math-verify bound (judge.py) are read when the plugin registers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from relax_gym_core.gym.installed import example_rows as installed_rows
from relax_gym_core.plugin import (
    STATELESS,
    EnvironmentDefinition,
    EnvironmentRegistrar,
    JudgeEndpoint,
    NemoGymServer,
    RunResult,
    VerifierProbe,
    hookimpl,
    reference,
    resources_server,
    simple_agent,
)
from relax_gym_core.protocol import Generation

from relax_gym_gsm8k import probes, rows
from relax_gym_gsm8k.answers import is_number_text
from relax_gym_gsm8k.judge import JUDGE_SERVER, judge_settings, resources_config, verify_timeout_s

GSM8K = "gsm8k"
MATH = "math_with_judge"
ENVIRONMENTS = (GSM8K, MATH)
# Upstream's math_with_judge server, but an answer math-verify did not decide fails /verify (verifier.py).
RESOURCES_CLASS = "relax_gym_gsm8k.verifier:DecidedMathResourcesServer"

GSM8K_RESOURCES = "gsm8k_math_with_judge_resources_server"
GSM8K_AGENT = "gsm8k_math_with_judge_simple_agent"
MATH_RESOURCES = "math_with_judge"
MATH_AGENT = "math_with_judge_simple_agent"

PACKAGE = "resources_servers.math_with_judge"  # upstream's example rows: data/example.jsonl, read in place


def example_rows() -> list[dict[str, Any]]:
    """math_with_judge's 5 upstream example rows (OpenMathReasoning, prompted with the generic math prompt,
    answers such as "32" and ``\\(\\frac{333}{1997}\\)``), raw, fresh objects on every call."""
    return installed_rows(PACKAGE)


def numeric_example_rows() -> dict[int, dict[str, Any]]:
    """The example rows whose expected answer is a plain number (what a gsm8k answer is), by index.

    GSM8K itself ships no rows (its prepare.py downloads the test split), so these are the gsm8k
    environment's real rows: the same verifier, the same prompt, the shape of a gsm8k row."""
    return {
        index: row
        for index, row in enumerate(example_rows())
        if isinstance(row.get("expected_answer"), str) and is_number_text(row["expected_answer"])
    }


def verifier_figures(body: dict[str, Any]) -> dict[str, Any]:
    """What upstream's /verify answers beside the reward: ``library_reward`` (math-verify's verdict) and
    how many times the judge was asked (``judge_evaluations``)."""
    figures: dict[str, Any] = {}
    library = body.get("library_reward")
    if not isinstance(library, bool) and isinstance(library, int | float) and math.isfinite(library):
        figures["library_reward"] = library
    judged = body.get("judge_evaluations")
    figures["judge_calls"] = len(judged) if isinstance(judged, list) else 0
    return figures


class MathWithJudge(EnvironmentDefinition):
    """NeMo Gym math rows: any non-empty expected answer (LaTeX or a number); probes on all 5 example rows."""

    def expected_answer(self, row: dict[str, Any]) -> str:
        return rows.math_expected(row)

    def probe_rows(self) -> dict[int, dict[str, Any]]:
        return dict(enumerate(example_rows()))

    def convert_row(self, row: dict[str, Any]) -> dict[str, Any]:
        return rows.convert_row(row, self.expected_answer)

    def build_run_body(self, task: dict[str, Any], generation: Generation, rollout_id: str) -> dict[str, Any]:
        return rows.build_run_body(task, generation, rollout_id, self.expected_answer)

    def map_result(self, body: dict[str, Any]) -> RunResult:
        # An answer without a response or a numeric reward was never scored: verifier_error, never a 0.
        return reference.verified_result(self.name, body).with_metrics(verifier_figures(body))

    def verifier_probes(self) -> Sequence[VerifierProbe]:
        return probes.verifier_probes(self.probe_rows())


class Gsm8k(MathWithJudge):
    """The same verifier on number answers (NeMo Gym's benchmark rows or original GSM8K rows); probes on
    the example rows whose answer is a number."""

    def expected_answer(self, row: dict[str, Any]) -> str:
        return rows.gsm8k_expected(row)

    def probe_rows(self) -> dict[int, dict[str, Any]]:
        return numeric_example_rows()


def definitions(
    judge: JudgeEndpoint | None = None, verify_timeout: float | None = None
) -> tuple[MathWithJudge, ...]:
    """Both environments; with a judge, each resources server calls the judge's own model server;
    `verify_timeout` bounds one math-verify check (None: upstream's default)."""
    extra = (judge.server(JUDGE_SERVER),) if judge is not None else ()

    def servers(resources: str, agent: str) -> tuple[NemoGymServer, ...]:
        return (
            resources_server(
                resources,
                "math_with_judge",
                RESOURCES_CLASS,
                **resources_config(judge, verify_timeout=verify_timeout),
            ),
            # One model call per trial. Upstream leaves max_steps unset (unlimited), and a reply with
            # neither a message nor a tool call (reasoning only) would then loop forever.
            simple_agent(agent, resources=resources, max_steps=1),
            *extra,
        )

    gsm8k = Gsm8k(
        name=GSM8K,
        configs=("gsm8k-v1",),
        agent=GSM8K_AGENT,
        servers=servers(GSM8K_RESOURCES, GSM8K_AGENT),
        cleanup=STATELESS,  # nothing outlives the /run call
        description=(
            "GSM8K grade-school math on NeMo Gym's math_with_judge: the boxed answer checked by "
            "math-verify (stateless, one model call per trial)."
        ),
        max_deadline_s=1800.0,
        max_concurrency=8,
        queue_capacity=32,
    )
    math_with_judge = MathWithJudge(
        name=MATH,
        configs=("math-with-judge-v1",),
        agent=MATH_AGENT,
        servers=servers(MATH_RESOURCES, MATH_AGENT),
        cleanup=STATELESS,
        description=(
            "NeMo Gym math_with_judge: a boxed final answer checked by math-verify, LLM judge optional "
            "(stateless, one model call per trial)."
        ),
        max_deadline_s=1800.0,
        max_concurrency=256,
        queue_capacity=1024,
    )
    return (gsm8k, math_with_judge)


@hookimpl
def register_environments(registrar: EnvironmentRegistrar) -> None:
    # The judge and the verify bound are read here, when the registry is built: a refused
    # configuration stops the command (ConfigError) before any server starts.
    for environment in definitions(judge_settings(), verify_timeout_s()):
        registrar.add(environment)
