"""The watchdog: one loop per manager that keeps Redis and the client's holds in step.

Every ``lease / 3`` it renews all auto-renewed holds, and it checks each fixed-lease hold
(without extending it) at least every third of that hold's lease, so a hold that Redis
no longer has (force-released by another client, evicted, lost in a failover) reaches
its owner within a third of its lease, not only at its end. Holds are sent in batches
of one lock kind; on Redis Cluster (``group_by_slot``) also of one slot, since a script
may only touch keys of one slot there. A single server takes any mix, and 10,000 holds
spread over as many slots then still take 34 round trips (lock holds), not 10,000.

When an auto-renewed hold's lease runs out before it was renewed, the watchdog says why
(:meth:`Watchdog.why_ended`, the hold's loss reason): either its renewals failed (Redis
could not be reached) or the loop did not run it when it was due (the event loop stood
still: code that blocked it, or a process stopped by SIGSTOP or a debugger).

A batch is as large as its kind's :attr:`~aiolock._engine.kind.LockKind.renew_batch`: each kind
names the number of holds whose renewal stays under a millisecond of Redis time (a
script blocks the server while it runs), measured per kind (``benchmarks/NOTES.md``).
The batches of a round renew distinct holds, so their order does not matter: up to
:data:`RENEW_IN_FLIGHT` are in flight at once instead of one after another.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import defaultdict

import anyio

from aiolock._engine.kind import Hold, LockKind
from aiolock._engine.registry import HoldRegistry
from aiolock._errors import LockConnectionError, LockError
from aiolock._observe import ObserverSet

__all__ = ["Watchdog"]

logger = logging.getLogger("aiolock")

#: Renewal calls of one round in flight at once: a round of 100,000 holds does not wait
#: for each batch's reply before sending the next, and a few calls at a time keep the
#: connections few (the client pipelines calls that wait for a connection).
RENEW_IN_FLIGHT = 4
#: After a failed round, try again this soon (at most): the leases are running out.
RETRY_AFTER = 1.0


class Watchdog:
    """Renews auto-renewed holds every ``lease / 3``; checks fixed-lease holds."""

    def __init__(
        self,
        registry: HoldRegistry,
        lease: float,
        *,
        group_by_slot: bool,
        observers: ObserverSet | None = None,
    ) -> None:
        self._registry = registry
        self._observers = ObserverSet() if observers is None else observers
        #: batches never span Redis Cluster slots (needed on a cluster only)
        self.group_by_slot = group_by_slot
        self._lease = lease
        self.period = lease / 3
        self.rounds = 0
        self.round_trips = 0
        self._changed = asyncio.Event()
        #: when the loop plans to wake up next (monotonic clock)
        self._wake_at = math.inf
        #: holds to check with Redis at once (check_soon), by id
        self._urgent: dict[int, Hold] = {}
        #: by when the loop must run again (monotonic): its planned wake-up while it
        #: sleeps, the time-out of its latest batch while a round is in flight. Past it,
        #: the event loop has not run the watchdog: it stood still (see why_ended)
        self._due = math.inf
        #: whether the loop of run() is in a round (its batches move _due)
        self._in_round = False
        #: when the first renewal batch failed since the last one that succeeded
        #: (monotonic; None while they succeed), and the latest failure
        self._failing_since: float | None = None
        self._failure = ""
        #: whether that failure was a connection's (an error reply is not: Redis answered)
        self._unreachable = True

    def reschedule(self, due: float) -> None:
        """A fixed-lease hold was added or extended and is due at *due*.

        The loop is woken only if that is before its planned wake-up, so that acquiring
        fixed-lease holds does not wake it (and make it scan every hold) each time.
        """
        if due < self._wake_at:
            self._changed.set()

    def check_soon(self, hold: Hold) -> None:
        """Check *hold* with Redis now, not at its next round: something suggests that
        Redis no longer has it (a release this manager did not make was heard)."""
        self._urgent[id(hold)] = hold
        self._changed.set()

    async def run(self) -> None:
        next_round = time.monotonic() + self.period
        while True:
            if self._urgent:
                urgent, self._urgent = self._urgent, {}
                live = [hold for hold in urgent.values() if self._registry.holds(hold)]
                if live:  # (a renewal is a check; a fixed lease is only checked)
                    await self._round(live, counted=False)
                continue
            now = time.monotonic()
            fixed = self._registry.fixed()
            due = min((hold.next_check for hold in fixed), default=math.inf)
            wake_at = self._wake_at = self._due = min(next_round, due)
            if wake_at > now:
                self._changed.clear()
                with anyio.move_on_after(wake_at - now):
                    await self._changed.wait()
                continue
            renewing = now >= next_round
            holds = self._registry.renewable() if renewing else []
            checked = [hold for hold in fixed if hold.next_check <= now]
            ok = await self._round(holds + checked)
            after = self.period if ok else min(self.period, RETRY_AFTER)
            if renewing:
                next_round = time.monotonic() + after
            for hold in checked:
                third = hold.lease / 3
                hold.next_check = time.monotonic() + (third if ok else min(third, RETRY_AFTER))

    async def _round(self, holds: list[Hold], *, counted: bool = True) -> bool:
        """A round of the loop of :meth:`run`: its batches tell by when it runs again."""
        self._due = time.monotonic() + self.period
        self._in_round = True
        try:
            return await self.run_round(holds, counted=counted)
        finally:
            self._in_round = False

    def why_ended(self, hold: Hold) -> str | None:
        """Why the lease of *hold*, auto-renewed, ran out before a renewal confirmed it:
        the reason of its loss, or None if the watchdog cannot tell.

        A failed renewal since the last one that succeeded means Redis could not be
        reached (or answered too late). Otherwise the loop was overdue: the event loop
        did not run it when it was due, for long enough that the lease ran out
        meanwhile. That the lease ran out with no failed renewal already shows the stall
        was long (the watchdog renews every third of the lease), so no threshold is
        needed for it; with failures, a stall is mentioned when it lasted longer than a
        renewal period, which a loop that runs never shows.
        """
        now = time.monotonic()
        stood_still = now - self._due
        stall = (
            f"the event loop stood still for {stood_still:.1f} s or more (blocking code, or "
            "the process was stopped)"
        )
        if self._failing_since is not None:
            state = "was unreachable" if self._unreachable else "answered with errors"
            unreachable = (
                f"the lease ran out while Redis {state}: its renewals failed for "
                f"{now - self._failing_since:.1f} s; last error: {self._failure}"
            )
            if stood_still > self.period:
                return f"{unreachable}; meanwhile {stall}"
            return unreachable
        if stood_still > 0:
            return f"the lease ran out while {stall}, so the watchdog could not renew it in time"
        return None

    async def renew_all(self) -> bool:
        """Renew every auto-renewed hold and check every fixed one, once."""
        return await self.run_round(self._registry.renewable() + self._registry.fixed())

    async def run_round(self, holds: list[Hold], *, counted: bool = True) -> bool:
        """Send *holds* in batches of one kind (and slot); False if a batch failed.

        Not *counted* in :attr:`rounds` and :attr:`round_trips`: a check asked for between
        rounds (:meth:`check_soon`), which the renewal figures leave out.
        """
        if counted:
            self.rounds += 1
        groups: defaultdict[tuple[LockKind, int], list[Hold]] = defaultdict(list)
        by_slot = self.group_by_slot
        for hold in holds:
            groups[(hold.kind, hold.slot if by_slot else 0)].append(hold)
        batches = [
            (kind, group[start : start + kind.renew_batch])
            for (kind, _slot), group in groups.items()
            for start in range(0, len(group), kind.renew_batch)
        ]
        if len(batches) == 1:  # the common case: no task group needed
            return await self._renew_batch(*batches[0], counted=counted)
        failed = 0
        errors: list[Exception] = []
        limiter = anyio.Semaphore(RENEW_IN_FLIGHT)

        async def renew(kind: LockKind, batch: list[Hold]) -> None:
            nonlocal failed
            async with limiter:
                try:
                    if not await self._renew_batch(kind, batch, counted=counted):
                        failed += 1
                except Exception as exc:  # raised below as it came, not in a group
                    errors.append(exc)

        async with anyio.create_task_group() as tg:
            for kind, batch in batches:
                tg.start_soon(renew, kind, batch)
        if errors:
            raise errors[0]
        return failed == 0

    async def _renew_batch(self, kind: LockKind, batch: list[Hold], *, counted: bool) -> bool:
        sent_at = time.monotonic()
        self.round_trips += counted
        if self._in_round:  # (a batch that waited for its turn is bounded from its send)
            self._due = max(self._due, sent_at + self.period)
        try:
            with anyio.fail_after(self.period):
                held = await kind.renew(batch, self._lease)
        except (LockError, TimeoutError) as exc:
            if self._failing_since is None:
                self._failing_since = sent_at
            # (the driver's error, for a loss reason: the wrapper's advice is about calls)
            self._failure = _reason(exc.__cause__ or exc, self.period)
            self._unreachable = isinstance(exc, (LockConnectionError, TimeoutError))
            logger.warning(
                "lease renewal of %s failed, will retry: %s",
                _count(len(batch), f"{kind.name} hold"),
                _reason(exc, self.period),
            )
            return False
        self._failing_since = None
        round_trip = time.monotonic() - sent_at
        registry = self._registry
        renewed = 0
        for hold, still in zip(batch, held, strict=True):
            if hold.lost or not registry.holds(hold):
                continue  # released or lost while the batch was in flight
            if hold.release_id is not None:
                continue  # a final release is in flight: a 0 here is that release, not a loss
            if not still:
                registry.lose(
                    hold, "Redis no longer has it (expired, force-released, evicted or replaced)"
                )
            elif hold.renew:
                registry.confirm(hold, sent_at)
                renewed += 1
        if renewed and self._observers.active:
            self._observers.renewed(kind.name, renewed, round_trip)
        return True


def _count(n: int, what: str) -> str:
    """``1 lock hold``, ``2 lock holds``."""
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _reason(exc: BaseException, period: float) -> str:
    """What went wrong, for the log: anyio's TimeoutError carries no message."""
    if isinstance(exc, TimeoutError) and not str(exc):
        return f"no reply within {period:.3g} s (a third of the lease)"
    return str(exc) or repr(exc)
