"""The gateway app factory: trial API routes over a TrialService (no module-level app)."""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from relax_gym_core.bridge import UPSTREAM_CLIENTS, Bridge, Forwarder, UpstreamReply, match_model_call
from relax_gym_core.errors import (
    ConfigError,
    FieldError,
    RelaxGymError,
)
from relax_gym_core.gateway.auth import bearer_auth
from relax_gym_core.gateway.config import GatewaySettings
from relax_gym_core.gateway.intake import CreateIntake
from relax_gym_core.gateway.limits import limit_bodies
from relax_gym_core.gateway.metrics import GatewayMetrics
from relax_gym_core.gateway.openapi import build_openapi
from relax_gym_core.gateway.trajectory_api import get_trajectories, get_trajectory
from relax_gym_core.observe import Observer, Observers
from relax_gym_core.plugin.host import Hooks, make_plugin_manager
from relax_gym_core.plugin.registry import RuntimeFactory
from relax_gym_core.plugin.specs import EnvironmentSpec, environments_document
from relax_gym_core.protocol import (
    EPOCH_HEADER,
    MAX_WAIT_S,
    PROTOCOL_VERSION,
    REPLAY_HEADER,
    ROLLOUT_TAG,
    WAITED_HEADER,
    ServiceHealth,
    bridge_url,
    unstructure,
)
from relax_gym_core.protocol.jsonutil import canonical
from relax_gym_core.replicas.pool import PoolRuntime, ReplicaPool
from relax_gym_core.runtimes import ModelRoute, Runtime, builtin
from relax_gym_core.trajectories import TrajectoryStore
from relax_gym_core.trials import (
    MEMORY,
    Admission,
    RecoveryPolicy,
    TrialBook,
    TrialService,
    TrialStore,
    open_store,
)
from relax_gym_core.trials.changes import Changes
from relax_gym_core.web import (
    contain_errors,
    handle_http_exception,
    handle_relax_gym_error,
    json_response,
)


def config_fingerprint(specs: tuple[EnvironmentSpec, ...]) -> str:
    return hashlib.sha256(canonical(environments_document(specs))).hexdigest()


class _NoUpstream:
    """Placeholder until the lifespan opens the real pool."""

    async def post(
        self, url: str, *, headers: Mapping[str, str], body: bytes, timeout_s: float
    ) -> UpstreamReply:
        raise RuntimeError("the gateway has not started")

    async def close(self) -> None:
        return None


class Gateway:
    """App-lifetime state: the service plus identity for health answers."""

    def __init__(
        self, settings: GatewaySettings, service: TrialService, pools: Sequence[ReplicaPool] = ()
    ) -> None:
        self.settings = settings
        self.service = service
        self.pools = tuple(pools)
        self.service_epoch = secrets.token_hex(16)
        self.config_fingerprint = config_fingerprint(settings.environments)

    def health(self, *, ready: bool | None = None, reasons: list[str] | None = None) -> ServiceHealth:
        stats = self.service.stats()
        return ServiceHealth(
            protocol_version=PROTOCOL_VERSION,
            service_epoch=self.service_epoch,
            gym_commit=self.settings.gym_commit,
            config_fingerprint=self.config_fingerprint,
            trials=stats.trials,
            active_trials=stats.active_trials,
            terminal_trials=stats.terminal_trials,
            janitor_healthy=self.service.janitor_healthy,
            ready=ready,
            reasons=reasons or [],
            evicted_trials=stats.evicted_trials,
        )


def _gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


async def create_trial(request: Request) -> Response:
    """Create (or find: idempotent by request_id) a trial; with ``?wait_s=S`` (this gateway's own), answer
    once its status is final or S seconds have passed, so a short trial costs its client one request."""
    wait_s = _wait_s(request)
    trial_request = await request.app.state.intake.parse(await request.body())
    gateway = _gateway(request)
    snapshot, created = gateway.service.create(trial_request)
    headers = {EPOCH_HEADER: gateway.service_epoch}
    if not created:
        headers[REPLAY_HEADER] = "1"
    if wait_s:
        snapshot = await gateway.service.ended(snapshot.request_id, wait_s)
        headers[WAITED_HEADER] = "1"
    await gateway.service.written(snapshot.request_id)  # durable before acknowledged
    return json_response(unstructure(snapshot), 202, headers)


def _wait_s(request: Request) -> float:
    raw = request.query_params.get("wait_s")
    if raw is None:
        return 0.0
    try:
        wait_s = float(raw)
    except ValueError:
        wait_s = -1.0
    if not 0 <= wait_s <= MAX_WAIT_S:  # also NaN
        raise FieldError(f"wait_s: must be a number of seconds from 0 to {MAX_WAIT_S:g}, got {raw[:40]!r}")
    return wait_s


async def get_trial(request: Request) -> Response:
    """The trial's snapshot; with ``?wait_s=S`` (a long poll, this gateway's own), once the trial has made
    its next transition or S seconds have passed, at once if nothing is left to change."""
    service = _gateway(request).service
    wait_s = _wait_s(request)
    request_id = request.path_params["request_id"]
    snapshot = await service.watch(request_id, wait_s)  # without wait_s, get() at once
    await service.written(snapshot.request_id)  # a state is shown only once it survives a crash
    return json_response(unstructure(snapshot), headers={WAITED_HEADER: "1"} if wait_s else None)


async def renew_trial(request: Request) -> Response:
    _gateway(request).service.renew(request.path_params["request_id"])
    return Response(status_code=204)


async def abort_trial(request: Request) -> Response:
    service = _gateway(request).service
    snapshot = service.abort(request.path_params["request_id"])
    await service.written(snapshot.request_id)
    return json_response(unstructure(snapshot), 202)


def _trajectory_store(settings: GatewaySettings) -> TrajectoryStore:
    root = None if settings.state_dir == MEMORY else Path(settings.state_dir).expanduser() / "trajectories"
    try:
        return TrajectoryStore(
            root,
            max_bytes=settings.trajectory_max_bytes,
            retention_s=settings.retention_s,
            max_retained=settings.max_retained,
        )
    except OSError as exc:
        raise ConfigError(f"trajectory directory {root}: {exc.strerror or exc}") from None


async def healthz(request: Request) -> Response:
    body = unstructure(_gateway(request).health())
    del body["ready"]  # liveness only, as in the reference
    return json_response(body)


async def readyz(request: Request) -> Response:
    gateway = _gateway(request)
    ready, reasons = await gateway.service.readiness()
    body = unstructure(gateway.health(ready=ready, reasons=reasons))
    if gateway.settings.nemo_gym is not None:
        body["nemo_gym"] = dict(gateway.settings.nemo_gym)
    if gateway.pools:
        body["replicas"] = replica_counts(gateway.pools)
    return json_response(body, 200 if ready else 503)


def replica_counts(pools: Sequence[ReplicaPool]) -> dict[str, dict[str, int]]:
    """Per environment: replicas wanted, healthy, starting (a replacement on its way) and lost so far."""
    counts: dict[str, dict[str, int]] = {}
    for pool in pools:
        status = pool.status()
        for environment in pool.environments:
            counts[environment] = {
                "wanted": status.wanted,
                "healthy": status.healthy,
                "starting": status.starting,
                "lost": status.lost,
            }
    return counts


async def scrape_metrics(request: Request) -> Response:
    body, content_type = request.app.state.metrics.render()
    return Response(body, 200, media_type=content_type)


async def openapi(request: Request) -> Response:
    document = request.app.state.openapi
    return json_response(document)


class GatewayApp(Starlette):
    """Starlette, with model calls answered before its middleware and routing.

    Every agent turn is a model call, so it takes the shortest way: only the two middleware every request
    passes (errors contained, bodies capped) are in front of the bridge. Everything else, and a model
    call's path with another method (the router's 405), goes to Starlette as usual.
    """

    def __init__(self, *, model_calls: ASGIApp | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._model_calls = model_calls

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            self._model_calls is not None
            and scope["type"] == "http"
            and scope["method"] == "POST"
            and match_model_call(scope["path"]) is not None
        ):
            await self._model_calls(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def create_app(
    settings: GatewaySettings,
    *,
    runtime_factories: Mapping[str, RuntimeFactory] | None = None,
    clock: Callable[[], float] = time.monotonic,
    store: TrialStore | None = None,
    new_rollout_id: Callable[[], str] | None = None,
    hooks: Hooks | None = None,
    observers: Sequence[Observer] = (),
) -> Starlette:
    """Build the gateway. Raises ConfigError before anything starts if a spec names an unknown runtime.

    `hooks` (installed plugins) give each spec's environment object (its /run bodies and results, looked
    up once here) and plugin runtimes; an environment no plugin registers (or no `hooks`) runs the
    reference's way.
    `observers` see every trial transition and every bridged model call (relax_gym_core.observe).
    Without `store`, trials live where settings.state_dir says (the ledger there is locked until the
    app's lifespan ends).
    """
    admissions = {spec.key: Admission.of(spec) for spec in settings.environments}
    metrics = GatewayMetrics()
    hooks = hooks if hooks is not None else make_plugin_manager(load_entry_points=False)
    factories = {**builtin.runtime_factories(hooks), **(runtime_factories or {})}
    runtimes: dict[tuple[str, str], Runtime] = {}
    for spec in settings.environments:
        factory = factories.get(spec.runtime)
        if factory is None:
            raise ConfigError(
                f"environment config {spec.config!r}: runtime {spec.runtime!r} is not available "
                f"(available: {', '.join(sorted(factories))})"
            )
        runtimes[spec.key] = factory(spec, hooks.environments.lookup(spec.environment))
    pools = list({id(r.pool): r.pool for r in runtimes.values() if isinstance(r, PoolRuntime)}.values())
    metrics.watch_replicas(pools)
    if store is None:
        store = open_store(settings.state_dir, clock=clock, tombstone_capacity=settings.tombstone_capacity)
    trajectories = _trajectory_store(settings) if settings.trajectories else None
    changes = Changes()
    fan_out = Observers((metrics, *observers, changes))
    book = TrialBook(
        clock=clock,
        store=store,
        environments=admissions,
        retention_s=settings.retention_s,
        max_retained=settings.max_retained,
        new_rollout_id=new_rollout_id,
        observers=fan_out,
        on_terminal=trajectories.finished if trajectories is not None else None,
    )
    metrics.watch_admission(admissions, book.env_counts)
    policy = settings.callback_policy
    public_url = settings.public_url
    service = TrialService(
        book,
        runtimes,
        cleanup_grace_s=settings.cleanup_grace_s,
        scan_interval_s=settings.scan_interval_s,
        validate_endpoint=(lambda endpoint: policy.check(endpoint.base_url)) if policy else (lambda _e: None),
        model_route=lambda rollout_id: ModelRoute(
            base_url=bridge_url(public_url, rollout_id) if public_url else None,
            metadata={ROLLOUT_TAG: rollout_id},
        ),
        recovery=RecoveryPolicy(give_up_s=settings.recovery_give_up_s),
        trajectories=trajectories,
        changes=changes,
    )
    gateway = Gateway(settings, service, pools)
    bridge = (
        Bridge(service, policy, Forwarder(_NoUpstream()), keepalive_s=settings.keepalive_s, observers=fan_out)
        if policy
        else None
    )

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        if bridge is not None:
            # The upstream pool is bound to the running loop, so it is made here, not in the factory.
            client = UPSTREAM_CLIENTS[settings.upstream_client](proxy=policy.proxy if policy else None)
            bridge.forwarder = Forwarder(client, callback_timeout_s=settings.callback_timeout_s)
        if trajectories is not None:
            await trajectories.start()
        await service.start()
        for pool in pools:
            pool.open()  # probing needs the running loop
        try:
            yield
        finally:
            # uvicorn gave open requests limits.drain_s of the budget before this runs.
            await service.close(
                budget_s=max(0.0, settings.limits.shutdown_budget_s - settings.limits.drain_s)
            )
            if bridge is not None:
                await bridge.forwarder.client.close()
            if trajectories is not None:
                await trajectories.close()  # after the service: the trials it ended are written

    app = GatewayApp(
        model_calls=contain_errors(limit_bodies(settings.limits)(bridge)) if bridge is not None else None,
        routes=[
            Route("/v1/trials", create_trial, methods=["POST"]),
            Route("/v1/trials/{request_id}", get_trial, methods=["GET"]),
            Route("/v1/trials/{request_id}/renew", renew_trial, methods=["POST"]),
            Route("/v1/trials/{request_id}/abort", abort_trial, methods=["POST"]),
            Route("/v1/trials/{request_id}/trajectory", get_trajectory, methods=["GET"]),
            Route("/v1/trajectories", get_trajectories, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            Route("/openapi.json", openapi, methods=["GET"]),
            Route("/metrics", scrape_metrics, methods=["GET"]),
            *(bridge.routes() if bridge is not None else []),
        ],
        exception_handlers={
            RelaxGymError: handle_relax_gym_error,
            HTTPException: handle_http_exception,
        },
        lifespan=lifespan,
        middleware=[
            Middleware(contain_errors),  # first: outermost, so no error reaches a log with its message
            Middleware(limit_bodies(settings.limits)),
            *([Middleware(bearer_auth(settings.api_token))] if settings.api_token else []),
        ],
    )
    app.state.gateway = gateway
    app.state.shutdown_begins = changes.close  # gateway.server calls it on SIGINT/SIGTERM: long polls answer
    app.state.metrics = metrics
    app.state.intake = CreateIntake(metrics, refuse_unknown=settings.unknown_keys == "refuse")
    app.state.openapi = build_openapi(settings)
    return app
