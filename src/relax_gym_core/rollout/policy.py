"""The policy a rollout plays against: a model endpoint (OpenAI- or Anthropic-compatible), checked with one
request before any trial starts, or the oracle built from the plugins' verifier probes.

The endpoint is called by the gateway's bridge, never by this command (apart from the check), with the
key read from an environment variable: the key is kept in memory only, sent to the policy's host, and
never printed or written.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Literal

import httpx
from attrs import field, frozen

from relax_gym_core.errors import ConfigError
from relax_gym_core.plugin.host import Hooks, converted_row
from relax_gym_core.protocol import ModelEndpoint
from relax_gym_core.protocol.types import split_http_url
from relax_gym_core.rollout.data import task_identity

ORACLE = "oracle"
ORACLE_MODEL = "oracle"
ANTHROPIC_VERSION = "2023-06-01"
CHECK_TIMEOUT_S = 30.0
NO_KEY = "none"  # what a keyless endpoint (a local vLLM, SGLang) is sent: the wire needs some key
_GOOD, _BAD = "oracle-good", "oracle-bad"

type Api = Literal["openai", "anthropic"]


@frozen(kw_only=True)
class Policy:
    label: str  # what run.json records: the URL (it has no user info) or "oracle:P seed S"
    base_url: str
    model: str
    api: Api
    api_key: str = field(repr=False)

    def endpoint(self, key: str | None = None) -> ModelEndpoint:
        """The trial's model_endpoint; `key` replaces the key (the oracle's per-trial tokens)."""
        if self.api == "anthropic":
            return ModelEndpoint(
                base_url=self.base_url,
                api_key=key or self.api_key,
                model=self.model,
                api_key_header="x-api-key",
                api_key_prefix="",
                headers={"anthropic-version": ANTHROPIC_VERSION},
            )
        return ModelEndpoint(base_url=self.base_url, api_key=key or self.api_key, model=self.model)


@frozen
class OracleSpec:
    bad_rate: float  # the share of trials that replay a known-bad output instead of the known-good one


def parse_policy(text: str) -> OracleSpec | str:
    """`oracle`, `oracle:P` (0 <= P <= 1), or an http(s) URL."""
    if text == ORACLE or text.startswith(ORACLE + ":"):
        _, _, rate = text.partition(":")
        try:
            bad = float(rate) if rate else 0.0
        except ValueError:
            bad = -1.0
        if not 0.0 <= bad <= 1.0:
            raise ConfigError(f"--policy {text}: the known-bad rate P of oracle:P must be between 0 and 1")
        return OracleSpec(bad)
    parts = split_http_url(text)
    if parts is None:
        # Not echoed: a malformed URL may still carry a credential.
        raise ConfigError("--policy: expected an http(s) URL with a host, `oracle` or `oracle:P`")
    if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
        raise ConfigError(
            "--policy must not contain user info, a query or a fragment (keys go in --api-key-env)"
        )
    return text.rstrip("/")


def read_key(variable: str | None) -> str | None:
    """The API key from the environment variable named by --api-key-env (never from a flag)."""
    if variable is None:
        return None
    value = os.environ.get(variable, "").strip()
    if not value:
        raise ConfigError(f"--api-key-env {variable}: the environment variable {variable} is not set")
    if not all("\x21" <= char <= "\x7e" for char in value):
        raise ConfigError(f"--api-key-env {variable}: the key must be visible ASCII without spaces")
    return value


def models_url(base_url: str) -> str:
    """The model list where the bridge's rule puts it: <base>/models if base ends in /v1, else
    <base>/v1/models."""
    return f"{base_url}/models" if base_url.endswith("/v1") else f"{base_url}/v1/models"


def _model_list(body: Any) -> tuple[list[str], Api, bool] | None:
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return None
    ids = [str(item["id"]) for item in data if isinstance(item, dict) and isinstance(item.get("id"), str)]
    anthropic = body.get("object") != "list" and (
        "has_more" in body or any(isinstance(item, dict) and item.get("type") == "model" for item in data)
    )
    return ids, ("anthropic" if anthropic else "openai"), body.get("has_more") is True


def check_policy(base_url: str, *, model: str | None, key: str | None, key_variable: str | None) -> Policy:
    """One GET of the endpoint's model list: reachable, compatible, the model served; else ConfigError."""
    url = models_url(base_url)
    headers = {"anthropic-version": ANTHROPIC_VERSION}
    if key is not None:  # which of the two the endpoint reads is what this request finds out
        headers |= {"authorization": f"Bearer {key}", "x-api-key": key}
    proxy = os.environ.get("NEMO_GYM_CALLBACK_PROXY") or None  # the bridge's own route to the policy
    try:
        with httpx.Client(trust_env=False, proxy=proxy, timeout=CHECK_TIMEOUT_S) as client:
            answer = client.get(url, headers=headers)
    except httpx.HTTPError as exc:
        raise ConfigError(
            f"cannot reach the policy at {base_url} ({type(exc).__name__}): is it running?"
        ) from None
    if answer.status_code in (401, 403):
        advice = (
            f"check the key in ${key_variable}" if key_variable else "pass its key with --api-key-env VAR"
        )
        raise ConfigError(f"the policy at {base_url} refused GET {url} (HTTP {answer.status_code}): {advice}")
    try:
        listed = _model_list(answer.json()) if answer.status_code == 200 else None
    except ValueError:
        listed = None
    if listed is None:
        raise ConfigError(
            f"{base_url} is not an OpenAI- or Anthropic-compatible API: GET {url} answered "
            f"HTTP {answer.status_code} without a model list"
        )
    ids, api, partial = listed
    if model is None:
        if not ids:
            raise ConfigError(f"the policy at {base_url} lists no model: name one with --model")
        model = ids[0]
    elif ids and not partial and model not in ids:
        raise ConfigError(
            f"the policy at {base_url} does not serve model {model!r} (it serves: {', '.join(ids[:10])})"
        )
    return Policy(label=base_url, base_url=base_url, model=model, api=api, api_key=key or NO_KEY)


def oracle_token(seed: int, bad_rate: float, line: int, repeat: int) -> str:
    """The per-trial key of an oracle trial: whether it plays known-bad is drawn once per (row, repeat)."""
    digest = hashlib.sha256(f"{seed}:{line}:{repeat}".encode()).digest()
    draw = int.from_bytes(digest[:8], "big") / 2**64
    return f"{_BAD if draw < bad_rate else _GOOD}-{line}-{repeat}"


def oracle_line(token: str | None) -> int | None:
    """The data line an oracle trial's key names (oracle_token), else None."""
    prefix = _GOOD + "-"
    if token is None or not token.startswith(prefix):
        return None
    line, _, _repeat = token.removeprefix(prefix).partition("-")
    return int(line) if line.isdigit() else None


@contextlib.contextmanager
def oracle_policy(
    hooks: Hooks,
    environments: Iterable[str],
    spec: OracleSpec,
    seed: int,
    tasks: Mapping[int, dict[str, Any]] | None = None,
) -> Iterator[Policy]:
    """A real policy server in this process that answers each known row with its probe's known-good output
    (or, for trials drawn bad, a known-bad one): a whole rollout runs without any model. A row with a
    recorded trajectory (a replay probe) is answered with the recorded model turns, whatever its reward:
    `tasks` (the rollout's tasks by data line) tells which row a trial is, by the line its key names."""
    try:  # the web stack only for the oracle
        from relax_gym_core.policies.oracle import OracleScript  # noqa: PLC0415
        from relax_gym_core.policies.replay import ReplayPlan  # noqa: PLC0415
        from relax_gym_core.policies.replies import RawReply, RecordedRequest, ScriptedReply  # noqa: PLC0415
        from relax_gym_core.policies.server import ScriptedPolicy  # noqa: PLC0415
    except ImportError as exc:
        raise ConfigError(
            f"--policy oracle serves a policy: pip install 'relax-gym-core[gateway]' ({exc})"
        ) from None

    known = [hooks.environments.lookup(name) for name in sorted(set(environments))]
    scored = [(d, probe) for d in known for probe in d.verifier_probes() if probe.skip is None]
    scripted = [probe for _, probe in scored if not probe.replay]
    good, bad = OracleScript(scripted, reward=1.0), OracleScript(scripted, reward=0.0)
    recorded: dict[str, ReplayPlan] = {}
    for definition, probe in scored:
        if probe.replay:
            converted = converted_row(definition, copy.deepcopy(dict(probe.row)))
            recorded.setdefault(
                task_identity(converted["input"], converted["metadata"]), ReplayPlan.of(probe)
            )
    by_line = {
        line: plan
        for line, task in (tasks or {}).items()
        if (plan := recorded.get(task_identity(task.get("messages"), task.get("metadata")))) is not None
    }

    def answer(request: RecordedRequest) -> ScriptedReply | RawReply:
        if (request.bearer or "").startswith(_BAD):
            return bad(request)
        plan = by_line.get(oracle_line(request.bearer) or -1)
        body = request.body if isinstance(request.body, dict) else {}
        if plan is not None and request.resource == "responses":
            reply = plan.reply(body)
            if reply is not None:
                return RawReply(status=200, body=json.dumps(reply).encode())
        return good(request)

    with ScriptedPolicy(answer, model_name=ORACLE_MODEL) as server:
        label = f"{ORACLE}:{spec.bad_rate:g} seed {seed}"
        checked = check_policy(server.base_url, model=ORACLE_MODEL, key=None, key_variable=None)
        yield Policy(
            label=label, base_url=checked.base_url, model=checked.model, api=checked.api, api_key=_GOOD
        )
