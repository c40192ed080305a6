"""Stop acquiring the moment the server is told to stop (SIGTERM, SIGINT).

An ASGI server that shuts down gracefully (uvicorn, gunicorn's uvicorn workers) stops
accepting connections at the signal, waits up to its grace time for the requests still
running, cancels the rest, and only then runs the lifespan's shutdown. A request waiting
for a lock at the signal would wait out the grace time and be cancelled, which the
server answers with a 500 and a traceback in its log. So the integration listens for the
signal itself, beside the server: at the signal the manager stops acquiring
(:meth:`~aiolock.LockManager.stop_acquiring`), the waiting requests fail at once with
:class:`~aiolock.ManagerNotOpenError`, which the integration answers with 503 and
``Retry-After``, and the holders go on within the server's grace time.

The hook chains to the handler it found, whatever installed it: a Python function
(uvicorn's), or asyncio's own (hypercorn's ``loop.add_signal_handler``: asyncio learns
of the signal through its wakeup file descriptor, which a Python handler of ours keeps
writing, so its callback still runs). It is installed only from the main thread (the
only one that may set handlers), and removed when the manager closes, unless something
replaced it meanwhile.

hypercorn's worker processes get no signal: the parent catches it and sets a
multiprocessing event that each worker polls (every 0.1 s) before it shuts down
gracefully. A worker finds that event among the arguments its process was started with,
so in a hypercorn worker the hook polls it too, at the same pace.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

__all__ = ["RETRY_AFTER", "SIGNALS", "StopOnSignals"]

logger = logging.getLogger("aiolock")

#: the signals a server stops on
SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: seconds a client is asked to wait before retrying a request answered 503 (the
#: ``Retry-After`` header): on a rolling deploy, the next instance is about to serve
RETRY_AFTER = "1"

Handler = Callable[[int, FrameType | None], Any] | int | None


class StopOnSignals:
    """Calls *stop* (in the event loop) when SIGTERM or SIGINT arrives, then the handler
    that was there before."""

    def __init__(self, stop: Callable[[], None]) -> None:
        self._stop = stop
        self._previous: dict[int, Handler] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watch: asyncio.Task[None] | None = None

    def install(self) -> bool:
        """Hook the signals; False (and nothing done) outside the main thread."""
        if threading.current_thread() is not threading.main_thread():
            logger.debug("aiolock: not in the main thread, so no shutdown signal hook")
            return False
        self._loop = asyncio.get_running_loop()
        event = _hypercorn_shutdown_event()
        if event is not None:
            self._watch = self._loop.create_task(self._poll(event), name="aiolock-shutdown")
        for sig in SIGNALS:
            previous = signal.getsignal(sig)
            if previous in (signal.SIG_DFL, signal.SIG_IGN, None):
                # Nothing stops gracefully on it (the default ends the process at once):
                # there is nothing to answer 503 before.
                continue
            self._previous[sig] = previous
            signal.signal(sig, self._on_signal)
        return True

    def remove(self) -> None:
        """Put back the handlers found, where ours is still the one installed."""
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        for sig, previous in self._previous.items():
            if signal.getsignal(sig) == self._on_signal:
                signal.signal(sig, previous)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # A signal handler runs between two bytecodes of the main thread, maybe inside
        # the event loop's own code: the stop is scheduled, not run here.
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop)
        previous = self._previous.get(signum)
        if callable(previous):
            previous(signum, frame)

    async def _poll(self, event: Any) -> None:
        # A multiprocessing event set by another process: nothing in this loop can be
        # told of it, so it is polled, as hypercorn's own worker polls it.
        while not event.is_set():  # noqa: ASYNC110
            await asyncio.sleep(HYPERCORN_POLL)
        logger.debug("aiolock: hypercorn is shutting this worker down: stop acquiring")
        self._stop()


#: seconds between two looks at hypercorn's shutdown event (hypercorn's own pace)
HYPERCORN_POLL = 0.1


def _hypercorn_shutdown_event() -> Any | None:
    """The event hypercorn's parent sets to stop this worker process, or None when this
    process is not one of hypercorn's workers (its ``--workers 0``, or another server)."""
    process = multiprocessing.current_process()
    target = getattr(process, "_target", None)
    if not getattr(target, "__module__", "").startswith("hypercorn."):
        return None
    event = (getattr(process, "_kwargs", None) or {}).get("shutdown_event")
    return event if callable(getattr(event, "is_set", None)) else None
