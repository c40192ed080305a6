"""The hold registry: the client's side of what Redis granted to this manager's tasks.

A :class:`~aiolock._engine.kind.Hold` is one grant of one lock kind to one owner (an asyncio
task): a lock, a read or write side, some permits. The registry is keyed by hold, not
by (lock, owner), because one task may hold several things of one resource (two permit
batches, a read and a write hold); kinds that re-enter (the reentrant lock) also use
the ``(resource, owner)`` index.

A hold ends in one of three ways:

* released: removed from the registry;
* lost: its lease ran out locally, Redis no longer had it, or the manager closed. Its
  ``async with`` bodies are cancelled, and the owner's next release or extend says so;
* parked: its final release could not be confirmed and is retried in the background.
  A parked hold no longer counts as held: its task acquires anew (with a new hash
  field), never re-enters it.

Deadlines: ``valid_until`` is the latest monotonic time at which the lease is surely
still running (measured from before the command was sent, so it errs early). Fixed-lease
holds each have a timer at that moment; auto-renewed holds share one timer at the
earliest of their deadlines, and a renewal only moves ``valid_until`` forward.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator

from aiolock._engine.contention import Contention
from aiolock._engine.kind import Hold

__all__ = ["HoldRegistry"]

logger = logging.getLogger("aiolock")

#: Lost holds remembered so the owner's next release()/extend() can say "lost" rather
#: than "not owned"; beyond this many the oldest are forgotten.
LOST_MEMORY = 10_000

_ENDED_FIXED = "the lease ended: its fixed lease ran out"
#: When the watchdog cannot tell why an auto-renewed lease ran out (see HoldRegistry.ended_why).
_ENDED_RENEWED = "the lease ended: renewal could not reach Redis in time"


class HoldRegistry:
    """Every live hold of one manager, plus the lost and parked ones its owners may ask about."""

    def __init__(
        self,
        on_lost: Callable[[Hold], None],
        on_fixed: Callable[[Hold], None],
        contention: Contention | None = None,
    ) -> None:
        self._holds: dict[int, Hold] = {}
        #: told how long each hold lasted (see aiolock._engine.contention)
        self._contention = Contention(0) if contention is None else contention
        #: (resource, owner) -> the owner's hold of a reentrant kind
        self._index: dict[tuple[str, str], Hold] = {}
        #: owner -> its live holds (to release them when its task ends). An owner's entry
        #: stays, empty, from its first hold until its task ends (forget_owner): a task
        #: that acquires and releases in a loop then makes no dict per acquisition
        self._by_owner: dict[str, dict[int, Hold]] = {}
        self._lost: OrderedDict[tuple[str, str], Hold] = OrderedDict()
        #: owner -> the resources of its remembered lost holds (forgotten when its task ends)
        self._lost_of: dict[str, set[str]] = {}
        self._parked: dict[tuple[str, str], Hold] = {}
        #: parked holds whose release the background retrier has since confirmed
        self._settled: OrderedDict[tuple[str, str], Hold] = OrderedDict()
        #: channel -> the live hold of an exclusive kind (not ``shared``) last granted
        #: there: what a new grant of that lock to another of this manager's tasks
        #: shows to be gone from Redis (see _superseded)
        self._exclusive: dict[str, Hold] = {}
        self._shared: asyncio.TimerHandle | None = None
        #: when the shared timer fires (its loop time: the monotonic clock)
        self._shared_at = 0.0
        self._on_lost = on_lost
        self._on_fixed = on_fixed
        #: told when a hold whose release channel is listened to ends (aiolock._engine.heed)
        self.on_unheld: Callable[[Hold], None] | None = None
        #: why an auto-renewed hold's lease ran out before it was renewed (the watchdog
        #: tells: Redis unreachable, or the event loop stood still), or None if unknown
        self.ended_why: Callable[[Hold], str | None] | None = None

    def __len__(self) -> int:
        return len(self._holds)

    def __iter__(self) -> Iterator[Hold]:
        return iter(list(self._holds.values()))

    def get(self, resource: str, owner: str) -> Hold | None:
        return self._index.get((resource, owner))

    def add(self, hold: Hold) -> Hold | None:
        """Register *hold*. Returns the hold of another task of this manager that *hold*
        replaces on its lock, if it is of an exclusive kind and one is registered there
        (see :meth:`_superseded`): lost, if Redis granted *hold*."""
        number, owner = id(hold), hold.owner
        self._holds[number] = hold
        if self._settled:  # (both are usually empty: no call on every acquisition)
            self._settled.pop((hold.resource, owner), None)
        if hold.kind.reentrant:
            self._index[(hold.resource, owner)] = hold
        replaced = None
        if not hold.kind.shared:
            channel = hold.keys.channel
            replaced = self._exclusive.get(channel)
            self._exclusive[channel] = hold
        owned = self._by_owner.get(owner)
        if owned is None:  # (the usual case: a task holds one thing at a time)
            self._by_owner[owner] = {number: hold}
        else:
            owned[number] = hold
        if self._lost:
            self.pop_lost(hold.resource, owner)
        if hold.renew:
            if self._shared is None or hold.valid_until < self._shared_at:
                self._arm_shared(hold.valid_until)
        else:
            self._arm(hold)
            self._on_fixed(hold)
        if replaced is None or replaced is hold:
            return None
        return self._superseded(hold, replaced)

    def remove(self, hold: Hold, settled: bool | None = None) -> None:
        """Forget *hold*; then, given *settled*, :meth:`unpark` it too (a final release's
        outcome: both at once: every release comes here)."""
        number = id(hold)
        if self._holds.pop(number, None) is not None:
            owner = hold.owner
            if hold.kind.reentrant:  # (only those are indexed: see add)
                key = (hold.resource, owner)
                if self._index.get(key) is hold:
                    del self._index[key]
            if not hold.kind.shared:
                channel = hold.keys.channel
                if self._exclusive.get(channel) is hold:
                    del self._exclusive[channel]
            owned = self._by_owner.get(owner)
            if owned is not None:
                owned.pop(number, None)  # (the empty entry stays: see _by_owner)
            if hold.timer is not None:
                hold.timer.cancel()
                hold.timer = None
            if hold.limit is not None:
                hold.limit.cancel()
                hold.limit = None
            # (Contention.held, inline: no function entered on an uncontended cycle)
            if (entry := self._contention.entries.get(hold.resource)) is not None:
                entry.holds.append(time.monotonic() - hold.granted_at)
            if hold.heeded:
                hold.heeded = False
                if self.on_unheld is not None:
                    self.on_unheld(hold)
        if settled is not None and self._parked:  # (the usual case: nothing parked)
            self.unpark(hold, settled=settled)

    def _superseded(self, granted: Hold, other: Hold) -> Hold | None:
        """*other* (registered on *granted*'s lock before it) if *granted* shows it gone.

        If Redis granted *granted*, of an exclusive kind, to one of this manager's tasks,
        a hold of the same kind and lock still registered here for another task can no
        longer be in Redis (force-released, deleted, or expired there), unless its
        final release is in flight (the grant followed that release).
        """
        if (
            other.kind is not granted.kind
            or other.owner == granted.owner
            or other.release_id is not None
            or not self.holds(other)
        ):
            return None
        return other

    def holding(self, channel: str) -> Hold | None:
        """The live hold of an exclusive kind this manager has on *channel*'s lock."""
        hold = self._exclusive.get(channel)
        return hold if hold is not None and self.holds(hold) else None

    def holds(self, hold: Hold) -> bool:
        """Whether *hold* is live (registered, not lost, not parked)."""
        return self._holds.get(id(hold)) is hold

    def alive(self, hold: Hold) -> bool:
        """Whether *hold* is still held; one whose deadline has passed is lost now.

        Its timer may not have run yet (the event loop was busy, or the reply that
        granted it came after the lease had run out): an acquire or an ``async with``
        that is about to hand the hold to its caller asks here, not the timer.
        """
        if hold.lost or not self.holds(hold):
            return False
        if time.monotonic() >= hold.valid_until:
            self.lose(hold, self._ended(hold))
            return False
        return True

    def confirm(self, hold: Hold, sent_at: float) -> None:
        """Redis renewed *hold* by a command sent at monotonic time *sent_at*."""
        hold.valid_until = max(hold.valid_until, sent_at + hold.lease)

    def reset_lease(self, hold: Hold, lease: float, sent_at: float) -> None:
        """A fixed lease was set anew (extend): the deadline may move either way."""
        hold.lease = lease
        hold.valid_until = sent_at + lease
        hold.next_check = sent_at + lease / 3
        if hold.timer is not None:
            hold.timer.cancel()
        self._arm(hold)
        self._on_fixed(hold)

    def lose(self, hold: Hold, reason: str) -> None:
        """Mark *hold* lost: forget it, cancel its ``async with`` bodies, tell the engine."""
        if hold.lost:
            return
        hold.lost = True
        hold.lost_reason = reason
        self.remove(hold)
        self._remember_lost(hold)
        logger.warning("lock %r lost: %s", hold.keys.name, reason)
        for scope in hold.scopes:
            scope.cancel()
        self._on_lost(hold)

    def lose_reported(self, hold: Hold, reason: str) -> None:
        """Mark *hold* lost for a caller about to raise the loss itself.

        The owner learns of it from that error, so it is not remembered for a later
        release()/extend() to report a second time.
        """
        self.lose(hold, reason)
        self.pop_lost(hold.resource, hold.owner)

    def _remember_lost(self, hold: Hold) -> None:
        """Keep *hold* for its owner's next release()/extend() to report as lost.

        A hold whose task has ended (orphaned: the empty owner) is not kept, as no task
        can ask about it.
        """
        if not hold.owner:
            return
        self._lost[(hold.resource, hold.owner)] = hold
        self._lost_of.setdefault(hold.owner, set()).add(hold.resource)
        while len(self._lost) > LOST_MEMORY:
            (resource, owner), _ = self._lost.popitem(last=False)
            self._unindex_lost(resource, owner)

    def pop_lost(self, resource: str, owner: str) -> Hold | None:
        hold = self._lost.pop((resource, owner), None)
        if hold is not None:
            self._unindex_lost(resource, owner)
        return hold

    def forget_lost(self, hold: Hold) -> None:
        """The owner was told of *hold*'s loss: forget it (not another hold of the key)."""
        if self._lost.get((hold.resource, hold.owner)) is hold:
            self.pop_lost(hold.resource, hold.owner)

    def forget_owner(self, owner: str) -> list[Hold]:
        """*owner*'s task ended: nobody can ask about its lost holds any more, and the
        holds it still has (returned) are the caller's to release."""
        for resource in self._lost_of.pop(owner, ()):
            self._lost.pop((resource, owner), None)
        owned = self._by_owner.pop(owner, None)
        return [] if owned is None else list(owned.values())

    def _unindex_lost(self, resource: str, owner: str) -> None:
        resources = self._lost_of.get(owner)
        if resources is not None:
            resources.discard(resource)
            if not resources:
                del self._lost_of[owner]

    def park(self, hold: Hold) -> None:
        """Its final release is unconfirmed: stop counting it as held, stop renewing it."""
        self.remove(hold)
        hold.renew = False
        self._parked[(hold.resource, hold.owner)] = hold

    def unpark(self, hold: Hold, *, settled: bool = True) -> None:
        """*hold*'s final release was confirmed (*settled*), or it was lost after all."""
        if not self._parked:  # (the usual case: nothing parked, no key to make)
            return
        key = (hold.resource, hold.owner)
        if self._parked.get(key) is hold:
            del self._parked[key]
            if settled:
                # The owner was told its release failed; if it calls release() again,
                # that call finds the work done instead of "not owned".
                self._settled[key] = hold
                while len(self._settled) > LOST_MEMORY:
                    self._settled.popitem(last=False)

    def pop_settled(self, resource: str, owner: str) -> Hold | None:
        return self._settled.pop((resource, owner), None)

    def parked(self, resource: str, owner: str) -> Hold | None:
        return self._parked.get((resource, owner))

    def renewable(self) -> list[Hold]:
        return [hold for hold in self._holds.values() if hold.renew]

    def fixed(self) -> list[Hold]:
        return [hold for hold in self._holds.values() if not hold.renew]

    # -- local deadlines ---------------------------------------------------------------

    def _arm(self, hold: Hold) -> None:
        """A timer of its own for a fixed-lease hold, at its deadline."""
        loop = asyncio.get_running_loop()
        # loop.time() is the monotonic clock, the same one valid_until is measured on.
        hold.timer = loop.call_at(hold.valid_until, self._check_expiry, hold)

    def _check_expiry(self, hold: Hold) -> None:
        hold.timer = None
        if hold.lost or not self.holds(hold):
            return
        if time.monotonic() < hold.valid_until:
            self._arm(hold)  # extended since the timer was set
            return
        self.lose(hold, _ENDED_FIXED)

    def _ended(self, hold: Hold) -> str:
        """The loss reason of *hold*, whose lease ran out on this client's clock."""
        if not hold.renew:
            return _ENDED_FIXED  # its own lease, not renewed: nothing went wrong
        why = None if self.ended_why is None else self.ended_why(hold)
        return _ENDED_RENEWED if why is None else why

    def _arm_shared(self, when: float) -> None:
        """One timer for all auto-renewed holds, at the earliest of their deadlines.

        They share the manager's lease and are renewed together, so their deadlines
        cluster; one timer spares a timer per acquisition on the hot path.
        """
        if self._shared is not None:
            if self._shared_at <= when:
                return
            self._shared.cancel()
        self._shared = asyncio.get_running_loop().call_at(when, self._check_renewed)
        self._shared_at = when

    def _check_renewed(self) -> None:
        self._shared = None
        now = time.monotonic()
        earliest: float | None = None
        for hold in list(self._holds.values()):
            if not hold.renew or hold.lost:
                continue
            if hold.valid_until <= now:
                self.lose(hold, self._ended(hold))
            elif earliest is None or hold.valid_until < earliest:
                earliest = hold.valid_until
        if earliest is not None:
            self._arm_shared(earliest)
