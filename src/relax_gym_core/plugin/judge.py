"""An LLM judge an environment's verifier calls, at an endpoint the operator names: never the trial's bridge.

Upstream configs name the judge's NeMo Gym model server in a resources server field (``judge_model_server``),
often ``policy_model``. Under relax-gym ``policy_model`` is the gateway, whose bridge sends each call to a
trial's Relax session: judge calls there would be recorded as the policy's own turns. So a judge is its own
NeMo Gym model server (upstream's ``openai_model``, a Responses API client) pointed at the operator's
endpoint, named by three variables a plugin chooses (e.g. RELAX_GYM_JUDGE_URL, _MODEL, _API_KEY). The key is
read by the judge server's own process (OmegaConf resolves it there), so it never enters an environment
definition, a config file or a log.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

from attrs import frozen

from relax_gym_core.errors import ConfigError
from relax_gym_core.plugin.servers import NemoGymServer
from relax_gym_core.protocol import BRIDGE_PREFIX

OPENAI_MODEL_CLASS = "responses_api_models.openai_model.app:SimpleModelServer"


@frozen(kw_only=True)
class JudgeVariables:
    """The variables that name a judge endpoint."""

    url: str
    model: str
    api_key: str


@frozen(kw_only=True)
class JudgeEndpoint:
    base_url: str
    model: str
    api_key_variable: str

    def server(self, name: str) -> NemoGymServer:
        """The judge's own NeMo Gym model server `name`, pointed at the operator's endpoint."""
        return NemoGymServer(
            name=name,
            kind="responses_api_models",
            implementation="openai_model",
            server_class=OPENAI_MODEL_CLASS,
            config={
                "openai_base_url": self.base_url,
                "openai_api_key": f"${{oc.env:{self.api_key_variable},EMPTY}}",
                "openai_model": self.model,
            },
        )


def _checked_url(raw: str, variable: str, api_key: str) -> str:
    url = raw.strip()
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ConfigError(f"{variable} is not a URL ({exc})") from None
    if "@" in parts.netloc:  # checked first: no message below may echo a password
        raise ConfigError(f"{variable} must not carry credentials in the URL; use {api_key}")
    try:
        _ = parts.port  # a bad port raises ValueError only when read
    except ValueError as exc:
        raise ConfigError(f"{variable}={raw!r} is not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{variable}={raw!r} must be an http(s) URL with a host, e.g. http://judge:8000/v1")
    if parts.query or parts.fragment:
        raise ConfigError(f"{variable}={raw!r} must be a base URL without query or fragment")
    if BRIDGE_PREFIX in parts.path:  # the gateway's per-trial model-call prefix
        raise ConfigError(
            f"{variable}={raw!r} is a trial's model-call route on the relax-gym gateway: the judge's calls "
            "would be recorded as the policy's own turns. Name the judge's own endpoint"
        )
    return url.rstrip("/")


def judge_endpoint(variables: JudgeVariables, environ: Mapping[str, str]) -> JudgeEndpoint | None:
    """The judge the operator named, None when none is; ConfigError naming the variable for one that is
    incomplete or would go through the bridge."""
    raw_url = environ.get(variables.url, "")
    model = environ.get(variables.model, "").strip()
    if not raw_url.strip():  # unset, or set to nothing
        if model:
            raise ConfigError(
                f"{variables.model} is set but {variables.url} is not: name the judge's endpoint"
            )
        return None
    url = _checked_url(raw_url, variables.url, variables.api_key)
    if not model:
        raise ConfigError(f"{variables.url} is set but {variables.model} is not: name the judge's model")
    return JudgeEndpoint(base_url=url, model=model, api_key_variable=variables.api_key)
