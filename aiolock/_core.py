"""The lock protocol: acquire, wait, release and undo, on top of the scripts and the hub.

:class:`LockCore` is created when a manager opens and holds what the protocol needs: the
client, the hold registry, the pub/sub hub, the watchdog and the cleanup retrier. The
public :class:`~aiolock.Lock` handle validates arguments and delegates here.

Acquire: one script call (fast path). If the lock is busy, or other local tasks already
queue for it, the task joins the lock's local queue; the head of the queue retries after
the subscription is confirmed (closing the lost-wake-up gap), then sleeps until a
release wakes it or the holder's lease would have run out. An attempt cancelled or
failed in flight is undone by a script that either reverts it or voids it in advance.

Release: one script call, in :mod:`aiolock._release`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import TYPE_CHECKING

import anyio

from ._cleanup import Cleanup, finish_despite_cancel, send_or
from ._client import Client, as_int, key_type_error
from ._errors import (
    LockConnectionError,
    LockLostError,
    LockPermissionError,
    LockTimeoutError,
    ManagerNotOpenError,
)
from ._hold import Hold
from ._keys import KeySpace, LockKeys, ms
from ._release import Releaser
from ._renewal import HoldRegistry, Watchdog
from ._scripts import ACQUIRE, CANCEL, FORCE_RELEASE, RENEW
from ._waiters import WaiterHub

if TYPE_CHECKING:
    from ._manager import LockManager

logger = logging.getLogger("aiolock")

__all__ = ["LockCore"]

#: Seconds the head of a queue waits for its subscription to be confirmed before it
#: retries anyway (the pub/sub connection may be down; it then falls back to TTL waits).
READY_WAIT = 1.0
#: A void marker outlives any plausible delay of the attempt it voids.
MIN_VOID_TTL = 60.0
_ACQUIRED, _REENTERED, _BUSY, _VOIDED, _BAD_LOCK_KEY, _BAD_META_KEY = 1, 2, 0, 3, -1, -2


class LockCore:
    def __init__(self, manager: LockManager, client: Client, keyspace: KeySpace) -> None:
        self.manager = manager
        self.client = client
        self.keyspace = keyspace
        self.registry = HoldRegistry(on_lost=self._on_lost)
        self.hub = WaiterHub(client.redis, keyspace.manager_id)
        self.watchdog = Watchdog(client, self.registry, manager.lease)
        self.cleanup = Cleanup()
        self.releaser = Releaser(self)
        self.ids = itertools.count(1)
        self.meta_ttl_ms = ms(manager.fence_ttl)

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
            self.registry.lose_reported(hold, f"it was gone when the task re-entered it ({now})")
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
                await self.releaser.release_quietly(waiter.handed, pass_on=True)

    async def _attempt(
        self, keys: LockKeys, owner: str, lease: float | None, hold: Hold | None = None
    ) -> tuple[Hold | None, float]:
        """One run of the acquire script: (hold, 0.0) on success, (None, ttl) if busy.

        With *hold*, the attempt re-enters it; otherwise it is a new acquisition under a
        hash field of its own (the owner plus this attempt's number).
        """
        lease_s = self.manager.lease if lease is None else lease
        attempt = next(self.ids)
        field = f"{owner}:{attempt}" if hold is None else hold.field
        count = 0 if hold is None else hold.count
        # Unique across clients: a marker left by another process's cancelled attempt
        # must never void this one.
        void = keys.void(f"{self.keyspace.manager_id}:{attempt}")
        args = (field, ms(lease_s), count, self.meta_ttl_ms, self.keyspace.manager_id)
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
                await self.releaser.release_quietly(hold)
                return None, 0.0
            hold.count = as_int(value)
            if not hold.renew:
                self.registry.reset_lease(hold, lease_s, sent_at)
            return hold, 0.0
        hold = Hold(keys, owner, field, as_int(value), lease_s, lease is None, sent_at)
        self.registry.add(hold)
        if self.hub.closed:  # the manager closed while the attempt was in flight
            self.registry.lose(hold, "the LockManager was closed")
            await self.releaser.release_quietly(hold)
            raise self.manager_closed()
        return hold, 0.0

    async def _undo(
        self, keys: LockKeys, field: str, count: int, void: str, lease_s: float
    ) -> None:
        """Revert an attempt whose outcome is unknown, or void it before it runs."""
        args = (
            field,
            count,
            ms(max(2 * lease_s, MIN_VOID_TTL)),
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

        await finish_despite_cancel(lambda: send_or(send, retry_later))

    # -- release, extend, force release, shutdown -----------------------------------

    async def release(self, hold: Hold) -> None:
        await self.releaser.release(hold)

    def release_lost(self, hold: Hold) -> None:
        self.releaser.release_lost(hold)

    async def extend(self, hold: Hold, lease: float) -> None:
        sent_at = time.monotonic()
        reply = await self.client.run(RENEW, (hold.keys.lock,), (ms(lease), hold.field))
        if as_int(reply[0]) == 1:
            self.registry.reset_lease(hold, lease, sent_at)
            return
        self.registry.lose_reported(hold, "Redis no longer had it when it was extended")
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
                await self.releaser.release_quietly(hold)

        async with anyio.create_task_group() as tg:
            for hold in holds:
                tg.start_soon(release, hold)

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


def _shortest(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)
