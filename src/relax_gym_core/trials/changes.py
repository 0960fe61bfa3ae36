"""Waiting for a trial's next transition: what a long-polled GET (``?wait_s=``) waits on.

An Observer of the trial book: every transition of a trial that its snapshot shows (running, terminal,
settled; not the start of a cancellation, which leaves the status as it was) wakes whoever waits for that
trial. Nothing is kept for a trial nobody waits for, and a waiter that times out takes its entry with it.
"""

from __future__ import annotations

import asyncio

from relax_gym_core.observe import CallbackOutcome, Transition, TrialEvent


class Changes:
    def __init__(self) -> None:
        self._waiting: dict[str, tuple[asyncio.Event, int]] = {}  # request id -> (its event, waiters)
        self._closed = False

    def transition(self, event: Transition) -> None:
        if event.event is TrialEvent.CANCELLING:
            return
        waiting = self._waiting.pop(event.request_id, None)
        if waiting is not None:
            waiting[0].set()

    def callback(self, outcome: CallbackOutcome) -> None:
        return None

    async def next(self, request_id: str, timeout_s: float) -> None:
        """Wait for the trial's next transition, at most timeout_s (not at all once the gateway is closing:
        a waiter must not hold its shutdown)."""
        if self._closed:
            return
        event, waiters = self._waiting.get(request_id, (asyncio.Event(), 0))
        self._waiting[request_id] = (event, waiters + 1)
        try:
            async with asyncio.timeout(timeout_s):
                await event.wait()
        except TimeoutError:
            pass
        finally:
            current = self._waiting.get(request_id)
            if current is not None and current[0] is event:
                if current[1] > 1:
                    self._waiting[request_id] = (event, current[1] - 1)
                else:
                    del self._waiting[request_id]

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Wake every waiter, now and from now on (the gateway is shutting down)."""
        self._closed = True
        for event, _ in self._waiting.values():
            event.set()
        self._waiting.clear()
