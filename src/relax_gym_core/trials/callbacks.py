"""The abort scope of one model call: a trial that is aborted or expires cancels its calls in flight.

Every bridged call enters one, so it is a plain context manager over asyncio's own cancellation rather
than anyio's CancelScope (an async context manager and a CancelScope cost ~7 % of the bridge's event loop,
bench/bridge.py). Like a cancel scope, it ends the cancellation it caused and lets any other through.
"""

from __future__ import annotations

import asyncio
from types import TracebackType


class CallbackScope:
    """Registered under its trial's request id while entered; cancel() cancels the task inside it."""

    __slots__ = ("_calls", "_request_id", "_task", "cancelled")

    def __init__(self, calls: dict[str, set[CallbackScope]], request_id: str) -> None:
        self._calls = calls
        self._request_id = request_id
        self._task: asyncio.Task[object] | None = None
        self.cancelled = False  # cancel() was called: the call ended because its trial did

    def __enter__(self) -> CallbackScope:
        self._task = asyncio.current_task()
        self._calls.setdefault(self._request_id, set()).add(self)
        return self

    def cancel(self) -> None:
        """Cancel the call inside (once): the task's CancelledError ends at this scope's exit."""
        if self.cancelled or self._task is None:
            return
        self.cancelled = True
        self._task.cancel()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        scopes = self._calls.get(self._request_id)
        if scopes is not None:
            scopes.discard(self)
            if not scopes:
                del self._calls[self._request_id]
        task, self._task = self._task, None
        if not self.cancelled or task is None:
            return False
        # Ours to end only if no one else cancelled the task too (then theirs goes on, as with anyio).
        return task.uncancel() == 0 and kind is asyncio.CancelledError
