"""Watching a web client while a request waits for a lock, or holds one.

uvicorn and FastAPI never cancel an endpoint whose client disconnected, and aiohttp does
only with ``handler_cancellation=True`` (which ``web.run_app`` leaves off): a request
waiting for a lock would take it long after its client left, and run its body for
nobody. The integrations watch the client in a task of their own and, when it leaves,
cancel the request's task natively (``task.cancel()``, as ``asyncio.timeout`` does);
:meth:`ClientWatch.settle` tells that cancellation from any other and takes it back.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["CLIENT_LEFT_STATUS", "ClientWatch"]

logger = logging.getLogger("aiolock")

#: The status of a request whose client left (nginx's "client closed request"); nobody
#: reads it, but logs and metrics see it rather than a 200 or a 500.
CLIENT_LEFT_STATUS = 499

_MESSAGE = "aiolock: the client disconnected"


class ClientWatch:
    """Cancels the current task when ``left()`` returns (the client disconnected).

    Start it before the wait; :meth:`stop` it when its job is done (after the acquire,
    or after the body when the body is to be cancelled too), then :meth:`settle` with
    the exception the guarded code raised, if any.
    """

    __slots__ = ("_cancelling", "_host", "_watcher", "left")

    def __init__(self, left: Callable[[], Awaitable[object]]) -> None:
        host = asyncio.current_task()
        if host is None:  # pragma: no cover - the frameworks always run in a task
            raise RuntimeError("watching a client needs an asyncio task")
        self._host = host
        self._cancelling = _cancelling(host)
        #: whether the client left and the host task was cancelled for it
        self.left = False
        self._watcher: asyncio.Task[None] = asyncio.ensure_future(self._watch(left))
        self._watcher.add_done_callback(_retrieve)

    async def _watch(self, left: Callable[[], Awaitable[object]]) -> None:
        await left()
        if not self._host.done():
            self.left = True
            self._host.cancel(_MESSAGE)

    def stop(self) -> None:
        """Stop watching (synchronous: the watcher only waits, it has nothing to finish)."""
        self._watcher.cancel()

    async def settle(self, exc: BaseException | None) -> bool:
        """Whether the client left (its cancellation of this task is then taken back).

        *exc* is what the watched code raised. A cancellation from outside that came
        with it goes on (raised here if it was still pending). Call :meth:`stop` first.
        """
        if not self.left:
            return False
        if isinstance(exc, asyncio.CancelledError):
            if sys.version_info >= (3, 11):
                return self._host.uncancel() <= self._cancelling
            # 3.10 has no count: a Task.cancel() after ours replaces the message.
            return bool(exc.args) and exc.args[0] == _MESSAGE
        # The code ended before the cancellation reached it: absorb it here, or the
        # caller's next await (a release) would be cancelled instead.
        if sys.version_info >= (3, 11) and self._host.cancelling() > self._cancelling:
            self._host.uncancel()
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            if _cancelling(self._host) > self._cancelling:
                raise
        return True


def _cancelling(task: asyncio.Task[Any]) -> int:
    if sys.version_info >= (3, 11):
        return task.cancelling()
    return 0


def _retrieve(watcher: asyncio.Task[None]) -> None:
    """A watcher that failed (the framework's receive raised, say) is logged, not lost."""
    if not watcher.cancelled() and watcher.exception() is not None:
        logger.warning("watching the client failed: %r", watcher.exception())
