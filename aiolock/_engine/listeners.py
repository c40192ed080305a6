"""This manager's registrations as a listener of plain locks, for ``aiolock show``.

A plain lock keeps no waiters in Redis: they wait on its release channel, and the server
can count the subscribers of a channel (``PUBSUB NUMSUB``) but not say who they are
(``CLIENT LIST`` names no channels). So a manager registers itself, under its id, in the
lock's ``<lock>:listeners`` sorted set (manager id -> expiry on the server's clock) while
it is subscribed to the lock's channel because a task of it waits there:

* registered when a waiter's attempt found the lock busy and the hub subscribes (the
  contended path only: an uncontended acquire writes nothing more), by a background
  task, so the waiter is not held back by the write;
* refreshed every ``TTL / 3`` while the hub still wants that subscription (once per lock
  per round, for all of this manager's waiters of it);
* withdrawn at the first round after the last waiter left (the hub gave the
  subscription up), so within ``TTL / 3``: not at once, which would send a write in the
  middle of the release and hand-overs that ended the wait, and a manager that waits
  again meanwhile keeps its entry without a write; a crashed manager's entry expires
  within :data:`TTL`.

A pass writes its registrations, withdrawals and refreshes together, in batches of up
to :data:`LISTEN_BATCH` locks per script call (on Redis Cluster each batch of one slot,
since a script may only touch keys of one slot there): its cost grows with the batches,
not the locks. Writing one lock per call, 50,000 waited-on names took ~30 s a round at
~1.7k calls/s, three times the ``TTL``: registrations lapsed and ``aiolock show`` lost
this manager's waiters.

Kinds opt in with ``registers_listeners`` (the plain lock). A failed write is logged once
(until a pass succeeds) and retried at the next round: the registration is for people,
never for the locking.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from typing import TYPE_CHECKING

import anyio

from aiolock._errors import LockError

if TYPE_CHECKING:
    from aiolock._engine.hub import WaiterHub
    from aiolock._engine.kind import LockKind
    from aiolock._keys import LockKeys

__all__ = ["LISTEN_BATCH", "LISTEN_IN_FLIGHT", "TTL", "ListenerRegistrations"]

logger = logging.getLogger("aiolock")

#: Seconds a registration lasts unless refreshed (refreshed every third of it).
TTL = 10.0
#: Locks per script call. The script blocks Redis while it runs: 4.2-5.4 us of Redis time
#: per lock (SLOWLOG, redis-server 7.0, on a loaded 2-core machine; twice a lock
#: renewal's work), so a call of 125 took 0.52-0.61 ms (median of 40, new, refreshed or
#: withdrawn entries alike), and 50,000 waited-on names take 400 calls a round.
LISTEN_BATCH = 125
#: Calls of one pass in flight at once: a pass of many batches (or, on a cluster, of
#: many slots) does not wait for each reply before sending the next, yet leaves the
#: client's other connections to the waiters' own attempts.
LISTEN_IN_FLIGHT = 2

#: One registration to write: the lock's kind and keys, and seconds it lasts (0 withdraws).
Write = tuple["LockKind", "LockKeys", float]
#: ... as the kind takes it, in a batch of that kind.
Registration = tuple["LockKeys", float]


class ListenerRegistrations:
    """The plain locks this manager is registered as a listener of (see the module)."""

    def __init__(self, hub: WaiterHub, *, group_by_slot: bool) -> None:
        self._hub = hub
        #: batches never span Redis Cluster slots (needed on a cluster only)
        self._by_slot = group_by_slot
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
            await self._write(self._due(refresh))

    def _due(self, refresh: bool) -> list[Write]:
        """The writes of one pass (all locks on a refresh, else the new ones), with the
        bookkeeping done before any is sent: a lock a waiter asks for while they are in
        flight is new again and written by the next pass."""
        locks = self._locks
        if not refresh:
            due = [(*locks[lock], TTL) for lock in self._new]
            self._new.clear()
            return due
        writes: list[Write] = []
        for lock, (kind, keys) in list(locks.items()):
            if self._hub.wanted(keys.channel):
                writes.append((kind, keys, TTL))
            else:
                del locks[lock]
                writes.append((kind, keys, 0.0))
        self._new.clear()
        return writes

    def _batches(self, writes: list[Write]) -> list[tuple[LockKind, list[Registration]]]:
        """*writes* in batches of one kind (and, on a cluster, one slot), each of at most
        :data:`LISTEN_BATCH` locks."""
        groups: defaultdict[tuple[LockKind, int], list[Registration]] = defaultdict(list)
        by_slot = self._by_slot
        for kind, keys, ttl in writes:
            groups[(kind, keys.slot if by_slot else 0)].append((keys, ttl))
        return [
            (kind, group[start : start + LISTEN_BATCH])
            for (kind, _slot), group in groups.items()
            for start in range(0, len(group), LISTEN_BATCH)
        ]

    async def _write(self, writes: list[Write]) -> None:
        """Send *writes* in batches, a few calls in flight; log the first failing pass."""
        if not writes:
            return  # nothing was tried: neither a failure nor a success
        batches = self._batches(writes)
        #: per failed batch: its locks, the first one's name, what went wrong
        failures: list[tuple[int, str, str]] = []
        errors: list[Exception] = []
        limiter = anyio.Semaphore(LISTEN_IN_FLIGHT)

        async def send(kind: LockKind, batch: list[Registration]) -> None:
            async with limiter:
                try:
                    with anyio.fail_after(TTL / 3):
                        await kind.register_listeners(batch)
                except (LockError, TimeoutError) as exc:
                    failures.append((len(batch), batch[0][0].name, str(exc) or "no reply in time"))
                except Exception as exc:  # raised below as it came, not in a group
                    errors.append(exc)

        if len(batches) == 1:  # the common case: no task group needed
            await send(*batches[0])
        else:
            async with anyio.create_task_group() as tg:
                for kind, batch in batches:
                    tg.start_soon(send, kind, batch)
        if errors:
            raise errors[0]
        if failures and not self._failing:
            _, name, reason = failures[0]
            logger.warning(
                "could not register as a listener of %d of %d locks, %r among them "
                "(aiolock show lists this manager's waiters of them once it can): %s",
                sum(count for count, _, _ in failures),
                len(writes),
                name,
                reason,
            )
        self._failing = bool(failures)
