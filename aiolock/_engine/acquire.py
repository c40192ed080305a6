"""The acquire path: the local queue, attempts, waits for a release, and undoing attempts.

:class:`AcquirePath` owns the acquisitions of one open manager. Every acquiring task
joins its lock's local queue (:mod:`aiolock._engine.hub`); the head tries, the others
wait for their turn; a waiter of a kind with claims registers in Redis under one field
for its whole wait (kept alive by :mod:`aiolock._engine.claims`). An acquisition whose
lock is idle takes the fast path's step (:class:`~aiolock._engine.fast.FastAcquire`,
made by this path); one that waits runs a :class:`~aiolock._engine.wait.Wait`, which
calls back into this path for its attempts, probes, turns and undos. One attempt
(:meth:`AcquirePath.attempt`) runs the kind's script, under ``WAIT`` when replicas must
acknowledge it, and is undone if it fails or is cancelled in flight. The path is made
from the engine's shared parts (:class:`~aiolock._engine.state.EngineState`) and the
release path (:class:`~aiolock._engine.release.ReleasePath`), which gives back what an
acquisition may not keep and releases the holds of tasks that ended. The overview of
the whole protocol is in :mod:`aiolock._engine.engine`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any

from aiolock._engine.cleanup import finish_despite_cancel, send_or
from aiolock._engine.fast import FastAcquire
from aiolock._engine.kind import Attempt, Busy, Granted, Hold, LockKind
from aiolock._engine.release import ReleasePath
from aiolock._engine.state import ORPHAN, EngineState
from aiolock._engine.turns import still_starving
from aiolock._engine.wait import Wait
from aiolock._engine.waiter import Waiter
from aiolock._errors import (
    LockConnectionError,
    LockError,
    LockLostError,
    ReplicaAckError,
)
from aiolock._keys import LockKeys, ms
from aiolock._observe import failure_reason
from aiolock._redis.replicas import ReplicaPolicy, acknowledged, effective_policy

__all__ = ["AcquirePath"]

logger = logging.getLogger("aiolock")


class AcquirePath:
    """Acquisitions: re-entry, the fast path's step, waiting, attempts and their undo.

    Made from the engine's shared parts and its release path; it keeps of them what it
    uses, and owns its fast step and the count of connection errors its waits rode out.
    """

    def __init__(self, state: EngineState, releases: ReleasePath) -> None:
        self.rt = state.rt
        self.hub = state.hub
        self.registry = state.registry
        self.observers = state.observers
        self.contention = state.contention
        self.heed = state.heed
        self.reach = state.reach
        self.cleanup = state.cleanup
        self.claims = state.claims
        self.listeners = state.listeners
        self.starved = state.starved
        self.acquired = state.acquired
        self.timed_out = state.timed_out
        self.manager_closed = state.manager_closed
        #: round trips that failed on a connection error and were ridden out or retried
        self.connection_errors = 0
        self.release_quietly = releases.release_quietly
        self.release_lost = releases.release_lost
        self._lost_at_birth = releases.lost_at_birth
        self._watched = releases.watched
        self._watch = releases.watch
        #: the fast path's step: an acquisition whose lock is idle
        self.fast = FastAcquire(self)
        self._acquire_fast = self.fast.acquire  # (bound: no lookup through self.fast)

    # -- acquire -----------------------------------------------------------------------

    def acquire(
        self,
        kind: LockKind,
        keys: LockKeys,
        owner: str,
        timeout: float | None,
        lease: float | None,
        permits: int = 1,
    ) -> Coroutine[Any, Any, Hold]:
        """A new hold of *kind* on *keys* for *owner* (or its hold, re-entered): awaitable.

        Chooses the coroutine that does the work and hands it back (no layer of its own):
        the fast path's step (:class:`~aiolock._engine.fast.FastAcquire`) when the lock
        is idle and nothing asks for more, else this path's general way.
        """
        hub = self.hub
        channel = keys.channel
        if (
            kind.claims
            or channel in self.starved  # its first attempt asks for a turn
            or hub.closed
            or self.observers.active
            or self.rt.replicas is not None
            or not hub.idle(channel)
            or (
                kind.reentrant
                and self.registry.get(
                    keys.lock if kind.resource_is_key else kind.resource(keys), owner
                )
                is not None
            )
        ):
            return self._acquire(kind, keys, owner, timeout, lease, permits)
        return self._acquire_fast(kind, keys, owner, timeout, lease, permits, channel)

    def _acquire(
        self,
        kind: LockKind,
        keys: LockKeys,
        owner: str,
        timeout: float | None,
        lease: float | None,
        permits: int,
    ) -> Coroutine[Any, Any, Hold]:
        """The general way (a re-entry, observers, or the local queue's wait): this and
        :meth:`acquire_new` only choose the coroutine that does the work and hand it
        back, so an acquisition awaits through no coroutine layer of theirs (each costs
        about a microsecond, and the hot path is mostly such layers)."""
        if kind.reentrant:
            held = self.registry.get(kind.resource(keys), owner)
            if held is not None:
                return self._reenter(held, lease)
        if not self.observers.active:
            return self.acquire_new(kind, keys, owner, timeout, lease, permits)
        return self._acquire_observed(kind, keys, owner, timeout, lease, permits)

    async def _acquire_observed(
        self,
        kind: LockKind,
        keys: LockKeys,
        owner: str,
        timeout: float | None,
        lease: float | None,
        permits: int,
    ) -> Hold:
        observers = self.observers
        started = time.monotonic()
        observers.acquire_started(kind.name, keys.name)
        try:
            hold = await self.acquire_new(kind, keys, owner, timeout, lease, permits)
        except BaseException as exc:
            waited = time.monotonic() - started
            observers.acquire_failed(kind.name, keys.name, waited, failure_reason(exc))
            raise
        hold.observed_at = now = time.monotonic()
        observers.acquired(kind.name, keys.name, now - started, hold.token)
        return hold

    def acquire_new(
        self,
        kind: LockKind,
        keys: LockKeys,
        owner: str,
        timeout: float | None,
        lease: float | None,
        permits: int,
    ) -> Coroutine[Any, Any, Hold]:
        if self.hub.closed:  # stopping (LockManager.stop_acquiring) or closing
            return self._refuse()
        if timeout == 0:  # one attempt, queue or no queue, and no claim to withdraw
            return self._attempt_once(kind, keys, owner, lease, timeout, permits)
        deadline = None if timeout is None else time.monotonic() + timeout
        return self.wait(kind, keys, owner, lease, deadline, timeout, permits)

    async def _refuse(self) -> Hold:
        raise self.manager_closed()

    async def _attempt_once(
        self,
        kind: LockKind,
        keys: LockKeys,
        owner: str,
        lease: float | None,
        timeout: float,
        permits: int,
    ) -> Hold:
        outcome = await self.attempt(kind, keys, owner, lease, permits=permits, claim=False)
        if isinstance(outcome, Hold):
            return outcome
        self.timed_out(kind, keys)
        raise kind.timeout_error(keys, timeout, permits)

    async def _reenter(self, hold: Hold, lease: float | None) -> Hold:
        if hold.renew:
            lease = None  # the outer hold decides: it stays auto-renewed
        elif lease is None:
            lease = hold.lease
        outcome = await self.attempt(hold.kind, hold.keys, hold.owner, lease, hold)
        if isinstance(outcome, Hold):
            if not self.registry.alive(outcome):
                # Lost while the re-entry was in flight (its lease ended, or the watchdog
                # found it gone): Redis counted the re-entry, but the hold is not this
                # task's any more. Free it; the outer holder learns of the loss as usual.
                self.release_lost(outcome)
                raise LockLostError(
                    f"lock {hold.keys.name!r} was lost while this task re-entered it "
                    f"({outcome.lost_reason}); another owner may have entered the "
                    "critical section meanwhile"
                )
            return outcome
        now = (
            f"now held by another owner for {outcome.ttl:.3f} s more"
            if outcome.ttl > 0
            else "it had expired"
        )
        self.registry.lose_reported(hold, f"it was gone when the task re-entered it ({now})")
        raise LockLostError(
            f"lock {hold.keys.name!r} was lost before this task re-entered it ({now}); "
            "another owner may have entered the critical section meanwhile"
        )

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
    ) -> Hold:
        """Wait for *keys* in the local queue, attempting whenever it is this task's turn
        (:class:`~aiolock._engine.wait.Wait`).

        The fast path's step (:class:`~aiolock._engine.fast.FastAcquire`) continues here
        when its one attempt did not grant the lock: its *waiter* (already the head of its
        queue), the *first* outcome (Busy, or the exception the attempt raised) in place
        of the first attempt, and the *undo* of that attempt if it failed in flight, which
        is sent first, exactly as :meth:`attempt` sends it, before the failure is handled.
        """
        hub = self.hub
        # A waiter that registers in Redis keeps one field for its whole wait: it names
        # its registration, and (queued kinds) a release message wakes it by that name.
        # (The fast path takes no kind with claims, so a waiter it hands over has none.)
        field = f"{owner}:{self.rt.next_id()}" if kind.claims else None
        if waiter is None:
            waiter = hub.join(
                keys.channel, owner, lease, field,
                queued=kind.queued, anonymous=kind.anonymous_messages,
                acknowledged=effective_policy(self.rt.replicas) is not None,
            )  # fmt: skip
        if kind.turns and self.starved:
            still_starving(self.starved, waiter.queue)
        wait = Wait(
            self, kind, keys, owner, lease, deadline, timeout, permits, waiter, field, first
        )
        return await wait.run(undo)

    async def in_turn(self, waiter: Waiter, deadline: float | None) -> tuple[bool, bool]:
        """A head whose timer ran out waits for a turn (``hub.admission.take``, see there):
        whether it tries now, and whether as woken (its wake waited in line: an attempt)
        or as a timer that ran out (a quiet wait's probe, when the wait is quiet).

        It does not try if its deadline passes before its turn comes; the wait then ends
        as any wait whose deadline passed does.
        """
        hub = self.hub
        woken = waiter.deferred  # a wake of it already waited in line
        if hub.closed or hub.failure is not None or hub.admission.take(waiter):
            return True, woken
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                hub.admission.step_out(waiter)
                return False, woken
            if await waiter.wait(remaining):
                # Its turn, or a hand-over, or the hub closed (the loop sees to those).
                # A wake that came while it waited was taken by the line (see
                # Admission.wake): the probe that follows sees what it announced.
                return True, woken

    async def still_held(self, kind: LockKind, keys: LockKeys) -> float | None:
        """Seconds the lock has left if it is still held, probed without an attempt.

        The safety net of a quiet wait. A head whose attempt found the lock busy
        sleeps until a release message wakes it, or until the holder's lease would end.
        While its subscription was confirmed before that attempt and the pub/sub
        connection was not lost since (``hub.losses`` unchanged), no release was missed:
        the lock can have become free unheard only by its key ending without a release,
        when the holder died or stopped renewing (or an eviction, a flush, a deletion by
        hand). The probe sees exactly that: the key's PTTL, one plain command, instead of
        a full attempt that also re-registers the waiter. A live holder renews before its
        lease ends, so the head finds a new lease and sleeps again; a dead holder's key
        is gone, and the head attempts at once. A holder's lease thus still ends under
        the eyes of the head, as promptly as before, at a fraction of the server's work.
        None (attempt as usual) if the kind cannot be probed or the probe failed.
        """
        try:
            return await kind.still_held(keys)
        except LockError:
            return None  # the attempt that follows reports it, or rides it out

    async def attempt(
        self,
        kind: LockKind,
        keys: LockKeys,
        owner: str,
        lease: float | None,
        hold: Hold | None = None,
        *,
        permits: int = 1,
        field: str | None = None,
        claim: bool = True,
        until: float | None = None,
        turn: bool = False,
    ) -> Hold | Busy:
        """One run of the kind's attempt: a new hold (or *hold*, re-entered), or Busy.

        With *hold*, the attempt re-enters it; otherwise it is a new acquisition under
        *field* (a queued waiter's) or under a field of its own (the owner plus this
        attempt's number).
        """
        lease_s = self.rt.lease if lease is None else lease
        if hold is not None:
            field, permits = hold.field, hold.permits
        attempt = self.new_attempt(keys, owner, field, lease_s, permits, hold, kind=kind)
        if not claim:
            attempt = attempt._replace(claim=False)
        elif turn:
            attempt = attempt._replace(turn=ms(kind.claim_ttl))
        sent_at = time.monotonic()
        replicas = effective_policy(self.rt.replicas)
        try:
            if replicas is None or hold is not None:  # (a re-entry adds no new grant)
                outcome = await kind.attempt(attempt)
            else:
                outcome = await _acknowledged_attempt(kind, attempt, replicas)
        except (LockConnectionError, ReplicaAckError, asyncio.CancelledError) as exc:
            if isinstance(exc, LockConnectionError) and not self.hub.closed:
                self.reach.failed(exc)  # every waiter of the manager may report it
            # It may have run (or too few replicas have it). Sent by the waiter's deadline
            # (*until*), else in the background.
            await self.undo(kind, attempt, until)
            raise
        if self.reach.failure is not None:
            self.reach.reached()
        if isinstance(outcome, Busy):
            return outcome
        if hold is not None:
            return await self._reentered(hold, attempt, outcome, lease_s, sent_at)
        new = Hold(
            kind, keys, owner, attempt.field, outcome.token, lease_s, lease is None, sent_at,
            permits,
        )  # fmt: skip
        if self.hub.closed:  # the manager closed while the attempt was in flight
            await self.release_quietly(new)
            raise self.manager_closed()
        return self.adopt(new, granted=True)

    async def _reentered(
        self, hold: Hold, attempt: Attempt, outcome: Granted, lease_s: float, sent_at: float
    ) -> Hold | Busy:
        """The outcome of a re-entry of *hold*: the hold, its count up; or, if the lock had
        been free (the hold had already ended and the script took the lock anew), Busy,
        and what it took given back: that is not a re-entry."""
        if outcome.held != hold.count + 1:
            stray = Hold(
                hold.kind, hold.keys, ORPHAN, attempt.field, outcome.token, lease_s, False,
                sent_at, hold.permits,
            )  # fmt: skip
            await self.release_quietly(stray)
            return Busy(0.0)
        hold.count = outcome.held
        if not hold.renew:
            self.registry.reset_lease(hold, lease_s, sent_at)
        return hold

    def new_attempt(
        self,
        keys: LockKeys,
        owner: str,
        field: str | None,
        lease: float | None,
        permits: int,
        hold: Hold | None = None,
        *,
        kind: LockKind | None = None,
    ) -> Attempt:
        rt = self.rt
        number = rt.next_id()
        if field is None:  # a new hold's field: the kind's naming, unique per acquisition
            field = f"{owner}:{number}" if kind is None else kind.hold_field(owner, number)
        # The void marker's id is unique across clients: a marker left by another
        # process's cancelled attempt must never void this one.
        return Attempt(
            keys=keys,
            owner=owner,
            field=field,
            before=0 if hold is None else hold.count,
            lease=rt.lease if lease is None else lease,
            void=keys.void(f"{rt.manager_id}:{number}"),
            permits=permits,
        )

    def adopt(self, hold: Hold, granted: bool = False) -> Hold:
        """Register *hold* for the current task, which has just acquired it (*granted*:
        from Redis, not handed over by a local release)."""
        if time.monotonic() >= hold.valid_until:
            self._lost_at_birth(hold)
        self.acquired[hold.kind.name] += 1
        contention = self.contention  # (Contention.acquired, inline but for a new entry)
        if (entry := contention.entries.get(hold.resource)) is not None:
            entry.acquisitions += 1
        elif len(contention.entries) < contention.top_k:
            contention.acquired(hold.resource, hold.kind.name, hold.keys.name)
        stale = self.registry.add(hold)
        if granted and stale is not None:
            # Before the new holder's body starts: two tasks of one manager are never
            # both inside the lock, even for the round trip a check would take.
            self.registry.lose(
                stale,
                "Redis granted the lock to another task of this manager, so it no longer "
                "had this hold (force-released, deleted, or expired there)",
            )
        if not hold.kind.shared:  # listened for once held a while (see ReleaseHeed.due)
            heed = self.heed
            heed.due.append((hold.valid_until - hold.lease + heed.after, hold))
            if heed.timer is None:
                heed.arm()
        if hold.owner not in self._watched:  # its task's end releases what it still holds
            task = asyncio.current_task()
            if task is not None:
                self._watch(task, hold.owner)
        return hold

    async def undo(self, kind: LockKind, attempt: Attempt, until: float | None = None) -> None:
        """Revert an attempt whose outcome is unknown, or void it before it runs.

        While Redis cannot be reached, the caller waits for it until *until* (its wait's
        deadline, monotonic) at most, and what is not sent by then is retried in the
        background; otherwise it is sent at once (a claim withdrawn before a timeout is
        raised, say), within SHIELD_TIMEOUT.
        """
        if self.reach.failure is None:
            until = None
        channel = attempt.keys.channel

        async def send() -> None:
            # (A queued kind's undo grants the lock to the next waiter in Redis and
            # names it in a message, which wakes that waiter alone.)
            if await kind.undo(attempt) and attempt.before == 0 and not kind.queued:
                self.hub.wake(channel)  # our own message is ignored by the hub

        # (as long as the attempt may still land: the void marker's lifetime)
        give_up_at = time.monotonic() + attempt.void_ms / 1000

        def retry_later() -> None:
            self.cleanup.add(f"undo of an acquire of {attempt.keys.name!r}", send, give_up_at)

        self.cleanup.begin()  # closing waits for it (see ReleasePath._release)
        try:
            await finish_despite_cancel(lambda: send_or(send, retry_later, until))
        finally:
            self.cleanup.end()


def _acknowledged_attempt(
    kind: LockKind, attempt: Attempt, replicas: ReplicaPolicy
) -> Coroutine[Any, Any, Granted | Busy]:
    """*attempt* with WAIT after its script (``replicas=``).

    Apart from :meth:`AcquirePath.attempt` so that its closure does not give every
    attempt's frame cells for *kind* and *attempt*: two more objects for the cyclic GC
    per attempt in flight, which a release of N locks puts N of in flight at once.
    """
    return acknowledged(
        lambda: kind.attempt(attempt),
        replicas,
        f"{kind.name} {attempt.keys.name!r}",
        granted=_granted,
    )


def _granted(outcome: Granted | Busy) -> bool:
    return isinstance(outcome, Granted)
