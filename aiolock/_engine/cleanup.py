"""Work that must finish: shielded completion, and background retries for what could not.

Two hazards meet here. A command cancelled after it was written may still run on the
server, so an acquire cancelled in flight has to be undone and a release interrupted by
a cancellation has to be completed. And Redis may be unreachable at that moment, so
what cannot be done now is retried in the background until it succeeds or no longer
matters (the lease it protects has surely run out).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import anyio
import anyio.lowlevel

from aiolock._errors import LockError

__all__ = ["SHIELD_TIMEOUT", "Cleanup", "finish_despite_cancel", "send_or"]

logger = logging.getLogger("aiolock")
T = TypeVar("T")

#: Seconds a shielded undo or release may take before it is handed to the retrier.
SHIELD_TIMEOUT = 5.0


async def finish_despite_cancel(make: Callable[[], Awaitable[T]]) -> T:
    """Run ``make()`` to completion even if the calling task is cancelled meanwhile.

    The work runs in a task of its own (``make`` must bound its own time); a cancellation
    of the caller is held back until that task ends, then re-raised, so the caller still
    unwinds. The work is awaited, never left running unobserved.
    """
    task = asyncio.ensure_future(make())
    cancelled = False
    # Shielded from anyio: a cancelled anyio scope re-delivers its cancellation at every
    # await, which turned this loop into a busy spin for as long as Redis took. A native
    # task.cancel() still arrives here, once, and is re-raised when the work is done; an
    # anyio cancellation takes effect at the checkpoint below.
    with anyio.CancelScope(shield=True):
        while not task.done():
            try:
                await asyncio.wait((task,))
            except asyncio.CancelledError:
                cancelled = True
    if cancelled:
        if not task.cancelled():
            task.exception()  # mark it retrieved: the caller sees the cancellation instead
        raise asyncio.CancelledError
    if not task.cancelled() and task.exception() is None:
        await anyio.lowlevel.checkpoint_if_cancelled()
    return task.result()


async def send_or(
    send: Callable[[], Awaitable[object]],
    otherwise: Callable[[], None],
    until: float | None = None,
) -> None:
    """Send within SHIELD_TIMEOUT (and by *until*, monotonic, if given); if Redis cannot be
    reached in that time, call *otherwise*.

    *until* is the deadline of the wait that sends it: a caller whose timeout has passed
    is not held back for it; the background retries see it through (*otherwise*).
    """
    limit = SHIELD_TIMEOUT
    if until is not None:
        limit = min(limit, until - time.monotonic())
        if limit <= 0:
            otherwise()
            return
    try:
        with anyio.fail_after(limit):
            await send()
    except (LockError, TimeoutError):
        otherwise()


@dataclass
class _Job:
    what: str
    action: Callable[[], Awaitable[object]]
    #: monotonic time after which the job no longer matters (the lease has run out, and
    #: what it compensates can no longer land: see void_ttl_ms)
    give_up_at: float


class Cleanup:
    """Background retries of undo and release commands that failed."""

    def __init__(self) -> None:
        self._jobs: list[_Job] = []
        self._event = asyncio.Event()
        self._trying = 0
        #: releases and undos being sent right now, by the tasks that started them
        self._sending = 0
        #: set when the last send in progress ends, and whenever a try ends, for drain()
        self._quieter = asyncio.Event()
        self.done = 0
        self.abandoned = 0

    def begin(self) -> None:
        """A release or undo is being sent: closing waits for it (pair with :meth:`end`)."""
        self._sending += 1

    def end(self) -> None:
        self._sending -= 1
        if not self._sending:  # what _quiet() waits for (it checks _trying itself)
            self._quieter.set()

    async def drain(self) -> None:
        """Closing: wait for the sends in progress, then try each queued job once more.

        A task cancelled at a graceful shutdown may still be sending its release (or the
        hand-over it set off may still have to be passed on) when the manager closes;
        stopping before it is sent would leave the lock held for a whole lease. Bounded
        by the caller (``close_timeout``); each send bounds itself too.
        """
        await self._quiet()
        if self._jobs:
            await self.run_once()
        await self._quiet()

    async def _quiet(self) -> None:
        while self._sending or self._trying:
            self._quieter.clear()
            await self._quieter.wait()

    @property
    def pending(self) -> int:
        """Jobs waiting for a retry, including those being tried right now."""
        return len(self._jobs) + self._trying

    def add(self, what: str, action: Callable[[], Awaitable[object]], give_up_at: float) -> None:
        self._jobs.append(_Job(what, action, give_up_at))
        self._event.set()

    async def run(self) -> None:
        backoff = 0.05
        while True:
            await self._event.wait()
            self._event.clear()
            failed = await self.run_once()
            if failed:
                self._event.set()
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
            else:
                backoff = 0.05

    async def run_once(self) -> int:
        """Try every job once; return how many are still pending."""
        jobs, self._jobs = self._jobs, []
        self._trying += len(jobs)  # (drain() may run one alongside the loop's)
        for index, job in enumerate(jobs):
            try:
                await job.action()
                self.done += 1
            except (LockError, TimeoutError) as exc:
                if time.monotonic() >= job.give_up_at:
                    self.abandoned += 1
                    logger.warning("gave up on %s (it no longer matters): %s", job.what, exc)
                else:
                    self._jobs.append(job)
            except Exception:
                # A defect rather than Redis away: a retry would fail alike. The other
                # jobs and the retry loop go on; the lock's lease ends it anyway.
                self.abandoned += 1
                logger.exception("gave up on %s after an unexpected error", job.what)
            except BaseException:
                # Cancelled (the manager is closing): this job and the untried ones stay
                # queued and are no longer counted as being tried.
                self._jobs.extend(jobs[index:])
                self._trying -= len(jobs) - index - 1
                raise
            finally:
                self._trying -= 1
                self._quieter.set()
        return len(self._jobs)
