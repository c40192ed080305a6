"""The hold registry and the watchdog that renews leases.

:class:`HoldRegistry` records every hold of one manager and detects a lease that ran
out locally, with timers at ``valid_until`` (the latest moment a lease is surely still
valid): fixed-lease holds each have one, auto-renewed holds share one at the earliest
of their deadlines. A renewal only moves ``valid_until`` forward; a timer
notices when it fires and re-arms itself, so renewing 10,000 holds touches no timer.

:class:`Watchdog` is one loop per manager: every ``lease / 3`` it renews all
auto-renewed holds, many per round trip, and reports each hold Redis no longer has.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator

import anyio

from ._client import Client, as_int
from ._errors import LockError
from ._hold import Hold
from ._scripts import RENEW

__all__ = ["HoldRegistry", "Watchdog"]

logger = logging.getLogger("aiolock")

#: Locks renewed per EVALSHA: large enough that 10,000 holds take 20 round trips, small
#: enough that one script call stays well under a millisecond of server time.
RENEW_BATCH = 500

#: Lost holds remembered so the owner's next release()/extend() can say "lost" rather
#: than "not owned"; beyond this many the oldest are forgotten.
LOST_MEMORY = 10_000


class HoldRegistry:
    """Every live hold of one manager, keyed by (lock key, owner task).

    Besides live holds it remembers *lost* holds (so the owner learns of the loss) and
    *parked* ones: holds whose final release could not be confirmed and is being retried
    in the background. A parked hold no longer counts as held: the task that owned it
    acquires anew (with a new hash field), never re-enters it.
    """

    def __init__(self, on_lost: Callable[[Hold], None]) -> None:
        self._holds: dict[tuple[str, str], Hold] = {}
        self._lost: OrderedDict[tuple[str, str], Hold] = OrderedDict()
        self._parked: dict[tuple[str, str], Hold] = {}
        self._shared: asyncio.TimerHandle | None = None
        self._on_lost = on_lost

    def __len__(self) -> int:
        return len(self._holds)

    def __iter__(self) -> Iterator[Hold]:
        return iter(list(self._holds.values()))

    def get(self, key: str, owner: str) -> Hold | None:
        return self._holds.get((key, owner))

    def add(self, hold: Hold) -> None:
        self._holds[(hold.keys.lock, hold.owner)] = hold
        self._lost.pop((hold.keys.lock, hold.owner), None)
        if hold.renew:
            self._arm_shared(hold.valid_until)
        else:
            self._arm(hold)

    def remove(self, hold: Hold) -> None:
        if self._holds.get((hold.keys.lock, hold.owner)) is hold:
            del self._holds[(hold.keys.lock, hold.owner)]
        if hold.timer is not None:
            hold.timer.cancel()
            hold.timer = None

    def confirm(self, hold: Hold, sent_at: float) -> None:
        """Redis renewed *hold* by a command sent at monotonic time *sent_at*."""
        hold.valid_until = max(hold.valid_until, sent_at + hold.lease)

    def reset_lease(self, hold: Hold, lease: float, sent_at: float) -> None:
        """A fixed lease was set anew (extend): the deadline may move either way."""
        hold.lease = lease
        hold.valid_until = sent_at + lease
        if hold.timer is not None:
            hold.timer.cancel()
        self._arm(hold)

    def lose(self, hold: Hold, reason: str) -> None:
        """Mark *hold* lost: forget it, cancel its ``async with`` bodies, tell the manager."""
        if hold.lost:
            return
        hold.lost = True
        hold.lost_reason = reason
        self.remove(hold)
        self._lost[(hold.keys.lock, hold.owner)] = hold
        while len(self._lost) > LOST_MEMORY:
            self._lost.popitem(last=False)
        logger.warning("lock %r lost: %s", hold.keys.name, reason)
        for scope in hold.scopes:
            scope.cancel()
        self._on_lost(hold)

    def lose_reported(self, hold: Hold, reason: str) -> None:
        """Mark *hold* lost (if it is not already) for a caller about to raise the loss.

        The owner learns of it from that error, so it is not remembered for a later
        release()/extend() to report a second time.
        """
        self.lose(hold, reason)
        self.pop_lost(hold.keys.lock, hold.owner)

    def pop_lost(self, key: str, owner: str) -> Hold | None:
        return self._lost.pop((key, owner), None)

    def park(self, hold: Hold) -> None:
        """Its final release is unconfirmed: stop counting it as held, stop renewing it."""
        self.remove(hold)
        hold.renew = False
        self._parked[(hold.keys.lock, hold.owner)] = hold

    def unpark(self, hold: Hold) -> None:
        if self._parked.get((hold.keys.lock, hold.owner)) is hold:
            del self._parked[(hold.keys.lock, hold.owner)]

    def parked(self, key: str, owner: str) -> Hold | None:
        return self._parked.get((key, owner))

    def renewable(self) -> list[Hold]:
        return [hold for hold in self._holds.values() if hold.renew]

    def _arm(self, hold: Hold) -> None:
        """A timer of its own for a fixed-lease hold, at its deadline."""
        loop = asyncio.get_running_loop()
        # loop.time() is the monotonic clock, the same one valid_until is measured on.
        hold.timer = loop.call_at(hold.valid_until, self._check_expiry, hold)

    def _check_expiry(self, hold: Hold) -> None:
        hold.timer = None
        if hold.lost or self.get(hold.keys.lock, hold.owner) is not hold:
            return
        if time.monotonic() < hold.valid_until:
            self._arm(hold)  # extended since the timer was set
            return
        self.lose(hold, "the lease ended: its fixed lease ran out")

    def _arm_shared(self, when: float) -> None:
        """One timer for all auto-renewed holds, at the earliest of their deadlines.

        They share the manager's lease and are renewed together, so their deadlines
        cluster; one timer spares a timer per acquisition on the hot path.
        """
        if self._shared is not None:
            if self._shared.when() <= when:
                return
            self._shared.cancel()
        self._shared = asyncio.get_running_loop().call_at(when, self._check_renewed)

    def _check_renewed(self) -> None:
        self._shared = None
        now = time.monotonic()
        earliest: float | None = None
        for hold in list(self._holds.values()):
            if not hold.renew or hold.lost:
                continue
            if hold.valid_until <= now:
                self.lose(hold, "the lease ended: renewal could not reach Redis in time")
            elif earliest is None or hold.valid_until < earliest:
                earliest = hold.valid_until
        if earliest is not None:
            self._arm_shared(earliest)


class Watchdog:
    """Renews every auto-renewed hold of a manager every ``lease / 3`` seconds."""

    def __init__(self, client: Client, registry: HoldRegistry, lease: float) -> None:
        self._client = client
        self._registry = registry
        self._lease = lease
        self._lease_ms = max(1, round(lease * 1000))
        self.period = lease / 3
        self.rounds = 0
        self.round_trips = 0

    async def run(self) -> None:
        delay = self.period
        while True:
            await anyio.sleep(delay)
            ok = await self.renew_all()
            # After a failed round try again soon: the lease is still running out.
            delay = self.period if ok else min(self.period, 1.0)

    async def renew_all(self) -> bool:
        """Renew every renewable hold once; False if some batch could not be sent."""
        holds = self._registry.renewable()
        self.rounds += 1
        ok = True
        for start in range(0, len(holds), RENEW_BATCH):
            ok = await self._renew_batch(holds[start : start + RENEW_BATCH]) and ok
        return ok

    async def _renew_batch(self, batch: list[Hold]) -> bool:
        keys = [hold.keys.lock for hold in batch]
        args: list[str | int] = [self._lease_ms, *(hold.field for hold in batch)]
        sent_at = time.monotonic()
        self.round_trips += 1
        try:
            with anyio.fail_after(self.period):
                replies = await self._client.run(RENEW, keys, args)
        except (LockError, TimeoutError) as exc:
            logger.warning("lease renewal of %d locks failed, will retry: %s", len(batch), exc)
            return False
        for hold, reply in zip(batch, replies, strict=True):
            if hold.lost or self._registry.get(hold.keys.lock, hold.owner) is not hold:
                continue  # released or lost while the batch was in flight
            if hold.release_id is not None:
                continue  # a final release is in flight: a 0 here is that release, not a loss
            if as_int(reply) == 1:
                self._registry.confirm(hold, sent_at)
            else:
                self._registry.lose(
                    hold, "Redis no longer has it (expired, force-released or the key was replaced)"
                )
        return True
