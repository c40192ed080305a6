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
"""

from __future__ import annotations

import asyncio
import logging
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

    def install(self) -> bool:
        """Hook the signals; False (and nothing done) outside the main thread."""
        if threading.current_thread() is not threading.main_thread():
            logger.debug("aiolock: not in the main thread, so no shutdown signal hook")
            return False
        self._loop = asyncio.get_running_loop()
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
