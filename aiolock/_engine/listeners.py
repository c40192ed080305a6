"""This manager's registrations as a listener of plain locks, for ``aiolock show``.

A plain lock keeps no waiters in Redis: they wait on its release channel, and the server
can count the subscribers of a channel (``PUBSUB NUMSUB``) but not say who they are
(``CLIENT LIST`` names no channels). So a manager registers itself, under its id, in the
lock's ``<lock>:listeners`` sorted set (manager id -> expiry on the server's clock) while
it is subscribed to the lock's channel because a task of it waits there:

* registered when a waiter's attempt found the lock busy and the hub subscribes (the
  contended path only: an uncontended acquire writes nothing more), by a background
  task, so the waiter is not held back by the write;
* refreshed every ``TTL / 3`` while the hub still wants that subscription (one script
  call per lock per round, for all of this manager's waiters of it);
* withdrawn at the first round after the last waiter left (the hub gave the
  subscription up), so within ``TTL / 3``: not at once, which would send a write in the
  middle of the release and hand-overs that ended the wait, and a manager that waits
  again meanwhile keeps its entry without a write; a crashed manager's entry expires
  within :data:`TTL`.

Kinds opt in with ``registers_listeners`` (the plain lock). A failed write is logged once
and retried at the next round: the registration is for people, never for the locking.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import anyio

from aiolock._errors import LockError

if TYPE_CHECKING:
    from aiolock._engine.hub import WaiterHub
    from aiolock._engine.kind import LockKind
    from aiolock._keys import LockKeys

__all__ = ["TTL", "ListenerRegistrations"]

logger = logging.getLogger("aiolock")

#: Seconds a registration lasts unless refreshed (refreshed every third of it).
TTL = 10.0


class ListenerRegistrations:
    """The plain locks this manager is registered as a listener of (see the module)."""

    def __init__(self, hub: WaiterHub) -> None:
        self._hub = hub
        #: lock key -> its kind and keys: registered (or about to be)
        self._locks: dict[str, tuple[LockKind, LockKeys]] = {}
        #: lock keys not written yet
        self._new: set[str] = set()
        self._changed = asyncio.Event()
        self._failing = False

    def __len__(self) -> int:
        return len(self._locks)

    def listening(self, kind: LockKind, keys: LockKeys) -> None:
        """A waiter of *keys* found it busy and the hub subscribes: register soon."""
        if keys.lock not in self._locks:
            self._locks[keys.lock] = (kind, keys)
            self._new.add(keys.lock)
            self._changed.set()

    async def keep(self) -> None:
        """Write new registrations at once; every ``TTL / 3``, refresh the others and
        withdraw those the hub no longer listens for (a background task)."""
        period = TTL / 3
        next_refresh = time.monotonic() + period
        while True:
            with anyio.move_on_after(max(0.0, next_refresh - time.monotonic())):
                await self._changed.wait()
            self._changed.clear()
            refresh = time.monotonic() >= next_refresh
            if refresh:
                next_refresh = time.monotonic() + period
            for lock, (kind, keys) in list(self._locks.items()):
                if refresh and not self._hub.wanted(keys.channel):
                    del self._locks[lock]
                    self._new.discard(lock)
                    await self._write(kind, keys, 0.0)
                elif refresh or lock in self._new:
                    self._new.discard(lock)
                    await self._write(kind, keys, TTL)

    async def _write(self, kind: LockKind, keys: LockKeys, ttl: float) -> None:
        try:
            with anyio.fail_after(TTL / 3):
                await kind.register_listener(keys, ttl)
        except (LockError, TimeoutError) as exc:
            if not self._failing:
                logger.warning(
                    "could not register as a listener of %r (aiolock show lists this "
                    "manager's waiters of it once it can): %s",
                    keys.name,
                    str(exc) or "no reply in time",
                )
            self._failing = True
            return
        self._failing = False
