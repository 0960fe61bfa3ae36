"""The optional LLM judge of math_with_judge: off by default (as upstream), on when the operator names a
judge endpoint.

Upstream asks the judge only when math-verify does not already give 1.0, through the NeMo Gym model server
its config names (``judge_model_server``); upstream's own YAML names ``policy_model``. Under relax-gym,
``policy_model`` is the gateway, whose bridge sends each call to a trial's Relax session: judge calls
there would be recorded as the policy's own turns (or refused for lack of a trial capability). So the
judge never uses ``policy_model``: turning it on means naming a separate endpoint, served to the resources
server by its own NeMo Gym model server (upstream's ``openai_model``, a Responses API client).

    RELAX_GYM_MATH_JUDGE_URL       base URL of an OpenAI-compatible Responses API (…/v1): turns the judge on
                                   (unset or empty: off)
    RELAX_GYM_MATH_JUDGE_MODEL     the judge's model name (required with the URL)
    RELAX_GYM_MATH_JUDGE_API_KEY   its API key, read by the judge server process itself (optional)

    RELAX_GYM_MATH_VERIFY_TIMEOUT_S  seconds math-verify may take per answer (upstream's
                                     library_verifier_timeout_seconds, 10 by default); past it the answer
                                     is not scored and the trial fails (verifier.py), so raise it on
                                     a busy node

The variables are read when the plugin registers its environments (``relax-gym up`` and every other
command); a configuration that would route the judge through the bridge, or that is incomplete, is
refused there with a ConfigError naming the variable.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

from relax_gym_core.errors import ConfigError
from relax_gym_core.plugin import POLICY_MODEL, JudgeEndpoint, JudgeVariables, judge_endpoint

URL_VAR = "RELAX_GYM_MATH_JUDGE_URL"
MODEL_VAR = "RELAX_GYM_MATH_JUDGE_MODEL"
API_KEY_VAR = "RELAX_GYM_MATH_JUDGE_API_KEY"
VERIFY_TIMEOUT_VAR = "RELAX_GYM_MATH_VERIFY_TIMEOUT_S"
JUDGE_SERVER = "math_judge_model"  # never POLICY_MODEL: that is the gateway under relax-gym


VARIABLES = JudgeVariables(url=URL_VAR, model=MODEL_VAR, api_key=API_KEY_VAR)


def _refuse(message: str) -> ConfigError:
    return ConfigError(f"math judge: {message} (leave {URL_VAR} unset to keep the judge off)")


def judge_settings(environ: Mapping[str, str] = os.environ) -> JudgeEndpoint | None:
    """The judge the operator configured, None when it is off; ConfigError for a refused configuration."""
    try:
        return judge_endpoint(VARIABLES, environ)
    except ConfigError as exc:
        raise _refuse(str(exc)) from None


def verify_timeout_s(environ: Mapping[str, str] = os.environ) -> float | None:
    """The operator's bound on one math-verify check (None: upstream's default); ConfigError if bad.

    Upstream scores an answer whose check outlives the bound 0.0, like a wrong one; our subclass
    (verifier.py) fails the trial instead. On a loaded rollout node right answers can fail that way,
    so the bound is the operator's to widen."""
    raw = environ.get(VERIFY_TIMEOUT_VAR, "").strip()
    if not raw:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"{VERIFY_TIMEOUT_VAR}={raw!r} must be a positive number of seconds")
    return seconds


def resources_config(judge: JudgeEndpoint | None, *, verify_timeout: float | None = None) -> dict[str, Any]:
    """The math_with_judge resources server's config (upstream's math_with_judge.yaml fields)."""
    config: dict[str, Any] = {
        "domain": "math",
        "should_use_judge": judge is not None,
        # Upstream's YAML value; with the judge off it is a required field that is never called.
        "judge_model_server": {
            "type": "responses_api_models",
            "name": JUDGE_SERVER if judge is not None else POLICY_MODEL,
        },
        "judge_responses_create_params": {"input": []},
    }
    if verify_timeout is not None:
        config["library_verifier_timeout_seconds"] = verify_timeout
    refuse_judge_through_bridge(config)
    return config


def refuse_judge_through_bridge(config: Mapping[str, Any]) -> None:
    """A resources config whose enabled judge would call the gateway (policy_model) is refused."""
    server = config.get("judge_model_server")
    name = server.get("name") if isinstance(server, Mapping) else None
    if config.get("should_use_judge") and name == POLICY_MODEL:
        raise _refuse(
            f"the judge is on and its model server is {POLICY_MODEL!r}, which is the relax-gym gateway: "
            f"the judge's calls would go through a trial's bridge. Set {URL_VAR} and {MODEL_VAR}"
        )
