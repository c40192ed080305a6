"""The parts of one open manager's engine, and the few helpers every part of it uses.

:class:`EngineState` is what the engine's parts share: the hub, the hold registry, the
watchdog, the background cleanup, the observers, the waiters' registrations and the
per-kind counters; it hears of the holds the registry finds lost. It runs no protocol:
the parts that do are given it when they are made, and take from it what they use:
:class:`~aiolock._engine.release.ReleasePath` (releases and hand-overs),
:class:`~aiolock._engine.acquire.AcquirePath` (attempts and waits, with the fast path's
step); :class:`~aiolock._engine.engine.Engine` composes them and has the overview.
"""

from __future__ import annotations

import time
from collections import Counter

from aiolock._engine.claims import WaiterClaims
from aiolock._engine.cleanup import Cleanup
from aiolock._engine.contention import Contention
from aiolock._engine.heed import ReleaseHeed
from aiolock._engine.hub import WaiterHub
from aiolock._engine.kind import Hold, LockKind
from aiolock._engine.listeners import ListenerRegistrations
from aiolock._engine.registry import HoldRegistry
from aiolock._engine.runtime import Runtime
from aiolock._engine.watchdog import Watchdog
from aiolock._errors import ManagerNotOpenError
from aiolock._keys import LockKeys
from aiolock._observe import ObserverSet
from aiolock._redis.reach import Reachability, describe, endpoint, speaks_plain

__all__ = ["ORPHAN", "EngineState"]

#: Owner of a hold handed over to a task that had given up: it belongs to no task.
ORPHAN = ""


class EngineState:
    """The parts of one open manager that the engine's parts share: its hub, registry,
    watchdog and cleanup, and the per-kind counters the statistics read."""

    def __init__(
        self, runtime: Runtime, hub: WaiterHub, observers: ObserverSet | None = None
    ) -> None:
        self.rt = runtime
        self.client = runtime.client
        self.hub = hub
        #: the hottest names' contention statistics (see aiolock._engine.contention)
        self.contention = Contention(runtime.top_k)
        self.registry = HoldRegistry(
            on_lost=self._on_lost, on_fixed=self._on_fixed, contention=self.contention
        )
        #: told of every new hold's wait, acquisition and end (see aiolock._observe)
        self.observers = ObserverSet() if observers is None else observers
        self.watchdog = Watchdog(
            self.registry,
            runtime.lease,
            # on a cluster a renewal script may only touch keys of one slot
            group_by_slot=runtime.client.cluster,
            observers=self.observers,
        )
        self.registry.ended_why = self.watchdog.why_ended
        self.cleanup = Cleanup()
        #: listens to the release channels of long-held locks (a release by another
        #: client is noticed at once, not at the next renewal)
        self.heed = ReleaseHeed(self.registry, hub, self.watchdog.check_soon)
        #: whether the latest attempt reached Redis: waiters that never talk to Redis
        #: themselves (all but a queue's head) report an outage from it, not contention
        redis = runtime.client.redis
        self.reach = Reachability(describe(redis), endpoint(redis), speaks_plain(redis))
        #: per kind name: acquisitions (new holds), timeouts, holds lost
        self.acquired: Counter[str] = Counter()
        self.timeouts: Counter[str] = Counter()
        self.lost: Counter[str] = Counter()
        #: kinds with claims: the registrations of this manager's waiters in Redis
        self.claims = WaiterClaims()
        #: channels whose last waiters starved, until when (monotonic): the next wait
        #: for them asks for a turn at once (aiolock._engine.turns)
        self.starved: dict[str, float] = {}
        #: kinds that register listeners: this manager's registrations (aiolock show)
        self.listeners = ListenerRegistrations(hub, group_by_slot=runtime.client.cluster)

    def timed_out(self, kind: LockKind, keys: LockKeys) -> None:
        """Count an acquire of *kind* on *keys* that ran out of time."""
        self.timeouts[kind.name] += 1
        self.contention.timed_out(kind.resource(keys), kind.name, keys.name)

    def _on_lost(self, hold: Hold) -> None:
        self.lost[hold.kind.name] += 1
        self.contention.lost(hold.resource, hold.kind.name, hold.keys.name)
        if hold.observed_at is not None:
            self.ended(hold, hold.lost_reason)
        # The lock may be free now (or soon): the local head should try for it.
        self.hub.wake(hold.keys.channel)

    def _on_fixed(self, hold: Hold) -> None:
        self.watchdog.reschedule(hold.next_check)

    def ended(self, hold: Hold, lost: str | None = None) -> None:
        """Tell the observers that an observed hold ended (once: it is then unobserved)."""
        if hold.observed_at is None:
            return
        held = time.monotonic() - hold.observed_at
        hold.observed_at = None
        name, keys = hold.kind.name, hold.keys.name
        if lost is None:
            self.observers.released(name, keys, held, hold.token)
        else:
            self.observers.lost(name, keys, held, hold.token, lost)

    def manager_closed(self) -> ManagerNotOpenError:
        return ManagerNotOpenError(
            "the LockManager is closing (or stopped acquiring) and hands out no more "
            "locks; waiting tasks gave up. Open a new LockManager to keep using locks"
        )
