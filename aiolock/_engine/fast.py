"""The fast path: an uncontended acquire and its release, in one coroutine layer each.

Most acquisitions find their lock free and nobody of this manager waiting for it, and
most releases have nobody to hand the lock to. For those, the engine's general
machinery (the local queue's loop, the attempt and its bookkeeping, the release's
hand-over reservation and its closures) costs more Python than the work itself: about
a dozen coroutine layers and 130 calls per cycle. The fast path does the
same work, with the same kind calls through the seam, in one layer of its own. It is
two steps, each an object that the path it belongs to makes and takes when it may:

* :class:`FastAcquire`, the acquire path's step
  (:meth:`~aiolock._engine.acquire.AcquirePath.acquire` decides): the task joins its
  lock's local queue as the engine's waiters do (so the order of calls is kept: a task
  that asks meanwhile queues behind it), makes one attempt with the kind's
  :meth:`~aiolock._engine.kind.LockKind.attempt`, and if it is granted registers the hold
  and leaves the queue. Any other outcome continues in the acquire path's wait
  (:meth:`~aiolock._engine.acquire.AcquirePath.wait`) with the same waiter and that
  outcome in place of its first attempt: a busy lock waits there, and an attempt
  cancelled or cut off in flight is undone there by the kind's undo, exactly as the
  path's own attempt is (the void marker rule: a late script must never grant a hold
  nobody knows of). The task joins *lazily*
  (:meth:`~aiolock._engine.hub.WaiterHub.enter`): its queue and waiter are made only
  when somebody needs them while the attempt is in flight, or when the wait goes on;
  an attempt that nobody needed to see only drops its entry. Making and dropping them
  unseen was most of what the LockManager spent per cycle beyond twice the minimal
  client's.
* :class:`FastRelease`, the release path's step
  (:meth:`~aiolock._engine.release.ReleasePath.release` decides): a final release
  (count 1) with nobody of this manager waiting for the lock (so nothing to hand over)
  sends the kind's release and applies its outcome; a release cancelled or cut off in
  flight is settled by the release path's own handling
  (:meth:`~aiolock._engine.release.ReleasePath.unconfirmed`: resent shielded, or parked
  and retried in the background).

Each step reaches its path through a small protocol (:class:`AcquireSteps`,
:class:`ReleaseSteps`) and binds what it calls when it is made, so a call on the hot path
goes straight to the method that does the work.

Everything else takes the paths' general way, decided before any I/O: a re-entry,
observers attached, replica acknowledgement (the manager's or the handle's ``replicas=``),
kinds with claims or a queue in Redis (fair locks, writers of read-write locks), a lock
with local waiters or one this manager yields to other clients, a manager that is
closing or stopped acquiring, a nested release. The counters :attr:`FastAcquire.count`
and :attr:`FastRelease.count` (the engine's ``fast_acquired`` and ``fast_released``) say
how often each step ran (the tests check which path each case took).

A Redis Cluster takes the fast path too: nothing of the engine's path differs
there. Its client (:mod:`aiolock._redis.cluster`) follows MOVED and ASK and retries
TRYAGAIN inside the kind's call, so a redirected attempt or release is the same call
with the same outcome; one whose redirects surface as an error (past their bound, or a
slot mid-migration past its retry window) is a :class:`LockConnectionError` like any
other, which the acquire path's wait undoes and rides out, or the release's handling
settles, as above. The hub's sharded subscriptions (per node, moved with their slot)
belong to queues with waiters, which already send their lock to the general path.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Coroutine
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from aiolock._engine.hub import WaiterHub
from aiolock._engine.kind import Attempt, Busy, Hold, LockKind, Released, new_tuple
from aiolock._engine.waiter import FastEntry, Waiter
from aiolock._errors import LockConnectionError, ReplicaAckError
from aiolock._keys import LockKeys
from aiolock._redis.replicas import INHERIT, handle_policy

if TYPE_CHECKING:
    from aiolock._engine.cleanup import Cleanup
    from aiolock._engine.registry import HoldRegistry
    from aiolock._engine.runtime import Runtime
    from aiolock._errors import LockError, ManagerNotOpenError
    from aiolock._redis.reach import Reachability

__all__ = ["AcquireSteps", "FastAcquire", "FastRelease", "ReleaseSteps"]


class AcquireSteps(Protocol):
    """What the fast acquire uses of its acquire path
    (:class:`~aiolock._engine.acquire.AcquirePath`): its parts, and the steps an
    acquisition that is not granted at once goes on with."""

    hub: WaiterHub
    rt: Runtime
    reach: Reachability

    def manager_closed(self) -> ManagerNotOpenError: ...

    def timed_out(self, kind: LockKind, keys: LockKeys) -> None: ...

    def adopt(self, hold: Hold, granted: bool = False) -> Hold: ...

    def acquire_new(
        self,
        kind: LockKind,
        keys: LockKeys,
        owner: str,
        timeout: float | None,
        lease: float | None,
        permits: int,
    ) -> Coroutine[Any, Any, Hold]: ...

    async def wait(
        self,
        kind: LockKind,
        keys: LockKeys,
        owner: str,
        lease: float | None,
        deadline: float | None,
        timeout: float | None,
        permits: int,
        waiter: Waiter | None = None,
        first: Busy | BaseException | None = None,
        undo: Attempt | None = None,
    ) -> Hold: ...

    async def in_turn(self, waiter: Waiter, deadline: float | None) -> tuple[bool, bool]: ...

    async def undo(self, kind: LockKind, attempt: Attempt, until: float | None = None) -> None: ...

    async def release_quietly(self, hold: Hold, *, pass_on: bool = False) -> None: ...


class FastAcquire:
    """The uncontended acquire: the acquire path's step when the lock (its *channel*) is
    idle; :meth:`acquire` is the one coroutine layer of a granted acquisition.

    A fast acquisition with a timeout joins its lock's queue: lazily if the lock has no
    queue and a turn is free (an *entry*, see WaiterHub.enter), else as the engine's
    waiters do (a *waiter*). A lazy entry stands for its waiter while nobody needs it;
    whoever does makes it, the one it would have had from the start, so the engine's
    rules apply to it unchanged: a task asking meanwhile queues behind it, a local
    release may hand it the lock, a wake meanwhile is kept for its wait. One attempt
    (``timeout=0``) joins no queue, as the acquire path's single attempt does.
    """

    def __init__(self, steps: AcquireSteps) -> None:
        self.hub = steps.hub
        self.rt = steps.rt
        self.reach = steps.reach
        # Bound once: the hot path calls them without a lookup through *steps*.
        self._adopt = steps.adopt
        self._acquire_new = steps.acquire_new
        self._wait = steps.wait
        self._in_turn = steps.in_turn
        self._undo = steps.undo
        self._timed_out = steps.timed_out
        self._manager_closed = steps.manager_closed
        self._release_quietly = steps.release_quietly
        #: acquisitions that took this step and were granted (tests and statistics)
        self.count = 0

    async def acquire(
        self,
        kind: LockKind,
        keys: LockKeys,
        owner: str,
        timeout: float | None,
        lease: float | None,
        permits: int,
        channel: str,
    ) -> Hold:
        policy = handle_policy()  # (set around this await by the handle's replicas=)
        if policy is not INHERIT and policy is not None:  # WAIT after every attempt, and
            return await self._acquire_new(
                kind, keys, owner, timeout, lease, permits
            )  # no hand-over
        hub = self.hub
        entry, waiter = self._line_up(kind, channel, owner, timeout, lease)
        called: float | None = None  # when it was called, if it waited in line
        if waiter is not None and not waiter.turn and not hub.admission.take(waiter):
            called = time.monotonic()  # (at most WAKES talk to Redis: see _first_in_line)
            deadline = None if timeout is None else called + timeout
            if not await self._first_in_line(waiter, deadline):
                return await self._wait(
                    kind, keys, owner, lease, deadline, timeout, permits, waiter
                )
        rt = self.rt
        lease_s = rt.lease if lease is None else lease
        number = next(rt.ids)  # (rt.next_id(), without a call of its own)
        # (the void marker's key is keys.void(<id unique across clients>), spelled out)
        attempt = new_tuple(Attempt, (
            keys, owner, kind.hold_field(owner, number), 0, lease_s,
            f"{keys.void_prefix}{rt.manager_id}:{number}", permits, timeout != 0, 0,
        ))  # fmt: skip
        sent_at = time.monotonic()
        since = called or sent_at  # (a deadline counts from the call)
        try:
            outcome = await kind.attempt(attempt)
        except (LockConnectionError, ReplicaAckError, asyncio.CancelledError) as exc:
            if isinstance(exc, LockConnectionError) and not hub.closed:
                self.reach.failed(exc)  # every waiter of the manager may report it
            return await self._not_granted(kind, keys, owner, lease, timeout, permits,
                                           entry, waiter, exc, since, attempt)  # fmt: skip
        except Exception as exc:  # (a key of another type, a refusal): the wait raises it
            return await self._not_granted(kind, keys, owner, lease, timeout, permits,
                                           entry, waiter, exc, None)  # fmt: skip
        except BaseException:  # closed, interrupted: nothing may be awaited now
            _out_of_line(hub, channel, entry, waiter)
            raise
        if self.reach.failure is not None:
            self.reach.reached()
        if isinstance(outcome, Busy):
            return await self._not_granted(kind, keys, owner, lease, timeout, permits,
                                           entry, waiter, outcome, since)  # fmt: skip
        hold = Hold(
            kind, keys, owner, attempt.field, outcome.token, lease_s, lease is None, sent_at,
            permits,
        )  # fmt: skip
        if hub.closed:  # the manager closed while the attempt was in flight
            await self._closed_meanwhile(hold, channel, entry, waiter)
        return self._granted(hold, channel, entry, waiter)

    def _line_up(
        self, kind: LockKind, channel: str, owner: str, timeout: float | None, lease: float | None
    ) -> tuple[FastEntry | None, Waiter | None]:
        """Its place in its lock's queue: a lazy entry if it may have one, else a waiter;
        neither for one attempt (``timeout=0``), as the acquire path's single attempt."""
        if timeout == 0:
            return None, None
        hub = self.hub
        entry = hub.enter(
            channel, owner, lease, queued=kind.queued, anonymous=kind.anonymous_messages
        )
        if entry is not None:
            return entry, None
        return None, hub.join(
            channel, owner, lease, queued=kind.queued,
            anonymous=kind.anonymous_messages, turn=True,
        )  # fmt: skip

    def _granted(
        self, hold: Hold, channel: str, entry: FastEntry | None, waiter: Waiter | None
    ) -> Hold:
        """Redis granted *hold*: register it for the task, and leave the queue."""
        try:
            self._adopt(hold, granted=True)
        except BaseException:
            _out_of_line(self.hub, channel, entry, waiter)
            raise
        # A shared grant lets the next waiter try at once, as a failed one does. (An
        # entry nobody needed is only dropped: see WaiterHub.drop.)
        if entry is not None:
            self.hub.drop(channel, entry, acquired=not hold.kind.shared)
        elif waiter is not None:
            self.hub.leave(waiter, acquired=not hold.kind.shared)
        self.count += 1
        return hold

    async def _closed_meanwhile(
        self, hold: Hold, channel: str, entry: FastEntry | None, waiter: Waiter | None
    ) -> NoReturn:
        """The manager closed while the granting attempt was in flight: give it back."""
        try:
            await self._release_quietly(hold)
            raise self._manager_closed()
        except BaseException:
            _out_of_line(self.hub, channel, entry, waiter)
            raise

    async def _not_granted(
        self,
        kind: LockKind,
        keys: LockKeys,
        owner: str,
        lease: float | None,
        timeout: float | None,
        permits: int,
        entry: FastEntry | None,
        waiter: Waiter | None,
        first: Busy | BaseException,
        since: float | None,
        undo: Attempt | None = None,
    ) -> Hold:
        """The fast path's one attempt did not grant the lock: it found it held (*first*
        is Busy), or raised *first* (*undo*: the attempt, which may have run, when it
        failed in flight). The engine's wait goes on from there with its waiter, made
        from the lazy entry if it has one, its deadline counted from *since* (None: it
        has none, the wait raises *first*); with no waiter (timeout=0: one attempt) the
        outcome is final."""
        if entry is not None:
            waiter = self.hub.materialize(keys.channel, entry)
        if waiter is None:
            if undo is not None:
                await self._undo(kind, undo)  # it may have run
            if isinstance(first, Busy):
                self._timed_out(kind, keys)
                raise kind.timeout_error(keys, timeout, permits)
            raise first
        # The wait undoes the attempt first, then rides out a connection error until the
        # deadline, or lets the cancellation go on; its exit leaves the queue.
        deadline = None if timeout is None or since is None else since + timeout
        return await self._wait(
            kind, keys, owner, lease, deadline, timeout, permits, waiter, first, undo
        )

    async def _first_in_line(self, waiter: Waiter, deadline: float | None) -> bool:
        """Wait for a turn for *waiter*'s first attempt: whether it has one.

        Without a bound, N tasks that ask for N locks at once (a burst, a start-up) put N
        attempts in the client's pipeline queue, where they waited long enough for
        CPython's cyclic GC to move them to its oldest generation, whose full collections
        walk every waiter (50,000 queued at 50,000 new waiters). A lone
        acquisition never waits here: a turn is free while fewer than WAKES are taken.
        Without one (the hub closed, a hand-over came, or the deadline passed in line),
        the acquire path's wait goes on with this waiter, its place in line included.
        """
        try:
            await self._in_turn(waiter, deadline)
        except BaseException:
            self.hub.leave(waiter, acquired=False)
            raise
        return waiter.turn and not self.hub.closed and waiter.handed is None


class ReleaseSteps(Protocol):
    """What the fast release uses of its release path
    (:class:`~aiolock._engine.release.ReleasePath`): its parts, and the steps of a final
    release it shares with that path."""

    registry: HoldRegistry
    cleanup: Cleanup

    def release_id(self, hold: Hold) -> str: ...

    def send_final(self, hold: Hold, release_id: str) -> Awaitable[Released]: ...

    def apply_release(self, hold: Hold, outcome: Released) -> LockError | None: ...

    async def unconfirmed(
        self, hold: Hold, release_id: str, handoff: None, exc: BaseException
    ) -> None: ...


class FastRelease:
    """The final release with nobody to hand the lock to: the release path's step."""

    def __init__(self, steps: ReleaseSteps) -> None:
        self.registry = steps.registry
        self.cleanup = steps.cleanup
        # Bound once: the hot path calls them without a lookup through *steps*.
        self._release_id = steps.release_id
        self._send_final = steps.send_final
        self._apply_release = steps.apply_release
        self._unconfirmed = steps.unconfirmed
        #: final releases that took this step (tests and statistics)
        self.count = 0

    async def release(self, hold: Hold) -> None:
        """Release *hold* (its count 1, and nobody of this manager waits for its lock)."""
        # Closing waits for the releases in progress (see ReleasePath._release).
        self.cleanup.begin()
        try:
            release_id = self._release_id(hold)  # every resend, from any path, uses it
            try:  # (ReleasePath._send with no hand-over, without a coroutine layer of its own)
                error = self._apply_release(hold, await self._send_final(hold, release_id))
            except BaseException as exc:
                await self._unconfirmed(hold, release_id, None, exc)
                raise
            self.count += 1
            if error is not None:
                self.registry.pop_lost(hold.resource, hold.owner)  # reported right here
                raise error
        finally:
            self.cleanup.end()


def _out_of_line(
    hub: WaiterHub, channel: str, entry: FastEntry | None, waiter: Waiter | None
) -> None:
    """An acquisition that is over without a hold leaves its place in line (nothing
    awaited: it may be closing or interrupted)."""
    if entry is not None:
        hub.drop(channel, entry, acquired=False)
    elif waiter is not None:
        hub.leave(waiter, acquired=False)
