"""run_trial: bind one session to one remote trial (reference §5.5), importable and signal-free.

create (raced against `stop`) -> heartbeat + poll until terminal -> terminal mapping. Differences from
the reference loop:
- renew failures are retried until the lease, counted from the last renew that certainly reached
  the gateway, would have run out; only then is the trial given up (abort + error). Poll failures get
  up to one lease period each, so a GET that keeps failing while renews succeed cannot hang the
  session;
- renews are timed from that anchor: the first goes out one interval after the create was sent, which
  is at once after a create slower than that (short trials, the most common, need none);
- a 404 is explained: trial expired, or gateway restarted (its /healthz service_epoch differs from
  the one the create's answer named, or, from a gateway that names none, the one seen before create),
  or simply not found. A client that has seen a create's answer name its epoch probes no /healthz
  before its next creates.
"""

from __future__ import annotations

import logging
from typing import Final

import anyio
from anyio.abc import TaskGroup

from relax_gym_core.client.exceptions import TrialCancelledError, TrialGoneError
from relax_gym_core.client.http import GatewayClient
from relax_gym_core.client.output import check_terminal
from relax_gym_core.client.settings import ClientOptions
from relax_gym_core.errors import GatewayRequestError, RelaxGymError
from relax_gym_core.protocol import CreateTrialRequest, TrialSnapshot

logger = logging.getLogger("relax_gym.client")

CANCELLED_MESSAGE: Final = "Managed session cancelled; remote trial abort requested"
MIN_HEARTBEAT_S: Final = 0.05


async def run_trial(
    request: CreateTrialRequest,
    *,
    gateway_url: str | None = None,
    options: ClientOptions | None = None,
    stop: anyio.Event | None = None,
    client: GatewayClient | None = None,
    api_token: str | None = None,
) -> TrialSnapshot:
    """Run one trial to its end and return the terminal snapshot (completed or truncated).

    Raises TrialCancelledError when `stop` is set (after a best-effort abort), RemoteTrialError when the
    trial ended aborted/failed, GatewayRequestError/ProtocolError when the gateway misbehaves. If the
    calling task is cancelled, the remote trial is aborted (shielded, abort_timeout_s) before the
    cancellation propagates. `options` and `api_token` only configure the client built from `gateway_url`.
    """
    if stop is not None and stop.is_set():
        raise TrialCancelledError(CANCELLED_MESSAGE)
    if client is not None:
        return await _TrialRun(client, request, stop).run()
    if gateway_url is None:
        raise TypeError("run_trial needs gateway_url or client")
    async with GatewayClient(gateway_url, options=options, api_token=api_token) as own:
        return await _TrialRun(own, request, stop).run()


class _TrialRun:
    """State of one run_trial call. Child tasks record the first outcome; run() acts on it."""

    def __init__(self, gateway: GatewayClient, request: CreateTrialRequest, stop: anyio.Event | None) -> None:
        self.gateway = gateway
        self.request = request
        self.request_id = request.request_id
        self.stop = stop
        self.epoch: str | None = None
        self.create_sent = False
        self.created = False
        self.lease_anchor = 0.0  # monotonic time at or before the gateway's last lease refresh
        self.decided = False
        self.stopped = False
        self.result: TrialSnapshot | None = None
        self.failure: Exception | None = None

    async def run(self) -> TrialSnapshot:
        try:
            async with anyio.create_task_group() as tg:
                if self.stop is not None:
                    tg.start_soon(self._watch_stop, self.stop, tg)
                tg.start_soon(self._drive, tg)
        except anyio.get_cancelled_exc_class():
            if self.create_sent:
                await self._abort_quietly()
            raise
        if self.stopped:
            if self.create_sent:
                await self._abort_quietly()
            raise TrialCancelledError(CANCELLED_MESSAGE)
        if self.failure is not None:
            # A gone trial has nothing left to abort; a refused create never made one.
            if self.created and not isinstance(self.failure, TrialGoneError):
                await self._abort_quietly()
            raise self.failure
        assert self.result is not None
        return check_terminal(self.result)

    def _decide(
        self, tg: TaskGroup, *, result: TrialSnapshot | None = None, failure: Exception | None = None
    ) -> None:
        if not self.decided:
            self.decided = True
            self.result, self.failure = result, failure
        tg.cancel_scope.cancel()

    async def _watch_stop(self, stop: anyio.Event, tg: TaskGroup) -> None:
        await stop.wait()
        if not self.decided:
            self.stopped = True
        self._decide(tg)

    async def _drive(self, tg: TaskGroup) -> None:
        try:
            snapshot = await self._create()
            if not snapshot.status.is_terminal:
                tg.start_soon(self._heartbeat, tg)
                snapshot = await self._poll()
        except Exception as exc:  # noqa: BLE001 - handed to run(), which aborts and re-raises it
            self._decide(tg, failure=exc)
        else:
            self._decide(tg, result=snapshot)

    async def _create(self) -> TrialSnapshot:
        if self.gateway.service_epoch is None:  # a gateway not yet seen to name its epoch: probe it
            self.epoch = await self._service_epoch()
        self.lease_anchor = self.gateway.clock()
        self.create_sent = True
        # The create itself waits for the trial's end, up to the first renew (nothing renews meanwhile):
        # a trial shorter than that costs one request. A gateway known not to wait is not asked to.
        wait_s = 0.0 if self.gateway.long_polls is False else self._heartbeat_interval()
        snapshot = await self.gateway.create(self.request, wait_s=wait_s)
        self.created = True
        if self.gateway.service_epoch is not None:  # this create's answer named the gateway holding it
            self.epoch = self.gateway.service_epoch
        return snapshot

    def _heartbeat_interval(self) -> float:
        return max(MIN_HEARTBEAT_S, self.request.lease_s / 3)

    async def _heartbeat(self, tg: TaskGroup) -> None:
        interval = self._heartbeat_interval()
        try:
            # The create refreshed the lease no sooner than lease_anchor: the first renew is due one
            # interval after it, like every later one after the renew before.
            await anyio.sleep(max(0.0, self.lease_anchor + interval - self.gateway.clock()))
            while True:
                sent_at = self.gateway.clock()
                try:
                    await self.gateway.renew(
                        self.request_id, retry_until=self.lease_anchor + self.request.lease_s
                    )
                except TrialGoneError as exc:
                    raise await self._explain_gone(exc) from None
                except GatewayRequestError as exc:
                    raise GatewayRequestError(
                        f"{exc}; the trial lease (lease_s={self.request.lease_s:g}) could not be kept",
                        status_code=exc.status_code,
                        detail=exc.detail,
                    ) from None
                self.lease_anchor = sent_at
                await anyio.sleep(interval)
        except Exception as exc:  # noqa: BLE001 - handed to run()
            self._decide(tg, failure=exc)

    async def _poll(self) -> TrialSnapshot:
        while True:
            try:
                snapshot = await self.gateway.next_snapshot(
                    self.request_id, retry_until=self.gateway.clock() + self.request.lease_s
                )
            except TrialGoneError as exc:
                raise await self._explain_gone(exc) from None
            if snapshot.status.is_terminal:
                return snapshot

    async def _service_epoch(self) -> str | None:
        """The gateway's process identity, or None if it cannot be read (the check is then skipped)."""
        try:
            return (await self.gateway.health()).service_epoch
        except RelaxGymError as exc:
            logger.info("Gateway health probe failed (%s); restart detection disabled", exc)
            return None

    async def _explain_gone(self, exc: TrialGoneError) -> TrialGoneError:
        # `exc` carries the gateway's detail and the retention advice; after a restart that advice would
        # mislead, so only the detail is kept.
        where = f"request_id={self.request_id}"
        if exc.expired:
            return TrialGoneError(
                f"Remote trial expired on the gateway before its end was seen: {where}; {exc}",
                expired=True,
                detail=exc.detail,
            )
        epoch = await self._service_epoch() if self.epoch is not None else None
        if epoch is not None and epoch != self.epoch:
            said = f" (HTTP 404: {exc.detail})" if exc.detail else ""
            return TrialGoneError(
                f"NeMo Gym gateway restarted (service_epoch changed); the trial was lost: {where}{said}",
                restarted=True,
                detail=exc.detail,
            )
        return TrialGoneError(f"Remote trial not found on the gateway: {where}; {exc}", detail=exc.detail)

    async def _abort_quietly(self) -> None:
        """Best effort, shielded and bounded: runs while we are being cancelled or torn down."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.gateway.options.abort_timeout_s + 1.0):
            try:
                await self.gateway.abort(self.request_id)
            except RelaxGymError as exc:
                logger.info("Best-effort abort of %s failed: %s", self.request_id, exc)
