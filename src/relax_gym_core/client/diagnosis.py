"""What a refused gateway request means to the user: the gateway's reason and the setting to change.

The gateway answers every refusal with `{"detail": "<reason>"}` (relax_gym_core.web). Client errors repeat
that reason, made safe to print (one line, bounded, the client's own secrets masked), and, where one
client setting decides the outcome, name it with the value that was sent. ADVICE is keyed on the
gateway's wording (trials/book.py, bridge/allowlist.py, gateway/auth.py); a reason it does not know still
reaches the user, just without advice.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Final

from attrs import frozen

from relax_gym_core.client.settings import ClientOptions
from relax_gym_core.errors import ProtocolError
from relax_gym_core.protocol import CreateTrialRequest, jsonutil
from relax_gym_core.protocol.text import safe_text
from relax_gym_core.protocol.types import split_http_url

MAX_VALUE_CHARS: Final = 80  # values of ours quoted in advice (environment names, hosts)
MAX_ERROR_BODY_BYTES: Final = 1 << 20  # no gateway error answer is this large: not worth parsing

TRANSIENT_CREATE: Final = frozenset({408, *range(500, 600)})


@frozen(kw_only=True)
class ErrorContext:
    """One failed gateway call, as the advice table sees it."""

    op: str  # create, get, renew, abort, health
    status: int
    detail: str | None  # already sanitised
    options: ClientOptions
    request: CreateTrialRequest | None = None  # only for create
    token_sent: bool = False
    attempts: int = 1
    secrets: tuple[str, ...] = ()


type Advice = Callable[[ErrorContext], str | None]


@frozen
class _Rule:
    statuses: Collection[int]
    detail_prefix: str  # "" matches any detail, or none
    ops: frozenset[str]  # empty: every operation
    advice: Advice

    def matches(self, ctx: ErrorContext) -> bool:
        return (
            ctx.status in self.statuses
            and (not self.ops or ctx.op in self.ops)
            and (ctx.detail or "").startswith(self.detail_prefix)
        )


def gateway_detail(body: bytes, *, secrets: Iterable[str] = ()) -> str | None:
    """The `detail` string of a JSON error body, made safe to print; None for anything else."""
    if not body or len(body) > MAX_ERROR_BODY_BYTES:
        return None
    try:
        data = jsonutil.loads(body)
    except ProtocolError:
        return None
    detail = data.get("detail") if isinstance(data, dict) else None
    if not isinstance(detail, str):
        return None
    return safe_text(detail, secrets=secrets) or None


def _quoted(ctx: ErrorContext, value: str) -> str:
    return repr(safe_text(value, limit=MAX_VALUE_CHARS, secrets=ctx.secrets))


# ---- advice, one function per row of ADVICE ---------------------------------------------------------


def _deadline(ctx: ErrorContext) -> str | None:
    if ctx.request is None:
        return None
    return (
        f"lower NEMO_GYM_DEADLINE_S (this request's deadline_s={ctx.request.deadline_s:g}) to the "
        "environment's max_deadline_s or less"
    )


def _route(ctx: ErrorContext) -> str | None:
    if ctx.request is None:
        return None
    env = ctx.request.environment
    return (
        "NEMO_GYM_ENVIRONMENT / NEMO_GYM_CONFIG (or the row's metadata.environment / metadata.config) "
        f"must name a pair the gateway registers; sent environment={_quoted(ctx, env.name)} "
        f"config={_quoted(ctx, env.config)}"
    )


def _interrupt_policy(ctx: ErrorContext) -> str | None:
    if ctx.request is None:
        return None
    sent = _quoted(ctx, ctx.request.interrupt_policy.value)
    return f"set NEMO_GYM_INTERRUPT_POLICY to the environment's registered policy (sent {sent})"


def _callback_host(ctx: ErrorContext) -> str | None:
    names = "the gateway's NEMO_GYM_CALLBACK_ALLOWED_HOSTS / NEMO_GYM_CALLBACK_ALLOWED_NETWORKS"
    parts = split_http_url(ctx.request.model_endpoint.base_url) if ctx.request is not None else None
    if parts is None or not parts.hostname:
        return f"{names} must allow RELAX_BASE_URL's host"
    return f"{names} must allow RELAX_BASE_URL's host {_quoted(ctx, parts.hostname)}"


def _callback_https(_ctx: ErrorContext) -> str:
    return (
        "RELAX_BASE_URL must be https:// because the gateway sends model calls through "
        "NEMO_GYM_CALLBACK_PROXY"
    )


def _callback_url(_ctx: ErrorContext) -> str:
    return "fix RELAX_BASE_URL, the model callback URL the gateway refused"


def _token(ctx: ErrorContext) -> str:
    if ctx.token_sent:
        return "RELAX_GYM_API_TOKEN does not match the gateway's token"
    return "the gateway requires an API token: set RELAX_GYM_API_TOKEN to its token"


def _request_id(ctx: ErrorContext) -> str:
    rid = f" {ctx.request.request_id}" if ctx.request is not None else ""
    return (
        f"request_id{rid} (derived from RELAX_SESSION_ID, RELAX_SESSION_IO_DIR and NEMO_GYM_ATTEMPT) is "
        "taken on the gateway: relaunch with a new RELAX_SESSION_IO_DIR or a higher NEMO_GYM_ATTEMPT"
    )


def _queue_full(ctx: ErrorContext) -> str | None:
    if ctx.attempts < 2:
        return None
    return (
        f"raise NEMO_GYM_STARTUP_TIMEOUT_S (startup_timeout_s={ctx.options.startup_timeout_s:g}) to wait "
        "longer, or the environment's max_concurrency / queue_capacity on the gateway"
    )


def _create_retries(ctx: ErrorContext) -> str | None:
    if ctx.attempts < 2:
        return None
    return (
        f"NEMO_GYM_MAX_RETRIES (max_retries={ctx.options.max_retries}) and NEMO_GYM_RETRY_BACKOFF_S bound "
        "the retries"
    )


def _trial_expired(_ctx: ErrorContext) -> str:
    return "the gateway keeps finished trials for its RELAX_GYM_TRIAL_RETENTION_S"


def _trial_missing(_ctx: ErrorContext) -> str:
    return (
        "the trial was lost or has expired (the gateway keeps finished trials for its "
        "RELAX_GYM_TRIAL_RETENTION_S), or NEMO_GYM_URL points at another gateway"
    )


def _not_a_gateway(_ctx: ErrorContext) -> str:
    return "NEMO_GYM_URL must be the root URL of a relax-gym gateway"


def _redirect(_ctx: ErrorContext) -> str:
    return "NEMO_GYM_URL must be the gateway's own URL (redirects are not followed)"


_CREATE = frozenset({"create"})
_TRIAL_OPS = frozenset({"get", "renew", "abort"})
_BASE_URL = "model_endpoint.base_url"

# First match wins: specific wording before the catch-all of its status.
ADVICE: Final[tuple[_Rule, ...]] = (
    _Rule({400}, "deadline_s exceeds the registered environment maximum", _CREATE, _deadline),
    _Rule({400}, "environment/config is not registered", _CREATE, _route),
    _Rule({400}, "interrupt_policy does not match", _CREATE, _interrupt_policy),
    _Rule({400}, f"{_BASE_URL} host is not in the callback allowlist", _CREATE, _callback_host),
    _Rule({400}, f"{_BASE_URL} must use https", _CREATE, _callback_https),
    _Rule({400}, _BASE_URL, _CREATE, _callback_url),
    _Rule({401}, "", frozenset(), _token),
    _Rule({409}, "request_id", _CREATE, _request_id),
    _Rule({429}, "", _CREATE, _queue_full),
    _Rule(TRANSIENT_CREATE, "", _CREATE, _create_retries),
    _Rule({404}, "trial expired", _TRIAL_OPS, _trial_expired),
    _Rule({404}, "", _TRIAL_OPS, _trial_missing),
    _Rule({404, 405}, "", _CREATE, _not_a_gateway),
    _Rule(range(300, 400), "", frozenset(), _redirect),
)


def advice_for(ctx: ErrorContext) -> str | None:
    for rule in ADVICE:
        if rule.matches(ctx):
            return rule.advice(ctx)
    return None


def error_message(ctx: ErrorContext) -> str:
    """`Gateway <op> request failed with HTTP <status>[ after N attempts (retries exhausted)]` followed by
    `: <detail>` and `; <advice>` when there are any."""
    text = f"Gateway {ctx.op} request failed with HTTP {ctx.status}"
    if ctx.attempts > 1:
        text += f" after {ctx.attempts} attempts (retries exhausted)"
    if ctx.detail:
        text += f": {ctx.detail}"
    advice = advice_for(ctx)
    if advice:
        text += f"; {advice}"
    return text
