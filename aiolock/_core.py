"""The lock protocol: acquire, wait, release and undo, on top of the scripts and the hub.

:class:`LockCore` is created when a manager opens and holds what the protocol needs: the
client, the hold registry, the pub/sub hub, the watchdog and the cleanup retrier. The
public :class:`~aiolock.Lock` handle validates arguments and delegates here.

Acquire: one script call (fast path). If the lock is busy, or other local tasks already
queue for it, the task joins the lock's local queue; the head of the queue retries after
the subscription is confirmed (closing the lost-wake-up gap), then sleeps until a
release wakes it or the holder's lease would have run out. An attempt cancelled or
failed in flight is undone by a script that either reverts it or voids it in advance.

Release: one script call; it is idempotent, so a release interrupted by a cancellation
is simply sent again, shielded and bounded in time. The last release of a hold hands the
lock straight to the head of the local queue when that is fair (see release.lua).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

from ._cleanup import Cleanup, finish_despite_cancel
from ._client import Client, as_int, key_type_error
from ._errors import (
    LockConnectionError,
    LockError,
    LockLostError,
    LockPermissionError,
    LockTimeoutError,
    ManagerNotOpenError,
)
from ._hold import Hold
from ._keys import KeySpace, LockKeys
from ._renewal import HoldRegistry, Watchdog
from ._scripts import ACQUIRE, CANCEL, FORCE_RELEASE, RELEASE, RENEW
from ._waiters import Waiter, WaiterHub

if TYPE_CHECKING:
    from ._manager import LockManager

logger = logging.getLogger("aiolock")

__all__ = ["LockCore"]

#: Seconds the head of a queue waits for its subscription to be confirmed before it
#: retries anyway (the pub/sub connection may be down; it then falls back to TTL waits).
READY_WAIT = 1.0
#: Seconds a shielded undo or release may take before it is handed to the retrier.
SHIELD_TIMEOUT = 5.0
#: A void marker outlives any plausible delay of the attempt it voids.
MIN_VOID_TTL = 60.0
#: After a release that other clients listen for, this manager's tasks keep off the lock
#: until each other listener has had a turn, or for at most this long, so that waiters
#: elsewhere (woken by the message, later than a local task could be) get their turn.
YIELD_WINDOW = 0.02
#: Hand-overs in a row within this manager while other clients wait for the same lock:
#: a few keep the fast local path (one round trip per hand-over); a bound keeps it fair.
MAX_LOCAL_STREAK = 2

_ACQUIRED, _REENTERED, _BUSY, _VOIDED, _BAD_LOCK_KEY, _BAD_META_KEY = 1, 2, 0, 3, -1, -2
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


_Send = Callable[[], Awaitable[object]]


_YIELD_US = round(YIELD_WINDOW * 1_000_000)


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


class LockCore:
    def __init__(self, manager: LockManager, client: Client, keyspace: KeySpace) -> None:
        self.manager = manager
        self.client = client
        self.keyspace = keyspace
        self.registry = HoldRegistry(on_lost=self._on_lost)
        self.hub = WaiterHub(client.redis, keyspace.manager_id)
        self.watchdog = Watchdog(client, self.registry, manager.lease)
        self.cleanup = Cleanup()
        self._ids = itertools.count(1)
        self._meta_ttl_ms = _ms(manager.fence_ttl)

    def _on_lost(self, hold: Hold) -> None:
        # The lock may be free now (or soon): the local head should try for it.
        self.hub.wake(hold.keys.channel)

    # -- acquire -----------------------------------------------------------------------

    async def acquire(
        self, keys: LockKeys, owner: str, timeout: float | None, lease: float | None
    ) -> Hold:
        hold = self.registry.get(keys.lock, owner)
        if hold is not None:
            return await self._reenter(hold, lease)
        deadline = None if timeout is None else time.monotonic() + timeout
        # A task that finds others queued goes behind them (no barging), unless it only
        # wants one attempt.
        if timeout == 0 or not self.hub.queued(keys.channel):
            hold, _ = await self._attempt(keys, owner, lease)
            if hold is not None:
                return hold
            if timeout == 0:
                raise self._timeout_error(keys, timeout)
        return await self._wait(keys, owner, lease, deadline, timeout)

    async def _reenter(self, hold: Hold, lease: float | None) -> Hold:
        if hold.renew:
            lease = self.manager.lease  # the outer hold decides: it stays auto-renewed
        elif lease is None:
            lease = hold.lease
        new, busy_ttl = await self._attempt(hold.keys, hold.owner, lease, hold)
        if new is None:  # ours ended before we noticed: the lock is someone else's, or free
            now = (
                f"now held by another owner for {busy_ttl:.3f} s more"
                if busy_ttl > 0
                else "it had expired"
            )
            self.registry.lose(hold, f"it was gone when the task re-entered it ({now})")
            self.registry.pop_lost(hold.keys.lock, hold.owner)  # reported here, once
            raise LockLostError(
                f"lock {hold.keys.name!r} was lost before this task re-entered it ({now}); "
                "another owner may have entered the critical section meanwhile"
            )
        return new

    async def _wait(
        self,
        keys: LockKeys,
        owner: str,
        lease: float | None,
        deadline: float | None,
        timeout: float | None,
    ) -> Hold:
        waiter = self.hub.join(keys.channel, owner, lease)
        acquired = False
        try:
            # The first waiter tries once its subscription is confirmed (the confirmation
            # wakes it); later ones wait for their turn.
            should_try = waiter.is_head and self.hub.confirmed(keys.channel)
            ttl: float | None = READY_WAIT if waiter.is_head else None
            while True:
                if waiter.handed is not None:  # a local releaser handed the lock over
                    acquired = True
                    return waiter.handed
                if self.hub.closed:
                    raise self.manager_closed()
                if self.hub.failure is not None:
                    raise LockPermissionError(self.hub.failure)
                if should_try:
                    hold, busy_ttl = await self._attempt(keys, owner, lease)
                    if hold is not None:
                        acquired = True
                        return hold
                    ttl = busy_ttl if busy_ttl > 0 else self.manager.lease
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise self._timeout_error(keys, timeout)
                should_try = (
                    await waiter.wait(_shortest(remaining, ttl) if waiter.is_head else remaining)
                    or waiter.is_head
                )
        finally:
            self.hub.leave(waiter, acquired=acquired)
            if not acquired and waiter.handed is not None:
                # The lock was handed over just as this task gave up: pass it on.
                await self._release_quietly(waiter.handed, pass_on=True)

    async def _attempt(
        self, keys: LockKeys, owner: str, lease: float | None, hold: Hold | None = None
    ) -> tuple[Hold | None, float]:
        """One run of the acquire script: (hold, 0.0) on success, (None, ttl) if busy.

        With *hold*, the attempt re-enters it; otherwise it is a new acquisition under a
        hash field of its own (the owner plus this attempt's number).
        """
        lease_s = self.manager.lease if lease is None else lease
        attempt = next(self._ids)
        field = f"{owner}:{attempt}" if hold is None else hold.field
        count = 0 if hold is None else hold.count
        # Unique across clients: a marker left by another process's cancelled attempt
        # must never void this one.
        void = keys.void(f"{self.keyspace.manager_id}:{attempt}")
        args = (field, _ms(lease_s), count, self._meta_ttl_ms, self.keyspace.manager_id)
        sent_at = time.monotonic()
        try:
            code, value = await self.client.run(ACQUIRE, (keys.lock, keys.meta, void), args)
        except (LockConnectionError, asyncio.CancelledError):
            await self._undo(keys, field, count, void, lease_s)  # it may have run
            raise
        code = as_int(code)
        if code in (_BUSY, _VOIDED):
            return None, max(as_int(value), 0) / 1000
        if code == _BAD_LOCK_KEY:
            raise key_type_error(keys.lock, value)
        if code == _BAD_META_KEY:
            raise key_type_error(keys.meta, value)
        if hold is not None:  # a re-entry
            if code != _REENTERED:
                # The lock was free: the hold being re-entered had already ended, and the
                # script took the lock anew. That is not a re-entry: give it back.
                await self._release_quietly(hold)
                return None, 0.0
            hold.count = as_int(value)
            if not hold.renew:
                self.registry.reset_lease(hold, lease_s, sent_at)
            return hold, 0.0
        hold = Hold(keys, owner, field, as_int(value), lease_s, lease is None, sent_at)
        self.registry.add(hold)
        if self.hub.closed:  # the manager closed while the attempt was in flight
            self.registry.lose(hold, "the LockManager was closed")
            await self._release_quietly(hold)
            raise self.manager_closed()
        return hold, 0.0

    async def _undo(
        self, keys: LockKeys, field: str, count: int, void: str, lease_s: float
    ) -> None:
        """Revert an attempt whose outcome is unknown, or void it before it runs."""
        args = (
            field,
            count,
            _ms(max(2 * lease_s, MIN_VOID_TTL)),
            keys.channel,
            self.keyspace.manager_id,
        )

        async def send() -> None:
            undone = await self.client.run(CANCEL, (keys.lock, void), args)
            if as_int(undone) == 1 and count == 0:
                self.hub.wake(keys.channel)  # our own message is ignored by the hub

        give_up_at = time.monotonic() + lease_s

        def retry_later() -> None:
            self.cleanup.add(f"undo of an acquire of {keys.name!r}", send, give_up_at)

        await finish_despite_cancel(lambda: _send_or(send, retry_later))

    # -- release -----------------------------------------------------------------------

    async def release(self, hold: Hold) -> None:
        """Release one hold; the last one frees the lock or hands it to the next local waiter."""
        if hold.count > 1:
            await self._release_one(hold)
            return
        if hold.release_id is None:
            hold.release_id = self.keyspace.release_id(next(self._ids))
        handoff = self._reserve_successor(hold)
        args = self._release_args(hold, 1, hold.release_id, handoff)
        what = f"release of {hold.keys.name!r}"

        async def send() -> LockError | None:
            reply = await self.client.run(RELEASE, hold.keys.pair, args)
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
            self.registry.park(hold)
            self.cleanup.add(what, send, hold.valid_until)
            if handoff is not None:  # the queue's head fends for itself meanwhile
                handoff.waiter.reserved = False
                self.hub.wake(hold.keys.channel)

        try:
            error = await send()
        except asyncio.CancelledError:
            # The command may or may not have run; sending it again is harmless.
            await finish_despite_cancel(lambda: _send_or(send, hand_over))
            raise
        except LockConnectionError:
            hand_over()
            raise
        if error is not None:
            raise error

    def _reserve_successor(self, hold: Hold) -> _Handoff | None:
        waiter = self.hub.successor(hold.keys.channel)
        if waiter is None:
            return None
        waiter.reserved = True
        lease = self.manager.lease if waiter.lease is None else waiter.lease
        field = f"{waiter.owner}:{next(self._ids)}"
        return _Handoff(hold.keys, waiter, field, lease, waiter.lease is None, time.monotonic())

    async def _deliver(self, handoff: _Handoff, token: int) -> None:
        """Redis handed the lock to *handoff*'s waiter: give it the hold, or pass it on."""
        waiter = handoff.waiter
        hold = Hold(handoff.keys, waiter.owner, handoff.field, token,
                    handoff.lease, handoff.renew, handoff.sent_at)  # fmt: skip
        self.registry.add(hold)
        if waiter.left or self.hub.closed:  # it gave up meanwhile
            await self._release_quietly(hold, pass_on=True)
        else:
            waiter.give(hold)

    async def _release_one(self, hold: Hold) -> None:
        """Release one of several holds: only the count changes, and the client's count rules.

        The script sets the count to the client's count minus one, and the final release
        deletes the lock whatever the count, so an unconfirmed decrement needs no retry:
        the local count goes down regardless, and a lost or resent command changes nothing
        that matters.
        """
        args = self._release_args(hold, hold.count, "-")
        hold.count -= 1  # whatever becomes of the command, even if it is cancelled
        try:
            reply = await self.client.run(RELEASE, hold.keys.pair, args)
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
        code, value = as_int(reply[0]), reply[1]
        if code == _STILL_HELD:
            hold.count = as_int(value)
            return None
        self.registry.remove(hold)
        self.registry.unpark(hold)
        hold.release_id = None
        if code == _RELEASED:
            hold.count = 0
            if as_int(value) == 1:  # others listen: our own tasks yield to them for a while
                self.hub.wake_later(hold.keys.channel, YIELD_WINDOW)
            else:
                self.hub.wake(hold.keys.channel)
            return None
        if code == _HANDED_OVER:
            hold.count = 0
            return None
        if not hold.lost:
            self.registry.lose(hold, "Redis no longer had it when it was released")
        self.registry.pop_lost(hold.keys.lock, hold.owner)
        if code == _NOT_HELD:
            return LockLostError(
                f"lock {hold.keys.name!r} was no longer held by this task when it was "
                "released: its lease ended or it was force-released, so another owner may "
                "have entered the critical section"
            )
        return key_type_error(hold.keys.lock, value)

    def release_lost(self, hold: Hold) -> None:
        """A hold lost locally may still exist in Redis: free it in the background."""
        args = self._release_args(hold, 1, self.keyspace.release_id(next(self._ids)))

        async def send() -> None:
            reply = await self.client.run(RELEASE, hold.keys.pair, args)
            if as_int(reply[0]) == _RELEASED:
                self.hub.wake(hold.keys.channel)  # our own message is ignored by the hub

        self.cleanup.add(f"release of lost {hold.keys.name!r}", send, time.monotonic() + hold.lease)

    # -- extend, force release, shutdown -----------------------------------------------

    async def extend(self, hold: Hold, lease: float) -> None:
        sent_at = time.monotonic()
        reply = await self.client.run(RENEW, (hold.keys.lock,), (_ms(lease), hold.field))
        if as_int(reply[0]) == 1:
            self.registry.reset_lease(hold, lease, sent_at)
            return
        self.registry.lose(hold, "Redis no longer had it when it was extended")
        self.registry.pop_lost(hold.keys.lock, hold.owner)
        raise LockLostError(
            f"lock {hold.keys.name!r} could not be extended: its lease had already ended "
            "or it was force-released"
        )

    async def force_release(self, keys: LockKeys) -> bool:
        code, value = await self.client.run(
            FORCE_RELEASE, (keys.lock,), (keys.channel, self.keyspace.manager_id)
        )
        if as_int(code) == -1:
            raise key_type_error(keys.lock, value)
        for hold in self.registry:
            if hold.keys.lock == keys.lock:
                self.registry.lose(hold, "it was force-released")
        self.hub.wake(keys.channel)
        return as_int(code) == 1

    async def shutdown(self) -> None:
        """Release every hold (all counts at once) and fail the bodies still using them."""
        holds = list(self.registry)
        for hold in holds:
            self.registry.lose(hold, "the LockManager was closed")
        limiter = anyio.CapacityLimiter(16)  # a few connections, not one per hold

        async def release(hold: Hold) -> None:
            async with limiter:
                await self._release_quietly(hold)

        async with anyio.create_task_group() as tg:
            for hold in holds:
                tg.start_soon(release, hold)

    def _release_args(
        self, hold: Hold, count: int, release_id: str, handoff: _Handoff | None = None
    ) -> tuple[str | int, ...]:
        """ARGV of release.lua; *count* 1 releases the hold whatever its count in Redis."""
        listening = 1 if self.hub.listening(hold.keys.channel) else 0
        return (hold.field, count, release_id, hold.keys.channel, self.keyspace.manager_id,
                self._meta_ttl_ms, handoff.field if handoff else "",
                _ms(handoff.lease) if handoff else 0, _YIELD_US, MAX_LOCAL_STREAK,
                listening)  # fmt: skip

    async def _release_quietly(self, hold: Hold, *, pass_on: bool = False) -> None:
        """Release *hold* entirely, logging instead of raising; *pass_on* may hand it over."""
        try:
            if pass_on:
                hold.count = 1
                await self.release(hold)
            else:
                release_id = self.keyspace.release_id(next(self._ids))
                await self.client.run(
                    RELEASE, hold.keys.pair, self._release_args(hold, 1, release_id)
                )
        except LockError as exc:
            hold.lost_reason += f"; releasing it failed, it expires by its lease: {exc}"
            logger.warning("could not release lock %r: %s", hold.keys.name, exc)

    # -- errors ------------------------------------------------------------------------

    def manager_closed(self) -> ManagerNotOpenError:
        return ManagerNotOpenError(
            "the LockManager was closed while this task waited for a lock; "
            "open a new LockManager to keep using locks"
        )

    @staticmethod
    def _timeout_error(keys: LockKeys, timeout: float | None) -> LockTimeoutError:
        return LockTimeoutError(
            f"lock {keys.name!r} is held by another owner and was not released within "
            f"{timeout} s; pass a longer timeout, or timeout=None to wait as long as it takes"
        )


async def _send_or(send: _Send, otherwise: Callable[[], None]) -> None:
    """Send within SHIELD_TIMEOUT; if Redis cannot be reached, call *otherwise*."""
    try:
        with anyio.fail_after(SHIELD_TIMEOUT):
            await send()
    except (LockError, TimeoutError):
        otherwise()


def _shortest(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)
