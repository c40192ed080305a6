"""Releasing holds: nested and final releases, hand-over to a local waiter, quiet releases.

The last release of a hold runs one script that frees the lock or, when that is fair,
hands it straight to the head of this manager's local queue (see release.lua): one round
trip instead of a release, a wake-up and an acquire. Releases are idempotent (the client
sends its count; a final release leaves its id in the meta hash), so a release
interrupted by a cancellation is sent again, shielded and bounded in time, and one that
cannot reach Redis is retried in the background while its hold is parked.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._cleanup import finish_despite_cancel, send_or
from ._client import as_int, key_type_error
from ._errors import LockConnectionError, LockError, LockLostError
from ._hold import Hold
from ._keys import LockKeys, ms
from ._scripts import RELEASE
from ._waiters import Waiter

if TYPE_CHECKING:
    from ._core import LockCore

__all__ = ["Releaser"]

logger = logging.getLogger("aiolock")

#: After a release that other clients listen for, this manager's tasks keep off the lock
#: until each other listener has had a turn, or for at most this long, so that waiters
#: elsewhere (woken by the message, later than a local task could be) get their turn.
YIELD_WINDOW = 0.02
_YIELD_US = round(YIELD_WINDOW * 1_000_000)
#: Hand-overs in a row within this manager while other clients wait for the same lock:
#: a few keep the fast local path (one round trip per hand-over); a bound keeps it fair.
MAX_LOCAL_STREAK = 2


_STILL_HELD, _RELEASED, _NOT_HELD, _HANDED_OVER = 1, 2, 0, 4


@dataclass(frozen=True)
class _Handoff:
    """A local waiter chosen to receive the lock from a final release."""

    keys: LockKeys
    waiter: Waiter
    field: str
    lease: float
    renew: bool
    sent_at: float


class Releaser:
    """The release side of a manager's lock protocol."""

    def __init__(self, core: LockCore) -> None:
        self._core = core

    async def release(self, hold: Hold) -> None:
        """Release one hold; the last one frees the lock or hands it to the next local waiter."""
        core = self._core
        if hold.count > 1:
            await self._release_one(hold)
            return
        if hold.release_id is None:
            hold.release_id = core.keyspace.release_id(next(core.ids))
        handoff = self._reserve_successor(hold)
        args = self._args(hold, 1, hold.release_id, handoff)
        what = f"release of {hold.keys.name!r}"

        async def send() -> LockError | None:
            reply = await core.client.run(RELEASE, hold.keys.pair, args)
            if handoff is not None:
                handoff.waiter.reserved = False
            error = self._apply_release(hold, reply)
            if handoff is not None and as_int(reply[0]) == _HANDED_OVER:
                await self._deliver(handoff, as_int(reply[1]))
            return error

        def hand_over() -> None:
            # Unconfirmed: the retrier owns the hold now. Parked, it no longer counts as
            # held, so this task's next acquire takes a new field and simply waits for
            # the old hold to be released (or to expire): it never re-enters it.
            core.registry.park(hold)
            core.cleanup.add(what, send, hold.valid_until)
            if handoff is not None:  # the queue's head fends for itself meanwhile
                handoff.waiter.reserved = False
                core.hub.wake(hold.keys.channel)

        try:
            error = await send()
        except asyncio.CancelledError:
            # The command may or may not have run; sending it again is harmless.
            await finish_despite_cancel(lambda: send_or(send, hand_over))
            raise
        except LockConnectionError:
            hand_over()
            raise
        if error is not None:
            raise error

    def _reserve_successor(self, hold: Hold) -> _Handoff | None:
        core = self._core
        waiter = core.hub.successor(hold.keys.channel)
        if waiter is None:
            return None
        waiter.reserved = True
        lease = core.manager.lease if waiter.lease is None else waiter.lease
        field = f"{waiter.owner}:{next(core.ids)}"
        return _Handoff(hold.keys, waiter, field, lease, waiter.lease is None, time.monotonic())

    async def _deliver(self, handoff: _Handoff, token: int) -> None:
        """Redis handed the lock to *handoff*'s waiter: give it the hold, or pass it on."""
        core = self._core
        waiter = handoff.waiter
        hold = Hold(handoff.keys, waiter.owner, handoff.field, token,
                    handoff.lease, handoff.renew, handoff.sent_at)  # fmt: skip
        core.registry.add(hold)
        if waiter.left or core.hub.closed:  # it gave up meanwhile
            await self.release_quietly(hold, pass_on=True)
        else:
            waiter.give(hold)

    async def _release_one(self, hold: Hold) -> None:
        """Release one of several holds: only the count changes, and the client's count rules.

        The script sets the count to the client's count minus one, and the final release
        deletes the lock whatever the count, so an unconfirmed decrement needs no retry:
        the local count goes down regardless, and a lost or resent command changes nothing
        that matters.
        """
        core = self._core
        args = self._args(hold, hold.count, "-")
        hold.count -= 1  # whatever becomes of the command, even if it is cancelled
        try:
            reply = await core.client.run(RELEASE, hold.keys.pair, args)
        except LockConnectionError as exc:
            logger.warning(
                "lock %r: a nested release was not confirmed (%s); the outer "
                "release will settle it",
                hold.keys.name,
                exc,
            )
            return
        error = self._apply_release(hold, reply)
        if error is not None:
            raise error

    def _apply_release(self, hold: Hold, reply: Sequence[object]) -> LockError | None:
        """Update local state from the release script's reply; the error to raise, if any."""
        core = self._core
        code, value = as_int(reply[0]), reply[1]
        if code == _STILL_HELD:
            hold.count = as_int(value)
            return None
        core.registry.remove(hold)
        core.registry.unpark(hold)
        hold.release_id = None
        if code == _RELEASED:
            hold.count = 0
            if as_int(value) == 1:  # others listen: our own tasks yield to them for a while
                core.hub.wake_later(hold.keys.channel, YIELD_WINDOW)
            else:
                core.hub.wake(hold.keys.channel)
            return None
        if code == _HANDED_OVER:
            hold.count = 0
            return None
        core.registry.lose_reported(hold, "Redis no longer had it when it was released")
        if code == _NOT_HELD:
            return LockLostError(
                f"lock {hold.keys.name!r} was no longer held by this task when it was "
                "released: its lease ended or it was force-released, so another owner may "
                "have entered the critical section"
            )
        return key_type_error(hold.keys.lock, value)

    def release_lost(self, hold: Hold) -> None:
        """A hold lost locally may still exist in Redis: free it in the background."""
        core = self._core
        args = self._args(hold, 1, core.keyspace.release_id(next(core.ids)))

        async def send() -> None:
            reply = await core.client.run(RELEASE, hold.keys.pair, args)
            if as_int(reply[0]) == _RELEASED:
                core.hub.wake(hold.keys.channel)  # our own message is ignored by the hub

        core.cleanup.add(f"release of lost {hold.keys.name!r}", send, time.monotonic() + hold.lease)

    def _args(
        self, hold: Hold, count: int, release_id: str, handoff: _Handoff | None = None
    ) -> tuple[str | int, ...]:
        """ARGV of release.lua; *count* 1 releases the hold whatever its count in Redis."""
        core = self._core
        listening = 1 if core.hub.listening(hold.keys.channel) else 0
        return (hold.field, count, release_id, hold.keys.channel, core.keyspace.manager_id,
                core.meta_ttl_ms, handoff.field if handoff else "",
                ms(handoff.lease) if handoff else 0, _YIELD_US, MAX_LOCAL_STREAK,
                listening)  # fmt: skip

    async def release_quietly(self, hold: Hold, *, pass_on: bool = False) -> None:
        """Release *hold* entirely, logging instead of raising; *pass_on* may hand it over."""
        core = self._core
        try:
            if pass_on:
                hold.count = 1
                await self.release(hold)
            else:
                release_id = core.keyspace.release_id(next(core.ids))
                await core.client.run(RELEASE, hold.keys.pair, self._args(hold, 1, release_id))
        except LockError as exc:
            hold.lost_reason += f"; releasing it failed, it expires by its lease: {exc}"
            logger.warning("could not release lock %r: %s", hold.keys.name, exc)
