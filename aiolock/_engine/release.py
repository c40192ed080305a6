"""The release path: the final release and its hand-over, nested and background releases.

:class:`ReleasePath` owns the releases of one open manager. The last release of a hold
frees the lock or, when a task of this manager waits for it, hands it straight over in
the same script (:meth:`ReleasePath._reserve_successor`, :meth:`ReleasePath._deliver`). A
final release with nobody to hand the lock to takes the fast path's step
(:class:`~aiolock._engine.fast.FastRelease`), which uses this path's parts. A release
that cannot be confirmed is retried in the background while its hold is parked; a hold
whose task ended is released there too (the path watches the owners of new holds:
:meth:`ReleasePath.watch`). It is made from the engine's shared parts
(:class:`~aiolock._engine.state.EngineState`) alone; the overview of the whole protocol
is in :mod:`aiolock._engine.engine`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass
from typing import Any, NoReturn

from aiolock._engine.cleanup import finish_despite_cancel, send_or
from aiolock._engine.fast import FastRelease
from aiolock._engine.hub import MAX_LOCAL_STREAK, YIELD_WINDOW
from aiolock._engine.kind import Hold, Released, ReleaseStatus, Successor
from aiolock._engine.runtime import TOMBSTONE_TTL
from aiolock._engine.state import ORPHAN, EngineState
from aiolock._engine.waiter import Waiter
from aiolock._errors import LockConnectionError, LockError, LockKeyTypeError, LockLostError

__all__ = ["MAX_LOCAL_STREAK", "UNNAMED_RELEASE", "YIELD_WINDOW", "ReleasePath"]

logger = logging.getLogger("aiolock")

#: The release id of a kind whose final release names no tombstone (a valid id's shape,
#: ``<manager id>:<number>``, never made by a manager: its id is never empty).
UNNAMED_RELEASE = ":0"

#: The task-exit warning for a hold whose 'async with' block is still open: the task
#: left it suspended, at a yield.
_LEFT_OPEN = (
    "Its 'async with' block is still open: the lock is held across a 'yield' (an async "
    "generator, a streaming response's body) that the task stopped iterating without "
    "closing it. Close the generator (contextlib.aclosing), or see docs/semantics.md "
    "for streaming responses"
)
#: The task-exit warning for a hold acquired without 'async with', never released.
_NEVER_RELEASED = (
    "A hold belongs to the task that acquired it: a likely cause is a helper that runs "
    "the acquire in a task of its own (asyncio.wait_for on Python 3.10/3.11, "
    "create_task, gather), or a missing release()"
)


@dataclass(frozen=True)
class _Handoff:
    """A local waiter chosen to receive the lock from a final release."""

    waiter: Waiter
    successor: Successor
    renew: bool
    sent_at: float


class ReleasePath:
    """Releases of holds, hand-overs to local waiters, and holds whose task ended.

    Made from the engine's shared parts; it keeps of them what it uses, and owns the
    owners it watches and the count of holds released on their task's exit.
    """

    def __init__(self, state: EngineState) -> None:
        self.rt = state.rt
        self.hub = state.hub
        self.registry = state.registry
        self.cleanup = state.cleanup
        self.observers = state.observers
        self._ended = state.ended
        self._lost = state.lost
        #: owners whose task is watched: its end releases what it still holds
        self.watched: set[str] = set()
        #: holds released because the task that held them ended
        self.released_on_task_exit = 0
        #: the fast path's step: a final release with nobody to hand the lock to
        self.fast = FastRelease(self)
        self._release_fast = self.fast.release  # (bound: no lookup through self.fast)

    # -- owner tasks that end while holding --------------------------------------------

    def watch(self, task: asyncio.Task[Any], owner: str) -> None:
        """Release what *owner* still holds when *task* (its task) ends."""
        self.watched.add(owner)
        task.add_done_callback(lambda t: self._task_done(t, owner))

    def _task_done(self, task: asyncio.Task[object], owner: str) -> None:
        self.watched.discard(owner)
        # No task can ask about its lost holds now; what it still holds is released here.
        for hold in self.registry.forget_owner(owner):
            self.released_on_task_exit += 1
            # Name the kind: a semaphore's permits are no "lock" to whoever reads this.
            what = "a permit of semaphore" if hold.kind.name == "semaphore" else hold.kind.name
            logger.warning(
                "%s %r was still held by task %r when the task ended; aiolock releases it now. %s",
                what,
                hold.keys.name,
                task.get_name(),
                _LEFT_OPEN if hold.scopes else _NEVER_RELEASED,
            )
            self.registry.remove(hold)
            self._ended(hold)
            hold.owner = ORPHAN
            self._release_in_background(hold, "release of a hold whose task ended")

    # -- release -----------------------------------------------------------------------

    def release(self, hold: Hold) -> Coroutine[Any, Any, None]:
        """Release one hold; the last one frees the lock or hands it to the next local
        waiter (awaitable: the coroutine that does the work, no layer of its own).

        A final release with nobody of this manager waiting for the lock takes the fast
        path's step (:class:`~aiolock._engine.fast.FastRelease`); the rest, this path's
        own release (a nested one, a hand-over, observers, a closing manager).
        """
        hub = self.hub
        if (
            hold.count != 1
            or hub.closed
            or self.observers.active
            or not hub.idle(hold.keys.channel)
        ):
            return self._release(hold)
        return self._release_fast(hold)

    async def _release(self, hold: Hold) -> None:
        # Closing waits for the releases in progress (Cleanup.drain): a holder cancelled
        # at a graceful shutdown may still be sending its release, or passing on a
        # hand-over to a waiter that gave up, when the manager closes.
        self.cleanup.begin()
        try:
            await self._release_one(hold)
        finally:
            self.cleanup.end()

    async def _release_one(self, hold: Hold) -> None:
        if hold.count > 1:
            await self._release_nested(hold)
            return
        release_id = self.release_id(hold)  # every resend, from any path, uses it
        handoff = self._reserve_successor(hold)
        try:
            error = await self._send(hold, release_id, handoff)
        except BaseException as exc:
            await self.unconfirmed(hold, release_id, handoff, exc)
            raise
        if error is not None:
            self.registry.pop_lost(hold.resource, hold.owner)  # reported right here
            raise error

    async def _send(
        self, hold: Hold, release_id: str, handoff: _Handoff | None
    ) -> LockError | None:
        """Send *hold*'s final release and apply its outcome; the error to raise, if any."""
        outcome = await self.send_final(hold, release_id, handoff)
        if handoff is not None:
            handoff.waiter.unreserve()
        error = self.apply_release(hold, outcome)
        if handoff is not None and outcome.status is ReleaseStatus.HANDED_OVER:
            await self._deliver(hold, handoff, outcome.value)
        return error

    async def unconfirmed(
        self, hold: Hold, release_id: str, handoff: _Handoff | None, exc: BaseException
    ) -> None:
        """The final release of *hold* raised *exc* (the caller raises it again after this).

        Shared by this path's release and the fast path's (:mod:`aiolock._engine.fast`),
        so that a release cancelled or cut off in flight is settled one way whichever
        path sent it.
        """

        def send() -> Awaitable[LockError | None]:
            return self._send(hold, release_id, handoff)

        def hand_over() -> None:
            # Unconfirmed: the retrier owns the hold now. Parked, it no longer counts as
            # held, so this task's next acquire takes a new field and simply waits for
            # the old hold to be released (or to expire): it never re-enters it.
            self.registry.park(hold)
            self._ended(hold)  # for its owner, the hold ends here
            what = f"release of {hold.keys.name!r}"
            self.cleanup.add(what, send, max(hold.valid_until, time.monotonic()))
            if handoff is not None:  # the queue's head fends for itself meanwhile
                handoff.waiter.unreserve()
                self.hub.wake(hold.keys.channel)

        if isinstance(exc, asyncio.CancelledError):
            # The command may or may not have run; sending it again is harmless.
            await finish_despite_cancel(lambda: send_or(send, hand_over))
        elif isinstance(exc, LockConnectionError):
            hand_over()
        elif isinstance(exc, LockKeyTypeError):
            self.registry.unpark(hold, settled=False)
            self.registry.lose_reported(hold, "its key was replaced by a value of another type")

    def release_id(self, hold: Hold) -> str:
        """The id of *hold*'s final release, made when it is first sent (a placeholder
        for a kind whose release names no tombstone: see ``LockKind.release_tombstones``);
        while it is set, a final release of the hold is in flight or parked."""
        if hold.release_id is None:
            hold.release_id = (
                f"{self.rt.manager_id}:{self.rt.next_id()}"
                if hold.kind.release_tombstones
                else UNNAMED_RELEASE
            )
            hold.release_sent_at = time.monotonic()
        return hold.release_id

    def send_final(
        self, hold: Hold, release_id: str, handoff: _Handoff | None = None
    ) -> Awaitable[Released]:
        """The kind's final release of *hold* (awaitable; no coroutine layer of its own)."""
        channel = hold.keys.channel
        if handoff is None:
            # hand_over_freely is about the successor only (LockKind.release): without one
            # the hub's streak is not asked for: every fast release comes here
            return hold.kind.release(hold, 1, release_id, None, False, self.hub.listening(channel))
        return hold.kind.release(
            hold,
            1,
            release_id,
            handoff.successor,
            self.hub.hand_over_freely(channel),
            self.hub.listening(channel),
        )

    def _reserve_successor(self, hold: Hold) -> _Handoff | None:
        if not hold.kind.hand_over:
            return None
        waiter = self.hub.reserve_successor(hold.keys.channel)
        if waiter is None:
            return None
        lease = self.rt.lease if waiter.lease is None else waiter.lease
        field = hold.kind.hold_field(waiter.owner, self.rt.next_id())
        return _Handoff(waiter, Successor(field, lease), waiter.lease is None, time.monotonic())

    async def _deliver(self, hold: Hold, handoff: _Handoff, token: int) -> None:
        """Redis handed the lock to *handoff*'s waiter: give it the hold, or pass it on."""
        waiter, successor = handoff.waiter, handoff.successor
        new = Hold(hold.kind, hold.keys, waiter.owner, successor.field, token,
                   successor.lease, handoff.renew, handoff.sent_at, hold.permits)  # fmt: skip
        if not self.hub.deliver(waiter, new):  # it gave up meanwhile: it must never see it
            new.owner = ORPHAN
            await self.release_quietly(new, pass_on=True)

    async def _release_nested(self, hold: Hold) -> None:
        """Release one of several holds: only the count changes, and the client's count rules.

        The script sets the count to the client's count minus one, and the final release
        deletes the lock whatever the count, so an unconfirmed decrement needs no retry:
        the local count goes down regardless, and a lost or resent command changes nothing
        that matters.
        """
        count = hold.count
        hold.count -= 1  # whatever becomes of the command, even if it is cancelled
        try:
            outcome = await hold.kind.release(hold, count, "-", None, False, False)
        except LockConnectionError as exc:
            logger.warning(
                "lock %r: a nested release was not confirmed (%s); the outer "
                "release will settle it",
                hold.keys.name,
                exc,
            )
            return
        error = self.apply_release(hold, outcome)
        if error is not None:
            self.registry.pop_lost(hold.resource, hold.owner)  # reported right here
            raise error

    def apply_release(self, hold: Hold, outcome: Released) -> LockError | None:
        """Update local state from a release's outcome; the error to raise, if any."""
        status = outcome.status
        if status is ReleaseStatus.STILL_HELD:
            hold.count = outcome.value
            return None
        self.registry.remove(hold, status is not ReleaseStatus.NOT_HELD)  # and unpark it
        if hold.observed_at is not None and status is not ReleaseStatus.NOT_HELD:
            self._ended(hold)  # (NOT_HELD: the loss below reports it)
        channel = hold.keys.channel
        if status is ReleaseStatus.RELEASED:
            hold.count = 0
            hold.release_id = None
            # (outcome.value: the clients that heard it)
            self.hub.released(channel, queued=hold.kind.queued, heard=outcome.value > 0)
            return None
        if status is ReleaseStatus.HANDED_OVER:
            hold.count = 0
            hold.release_id = None
            self.hub.handed_over(channel)
            return None
        late = time.monotonic() - hold.release_sent_at > TOMBSTONE_TTL
        hold.release_id = None
        # Remembered: a background retry has nobody to raise to, so the owner's next
        # release() reports it; a caller that raises the error itself forgets it.
        self.registry.lose(hold, "Redis no longer had it when it was released")
        return LockLostError(
            f"lock {hold.keys.name!r} was no longer held by this task when it was "
            "released: its lease ended or it was force-released, so another owner may "
            "have entered the critical section"
            + (
                f" (or this release ran more than {TOMBSTONE_TTL:.0f} s ago and its reply was lost)"
                if late
                else ""
            )
        )

    def lost_at_birth(self, hold: Hold) -> NoReturn:
        """*hold*'s lease ended (by this client's clock) before the reply that granted it
        arrived: Redis may have freed it already, so it is never handed to the caller."""
        hold.lost = True
        hold.lost_reason = "its lease had ended before the reply that granted it arrived"
        self._lost[hold.kind.name] += 1
        logger.warning("lock %r lost: %s", hold.keys.name, hold.lost_reason)
        self.release_lost(hold)  # in case Redis still has it
        raise LockLostError(
            f"lock {hold.keys.name!r} was granted, but its lease of {hold.lease:g} s had "
            "ended before the reply arrived (Redis or the network was slow, or the event "
            "loop was blocked); it is given back and nothing is held. Try again, or give "
            "a longer lease="
        )

    def release_lost(self, hold: Hold) -> None:
        """A hold lost locally may still exist in Redis: free it in the background."""
        if self.hub.closed:
            return  # closing released what it could; nothing would run this job now
        self._release_in_background(hold, f"release of lost {hold.keys.name!r}")

    def _release_in_background(self, hold: Hold, what: str) -> None:
        release_id = self.release_id(hold)
        self.cleanup.add(what, lambda: self._free(hold, release_id), time.monotonic() + hold.lease)

    async def _free(self, hold: Hold, release_id: str) -> None:
        """Send *hold*'s final release (no hand-over); wake the local head if it freed it."""
        outcome = await self.send_final(hold, release_id)
        if outcome.status is ReleaseStatus.RELEASED and not hold.kind.queued:
            self.hub.wake(hold.keys.channel)  # our own message is ignored by the hub

    async def release_quietly(self, hold: Hold, *, pass_on: bool = False) -> None:
        """Release *hold* entirely, logging instead of raising; *pass_on* may hand it over."""
        hold.count = 1
        self.cleanup.begin()  # closing waits for it (see _release())
        try:
            if pass_on:
                await self.release(hold)
            else:
                await self._free(hold, self.release_id(hold))
                self.registry.remove(hold)
        except LockError as exc:
            hold.lost_reason += f"; releasing it failed, it expires by its lease: {exc}"
            logger.warning("could not release lock %r: %s", hold.keys.name, exc)
        finally:
            self.cleanup.end()
