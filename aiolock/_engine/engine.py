"""The engine: acquire, wait, undo and release for every lock kind.

A kind (:mod:`aiolock._engine.kind`) runs its scripts; the engine does the rest, the same for
every kind:

Acquire. Every acquiring task joins its lock's local queue first, so tasks are served
in the order they called. The head of the queue tries at once (the fast path: one
script call); the others wait for their turn. A head that finds the lock busy subscribes
to the release channel, tries again once the subscription is confirmed (closing the
lost-wake-up gap), then sleeps until a release wakes it or the holder's lease would
have run out. A connection failure does not end a wait: the head backs off and tries
again until its own timeout. An attempt cancelled or failed in flight is undone by the
kind's undo script, which reverts it or voids it in advance.

Release. The last release of a hold frees the lock or, when a task of this manager
waits for it, hands it straight over in the same script. A hold is made visible to a
waiting task only when that task takes it; a hand-over to a task that gave up meanwhile
is passed on without ever being registered under that task. Releases are idempotent
(the client sends its count; a final release leaves a tombstone), so a release
interrupted by a cancellation is sent again, shielded and bounded in time, and one that
cannot reach Redis is retried in the background while its hold is parked.

Kinds with claims register their waiters in Redis (a fair lock's queue, a writer's
claim): a waiter registers with its first attempt, under one field for its whole wait.
Queued kinds (the fair lock) keep the waiters' order there: a release names the waiter
it grants to, and the hub wakes exactly that one. While a waiter waits, its
registration is refreshed in batches (one script call per name and manager every
``claim_ttl / 3``), so a crashed waiter leaves the queue within ``claim_ttl``; a waiter
that gives up withdraws it at once.

Fairness between clients of the other kinds needs no state in Redis: while other
clients listen for a lock, at most :data:`MAX_LOCAL_STREAK` hand-overs in a row stay
within this manager, and after a release they heard this manager yields for
:data:`YIELD_WINDOW` (see :mod:`aiolock._engine.hub`).

Owner tasks. A task that ends while holding locks has its holds released in the
background, with a warning: the hold would otherwise be renewed for as long as the
manager is open.

How it is built: :class:`Engine` composes objects that each own their state and are
given what they use when they are made, not the whole engine:

* :class:`~aiolock._engine.state.EngineState` (:mod:`aiolock._engine.state`): the parts of
  an open manager that the others share (hub, hold registry, watchdog, cleanup,
  observers, waiters' registrations) and the per-kind counters;
* :class:`~aiolock._engine.release.ReleasePath` (:mod:`aiolock._engine.release`): release,
  hand-over, holds of tasks that ended; made from the parts;
* :class:`~aiolock._engine.acquire.AcquirePath` (:mod:`aiolock._engine.acquire`): acquire,
  re-entry, attempt, undo, and the wait (:class:`~aiolock._engine.wait.Wait`, which calls
  back into it through :class:`~aiolock._engine.wait.WaitEngine`); made from the parts
  and the release path;
* the fast path (:mod:`aiolock._engine.fast`): a step of each path, made by it and taken
  when the lock is idle: :class:`~aiolock._engine.fast.FastAcquire` and
  :class:`~aiolock._engine.fast.FastRelease`;
* :mod:`aiolock._engine.claims` (waiters' registrations and their refresh).

The engine binds the paths' entry points (``acquire``, ``release``, ...) to itself as
attributes, so a handle's call goes straight to the method that does the work (the hot
path counts every function it enters), and adds lease changes, forced releases and the
shutdown.
"""

from __future__ import annotations

import asyncio
import time

import anyio

from aiolock._engine.acquire import AcquirePath
from aiolock._engine.hub import WaiterHub
from aiolock._engine.kind import Hold, LockKind
from aiolock._engine.release import MAX_LOCAL_STREAK, YIELD_WINDOW, ReleasePath
from aiolock._engine.runtime import Runtime
from aiolock._engine.state import ORPHAN, EngineState
from aiolock._errors import LockLostError
from aiolock._keys import LockKeys
from aiolock._observe import ObserverSet

__all__ = ["MAX_LOCAL_STREAK", "ORPHAN", "YIELD_WINDOW", "Engine"]


class Engine:
    """The generic protocol of one open manager: its hub, registry, watchdog and cleanup.

    Composed of :class:`~aiolock._engine.state.EngineState` (the shared parts and the
    counters), :class:`~aiolock._engine.release.ReleasePath` and
    :class:`~aiolock._engine.acquire.AcquirePath` (each with its fast path's step); this
    class hands their entry points and parts to the rest of the package, and adds lease
    changes, forced releases, the shutdown and the waiters' registrations.
    """

    def __init__(
        self, runtime: Runtime, hub: WaiterHub, observers: ObserverSet | None = None
    ) -> None:
        state = self.state = EngineState(runtime, hub, observers)
        releases = self.releases = ReleasePath(state)
        acquiring = self.acquiring = AcquirePath(state, releases)
        # The parts the package uses.
        self.rt = runtime
        self.client = state.client
        self.hub = hub
        self.registry = state.registry
        self.watchdog = state.watchdog
        self.cleanup = state.cleanup
        self.heed = state.heed
        self.observers = state.observers
        self.contention = state.contention
        self.reach = state.reach
        self.starved = state.starved
        self.acquired = state.acquired
        self.timeouts = state.timeouts
        self.lost = state.lost
        # Entry points, bound: a call goes straight to the method that does the work,
        # through no layer of the engine's (the hot path counts the functions it enters).
        self.acquire = acquiring.acquire
        self.release = releases.release
        self.release_lost = releases.release_lost
        self.release_quietly = releases.release_quietly
        self.adopt = acquiring.adopt
        self.ended = state.ended
        self.manager_closed = state.manager_closed

    # -- counters read by the statistics (and the tests) ---------------------------------

    @property
    def connection_errors(self) -> int:
        """Round trips that failed on a connection error and were ridden out or retried."""
        return self.acquiring.connection_errors

    @property
    def released_on_task_exit(self) -> int:
        """Holds released because the task that held them ended."""
        return self.releases.released_on_task_exit

    @property
    def fast_acquired(self) -> int:
        """Acquisitions granted by the fast path's step (:mod:`aiolock._engine.fast`)."""
        return self.acquiring.fast.count

    @property
    def fast_released(self) -> int:
        """Final releases sent by the fast path's step."""
        return self.releases.fast.count

    # -- kinds with claims: registrations of waiting tasks -----------------------------

    @property
    def claims(self) -> int:
        """Registrations of this manager's waiting tasks kept alive in Redis."""
        return self.state.claims.count

    async def keep_claims(self) -> None:
        """Refresh the registrations of waiting tasks (kinds with claims), in batches.

        A background task of the manager (see :mod:`aiolock._engine.claims`).
        """
        await self.state.claims.keep()

    async def keep_listeners(self) -> None:
        """Keep this manager's registrations as a listener of plain locks (a background
        task; see :mod:`aiolock._engine.listeners`)."""
        await self.state.listeners.keep()

    # -- max_hold ------------------------------------------------------------------------

    def bound(self, hold: Hold, max_hold: float) -> Hold:
        """End *hold* as lost once it has been held for *max_hold* s (from now: it was
        just granted). A re-entry keeps the deadline of the task's first acquisition."""
        if hold.limit is None and hold.count == 1 and self.registry.holds(hold):
            loop = asyncio.get_running_loop()
            hold.limit = loop.call_at(loop.time() + max_hold, self._held_too_long, hold, max_hold)
        return hold

    def _held_too_long(self, hold: Hold, max_hold: float) -> None:
        hold.limit = None
        if hold.lost or not self.registry.holds(hold):
            return
        self.registry.lose(
            hold,
            f"it was held for max_hold={max_hold:g} s, so aiolock released it: renewal "
            "stops there, however long the body runs",
        )
        self.release_lost(hold)

    # -- extend, force release, shutdown -------------------------------------------------

    async def extend(self, hold: Hold, lease: float) -> None:
        sent_at = time.monotonic()
        if await hold.kind.extend(hold, lease):
            self.registry.reset_lease(hold, lease, sent_at)
            return
        raise self._lost_on_extend(hold)

    async def extend_by(self, hold: Hold, additional: float) -> None:
        sent_at = time.monotonic()
        left = await hold.kind.extend_by(hold, additional)
        if left is None:
            raise self._lost_on_extend(hold)
        # The server read its PTTL after sent_at, so sent_at + left is the earlier bound.
        self.registry.reset_lease(hold, left, sent_at)

    def _lost_on_extend(self, hold: Hold) -> LockLostError:
        self.registry.lose_reported(hold, "Redis no longer had it when it was extended")
        return LockLostError(
            f"{hold.kind.name} {hold.keys.name!r} could not be extended: its lease had "
            "already ended or it was force-released"
        )

    async def force_release(self, kind: LockKind, keys: LockKeys) -> bool:
        # The holds registered when the script was sent are the ones it deleted. A hold
        # registered while the reply was on its way is either, and only Redis can tell:
        # its acquire may have run before the script (deleted: lost), or it may be the
        # grant the script made to one of our waiters (a fair lock's next waiter), or
        # have come after it (held). Those are checked at once, as a renewal checks.
        before = [hold for hold in self.registry if hold.keys.lock == keys.lock]
        sent = {id(hold) for hold in before}  # (before keeps them alive: ids stay theirs)
        held = await kind.force_release(keys)
        meanwhile: list[Hold] = []
        for hold in list(self.registry):
            if hold.keys.lock != keys.lock:
                continue
            if id(hold) in sent:
                self.registry.lose(hold, "it was force-released")
            else:
                meanwhile.append(hold)
        self.hub.wake(keys.channel)
        if meanwhile:
            await self.watchdog.run_round(meanwhile)  # loses those Redis no longer has
        return held

    async def shutdown(self) -> None:
        """Release every hold (all counts at once) and fail the bodies still using them;
        then wait for the releases other tasks are sending (see :meth:`Cleanup.drain`)."""
        self.heed.close()  # no hold listens any more: the hub is closing
        holds = list(self.registry)
        for hold in holds:
            self.registry.lose(hold, "the LockManager was closed")
        limiter = anyio.CapacityLimiter(16)  # a few connections, not one per hold

        async def release(hold: Hold) -> None:
            async with limiter:
                await self.release_quietly(hold)

        async with anyio.create_task_group() as tg:
            for hold in holds:
                tg.start_soon(release, hold)
        await self.cleanup.drain()
