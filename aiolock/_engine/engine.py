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
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass
from typing import Any, NoReturn

import anyio

from aiolock._engine.cleanup import Cleanup, finish_despite_cancel, send_or
from aiolock._engine.hub import Waiter, WaiterHub
from aiolock._engine.kind import Attempt, Busy, Hold, LockKind, Released, ReleaseStatus, Successor
from aiolock._engine.registry import HoldRegistry
from aiolock._engine.runtime import TOMBSTONE_TTL, Runtime
from aiolock._engine.watchdog import Watchdog
from aiolock._errors import (
    LockConnectionError,
    LockError,
    LockKeyTypeError,
    LockLostError,
    LockPermissionError,
    ManagerNotOpenError,
    ReplicaAckError,
)
from aiolock._keys import LockKeys
from aiolock._observe import ObserverSet, failure_reason
from aiolock._redis.reach import Reachability, describe
from aiolock._redis.replicas import acknowledged_attempt, effective_policy

__all__ = ["MAX_LOCAL_STREAK", "YIELD_WINDOW", "Engine"]

logger = logging.getLogger("aiolock")

#: Seconds the head of a queue waits for its subscription to be confirmed before it
#: retries anyway (the pub/sub connection may be down; it then falls back to TTL waits).
READY_WAIT = 1.0
#: After a release that other clients heard, this manager's tasks keep off the lock for
#: this long (or until another client's release message arrives), so that the waiters
#: elsewhere, woken later than a local task could be, get their turn.
YIELD_WINDOW = 0.02
#: Hand-overs in a row within this manager while other clients wait for the same lock:
#: a few keep the fast local path (one round trip per hand-over); a bound keeps it fair.
MAX_LOCAL_STREAK = 2
#: Backoff between attempts of a waiter whose attempts fail on a connection error.
MIN_BACKOFF, MAX_BACKOFF = 0.05, 2.0
#: Registrations refreshed per script call (keep_claims). A fair lock's 500 took
#: 2.2-2.4 ms of Redis time (SLOWLOG, redis-server 7.0, 1k-5k waiters); one call for
#: all of a process's waiters took 3.8 ms at 1k and 28 ms at 5k, growing with N.
CLAIM_BATCH = 500
#: Owner of a hold handed over to a task that had given up: it belongs to no task.
ORPHAN = ""

#: The task-exit warning for a hold whose 'async with' block is still open: the task
#: left it suspended, at a yield.
_LEFT_OPEN = (
    "Its 'async with' block is still open: the lock is held across a 'yield' (an async "
    "generator, a streaming response's body) that the task stopped iterating without "
    "closing it. Close the generator (contextlib.aclosing), or see docs/semantics.md "
    "for streaming responses"
)
#: The task-exit warning for a hold acquired without 'async with', never released.
_NEVER_RELEASED = (
    "A hold belongs to the task that acquired it: a likely cause is a helper that runs "
    "the acquire in a task of its own (asyncio.wait_for on Python 3.10/3.11, "
    "create_task, gather), or a missing release()"
)


@dataclass(frozen=True)
class _Handoff:
    """A local waiter chosen to receive the lock from a final release."""

    waiter: Waiter
    successor: Successor
    renew: bool
    sent_at: float


class Engine:
    """The generic protocol of one open manager: its hub, registry, watchdog and cleanup."""

    def __init__(
        self, runtime: Runtime, hub: WaiterHub, observers: ObserverSet | None = None
    ) -> None:
        self.rt = runtime
        self.client = runtime.client
        self.hub = hub
        self.registry = HoldRegistry(on_lost=self._on_lost, on_fixed=self._on_fixed)
        #: told of every new hold's wait, acquisition and end (see aiolock._observe)
        self.observers = ObserverSet() if observers is None else observers
        self.watchdog = Watchdog(
            self.registry,
            runtime.lease,
            # on a cluster a renewal script may only touch keys of one slot
            group_by_slot=runtime.client.cluster,
            observers=self.observers,
        )
        self.cleanup = Cleanup()
        #: whether the latest attempt reached Redis: waiters that never talk to Redis
        #: themselves (all but a queue's head) report an outage from it, not contention
        self.reach = Reachability(describe(runtime.client.redis))
        #: round trips that failed on a connection error and were ridden out or retried
        self.connection_errors = 0
        #: holds released because the task that held them ended
        self.released_on_task_exit = 0
        #: per kind name: acquisitions (new holds), timeouts, holds lost
        self.acquired: Counter[str] = Counter()
        self.timeouts: Counter[str] = Counter()
        self.lost: Counter[str] = Counter()
        self._watched: set[str] = set()
        #: kinds with claims: (kind, lock key) -> the fields of this manager's waiters
        self._claims: dict[tuple[LockKind, str], tuple[LockKeys, set[str]]] = {}

    def _on_lost(self, hold: Hold) -> None:
        self.lost[hold.kind.name] += 1
        if hold.observed_at is not None:
            self._ended(hold, hold.lost_reason)
        # The lock may be free now (or soon): the local head should try for it.
        self.hub.wake(hold.kind.channel(hold.keys))

    def _on_fixed(self, hold: Hold) -> None:
        self.watchdog.reschedule(hold.next_check)

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

        This and :meth:`_acquire_new` only choose the coroutine that does the work and hand
        it back, so an acquisition awaits through two coroutine layers fewer (each costs
        about a microsecond, and the hot path is mostly such layers).
        """
        if kind.reentrant:
            held = self.registry.get(kind.resource(keys), owner)
            if held is not None:
                return self._reenter(held, lease)
        if not self.observers.active:
            return self._acquire_new(kind, keys, owner, timeout, lease, permits)
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
            hold = await self._acquire_new(kind, keys, owner, timeout, lease, permits)
        except BaseException as exc:
            waited = time.monotonic() - started
            observers.acquire_failed(kind.name, keys.name, waited, failure_reason(exc))
            raise
        hold.observed_at = now = time.monotonic()
        observers.acquired(kind.name, keys.name, now - started, hold.token)
        return hold

    def _ended(self, hold: Hold, lost: str | None = None) -> None:
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

    def _acquire_new(
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
        return self._wait(kind, keys, owner, lease, deadline, timeout, permits)

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
        outcome = await self._attempt(kind, keys, owner, lease, permits=permits, claim=False)
        if isinstance(outcome, Hold):
            return outcome
        self.timeouts[kind.name] += 1
        raise kind.timeout_error(keys, timeout, permits)

    async def _reenter(self, hold: Hold, lease: float | None) -> Hold:
        if hold.renew:
            lease = None  # the outer hold decides: it stays auto-renewed
        elif lease is None:
            lease = hold.lease
        outcome = await self._attempt(hold.kind, hold.keys, hold.owner, lease, hold)
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

    async def _wait(
        self,
        kind: LockKind,
        keys: LockKeys,
        owner: str,
        lease: float | None,
        deadline: float | None,
        timeout: float | None,
        permits: int,
    ) -> Hold:
        hub = self.hub
        channel = kind.channel(keys)
        # A waiter that registers in Redis keeps one field for its whole wait: it names
        # its registration, and (queued kinds) a release message wakes it by that name.
        field = f"{owner}:{self.rt.next_id()}" if kind.claims else None
        waiter = hub.join(
            channel, owner, lease, field, queued=kind.queued, anonymous=kind.anonymous_messages
        )
        waiter.acknowledged = effective_policy(self.rt.replicas) is not None
        acquired = False
        claimed = False
        try:
            should_try = waiter.is_head  # the head tries at once; the rest wait their turn
            ttl: float | None = None
            #: hub.losses when an attempt, sent with the subscription confirmed, found the
            #: lock busy (None otherwise): then a wait that ends unwoken probes instead
            quiet: int | None = None
            woken = True
            backoff = MIN_BACKOFF
            failure: LockConnectionError | None = None
            while True:
                if waiter.handed is not None:  # a local releaser handed the lock over
                    acquired = True
                    return self._adopt(waiter.handed)
                if hub.closed:
                    raise self.manager_closed()
                if hub.failure is not None:
                    raise LockPermissionError(hub.failure)
                if should_try:
                    losses = hub.losses if hub.confirmed(channel) else None
                    ttl = hub.yielding(channel)  # others' turn first: try when it ends
                    if ttl > 0:
                        waiter.queue.answered = True  # other clients were heard waiting
                    elif (
                        not woken
                        and losses is not None
                        and losses == quiet
                        and (probed := await self._still_held(kind, keys))
                    ):
                        ttl = probed  # renewed by a live holder: no attempt needed
                    else:
                        quiet = None
                        try:
                            outcome = await self._attempt(
                                kind, keys, owner, lease, permits=permits, field=field
                            )
                        except LockConnectionError as exc:
                            # Ride it out until this waiter's own deadline.
                            self.connection_errors += 1
                            failure, ttl = exc, backoff
                            backoff = min(backoff * 2, MAX_BACKOFF)
                            if field is not None:
                                # The undo of that attempt may still be retried in the
                                # background, and it withdraws whatever its field holds
                                # when it lands, a later grant included: go on under a
                                # new field (that undo withdrew the old one's place anyway).
                                if claimed:
                                    claimed = False
                                    self._unclaim(kind, keys, field)
                                field = hub.rename(waiter, f"{owner}:{self.rt.next_id()}")
                        else:
                            if isinstance(outcome, Hold):
                                acquired = True
                                return outcome
                            failure, backoff = None, MIN_BACKOFF
                            quiet = losses
                            waiter.queue.answered = True
                            ttl = outcome.ttl if outcome.ttl > 0 else self.rt.lease
                            if field is not None and not claimed:
                                claimed = True
                                self._claim(kind, keys, field)
                            hub.listen(waiter)
                            if not hub.confirmed(channel) and (
                                not kind.queued or hub.first(waiter)
                            ):
                                # The confirmation wakes it. (A queued kind's later
                                # waiters cannot be granted before the first: the hub
                                # wakes each when it becomes the first, see _hub.)
                                ttl = min(ttl, READY_WAIT)
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    failure = failure or self.reach.failure
                    if failure is not None:  # an outage, whichever attempt saw it last
                        what = f"{kind.name} {keys.name!r}"
                        raise self.reach.unreachable_error(what, timeout, failure) from failure
                    self.timeouts[kind.name] += 1
                    if not waiter.queue.answered:  # nobody was seen holding it
                        raise self.reach.unanswered_error(f"{kind.name} {keys.name!r}", timeout)
                    raise kind.timeout_error(keys, timeout, permits)
                woken = await waiter.wait(
                    _shortest(remaining, ttl) if waiter.is_head else remaining
                )
                should_try = woken or waiter.is_head
        finally:
            # A shared grant lets the next waiter try at once, as a failed one does.
            hub.leave(waiter, acquired=acquired and not kind.shared)
            if field is not None:
                if claimed:
                    self._unclaim(kind, keys, field)
                if not acquired:
                    # Withdraw the registration now (and pass on a grant that came too
                    # late), rather than when it expires.
                    await self._undo(
                        kind, self._new_attempt(keys, owner, field, lease, permits, kind=kind)
                    )
            if not acquired and waiter.handed is not None:
                # The lock was handed over just as this task gave up: pass it on, without
                # ever registering it under this task.
                orphan, waiter.handed = waiter.handed, None
                orphan.owner = ORPHAN
                await self.release_quietly(orphan, pass_on=True)

    async def _still_held(self, kind: LockKind, keys: LockKeys) -> float | None:
        """Seconds the lock has left if it is still held, probed without an attempt.

        The safety net of a quiet wait (issue 24). A head whose attempt found the lock busy
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

    async def _attempt(
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
    ) -> Hold | Busy:
        """One run of the kind's attempt: a new hold (or *hold*, re-entered), or Busy.

        With *hold*, the attempt re-enters it; otherwise it is a new acquisition under
        *field* (a queued waiter's) or under a field of its own (the owner plus this
        attempt's number).
        """
        lease_s = self.rt.lease if lease is None else lease
        if hold is not None:
            field, permits = hold.field, hold.permits
        attempt = self._new_attempt(keys, owner, field, lease_s, permits, hold, kind=kind)
        if not claim:
            attempt = attempt._replace(claim=False)
        sent_at = time.monotonic()
        replicas = effective_policy(self.rt.replicas)
        try:
            if replicas is None or hold is not None:  # (a re-entry adds no new grant)
                outcome = await kind.attempt(attempt)
            else:
                outcome = await acknowledged_attempt(kind, attempt, replicas)
        except (LockConnectionError, ReplicaAckError, asyncio.CancelledError) as exc:
            if isinstance(exc, LockConnectionError) and not self.hub.closed:
                self.reach.failed(exc)  # every waiter of the manager may report it
            await self._undo(kind, attempt)  # it may have run (or too few replicas have it)
            raise
        if self.reach.failure is not None:
            self.reach.reached()
        if isinstance(outcome, Busy):
            return outcome
        if hold is not None:  # a re-entry
            if outcome.held != hold.count + 1:
                # The lock was free: the hold being re-entered had already ended, and the
                # script took the lock anew. That is not a re-entry: give it back.
                stray = Hold(
                    kind, keys, ORPHAN, attempt.field, outcome.token, lease_s, False, sent_at,
                    permits,
                )  # fmt: skip
                await self.release_quietly(stray)
                return Busy(0.0)
            hold.count = outcome.held
            if not hold.renew:
                self.registry.reset_lease(hold, lease_s, sent_at)
            return hold
        new = Hold(
            kind, keys, owner, attempt.field, outcome.token, lease_s, lease is None, sent_at,
            permits,
        )  # fmt: skip
        if self.hub.closed:  # the manager closed while the attempt was in flight
            await self.release_quietly(new)
            raise self.manager_closed()
        return self._adopt(new)

    def _new_attempt(
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

    def _adopt(self, hold: Hold) -> Hold:
        """Register *hold* for the current task, which has just acquired it."""
        if time.monotonic() >= hold.valid_until:
            self._lost_at_birth(hold)
        self.acquired[hold.kind.name] += 1
        self.registry.add(hold)
        if hold.owner not in self._watched:
            task = asyncio.current_task()
            if task is not None:
                self._watched.add(hold.owner)
                owner = hold.owner
                task.add_done_callback(lambda t: self._task_done(t, owner))
        return hold

    def _lost_at_birth(self, hold: Hold) -> NoReturn:
        """*hold*'s lease ended (by this client's clock) before the reply that granted it
        arrived: Redis may have freed it already, so it is never handed to the caller."""
        hold.lost = True
        hold.lost_reason = "its lease had ended before the reply that granted it arrived"
        self.lost[hold.kind.name] += 1
        logger.warning("lock %r lost: %s", hold.keys.name, hold.lost_reason)
        self.release_lost(hold)  # in case Redis still has it
        raise LockLostError(
            f"lock {hold.keys.name!r} was granted, but its lease of {hold.lease:g} s had "
            "ended before the reply arrived (Redis or the network was slow, or the event "
            "loop was blocked); it is given back and nothing is held. Try again, or give "
            "a longer lease="
        )

    async def _undo(self, kind: LockKind, attempt: Attempt) -> None:
        """Revert an attempt whose outcome is unknown, or void it before it runs."""
        channel = kind.channel(attempt.keys)

        async def send() -> None:
            # (A queued kind's undo grants the lock to the next waiter in Redis and
            # names it in a message, which wakes that waiter alone.)
            if await kind.undo(attempt) and attempt.before == 0 and not kind.queued:
                self.hub.wake(channel)  # our own message is ignored by the hub

        give_up_at = time.monotonic() + attempt.lease

        def retry_later() -> None:
            self.cleanup.add(f"undo of an acquire of {attempt.keys.name!r}", send, give_up_at)

        self.cleanup.begin()  # closing waits for it (see release())
        try:
            await finish_despite_cancel(lambda: send_or(send, retry_later))
        finally:
            self.cleanup.end()

    # -- kinds with claims: registrations of waiting tasks -----------------------------

    def _claim(self, kind: LockKind, keys: LockKeys, field: str) -> None:
        entry = self._claims.get((kind, keys.lock))
        if entry is None:
            entry = self._claims[(kind, keys.lock)] = (keys, set())
        entry[1].add(field)

    def _unclaim(self, kind: LockKind, keys: LockKeys, field: str) -> None:
        entry = self._claims.get((kind, keys.lock))
        if entry is not None:
            entry[1].discard(field)
            if not entry[1]:
                del self._claims[(kind, keys.lock)]

    @property
    def claims(self) -> int:
        """Registrations of this manager's waiting tasks kept alive in Redis."""
        return sum(len(fields) for _, fields in self._claims.values())

    async def keep_claims(self) -> None:
        """Refresh the registrations of waiting tasks (kinds with claims), in batches.

        A background task of the manager. Each kind's registrations expire after its
        ``claim_ttl`` unless refreshed; they are refreshed every third of it, so a waiter
        whose process died leaves the queue within that time.
        """
        while True:
            period = min((kind.claim_ttl for kind, _ in self._claims), default=1.0) / 3
            await anyio.sleep(period)
            for (kind, _), (keys, fields) in list(self._claims.items()):
                ordered = sorted(fields)
                # In calls of at most CLAIM_BATCH: one script over all of them would keep
                # Redis from anything else for longer the more waiters there are.
                for start in range(0, len(ordered), CLAIM_BATCH):
                    try:
                        await kind.refresh_claims(keys, ordered[start : start + CLAIM_BATCH])
                    except LockError as exc:  # the waiters' own attempts report it
                        logger.warning("refreshing the waiters of %r failed: %s", keys.name, exc)
                        break

    # -- owner tasks that end while holding --------------------------------------------

    def _task_done(self, task: asyncio.Task[object], owner: str) -> None:
        self._watched.discard(owner)
        self.registry.forget_owner(owner)  # no task can ask about its lost holds now
        for hold in self.registry.of_owner(owner):
            self.released_on_task_exit += 1
            # Name the kind: a semaphore's permits are no "lock" to whoever reads this.
            what = "a permit of semaphore" if hold.kind.name == "semaphore" else hold.kind.name
            logger.warning(
                "%s %r was still held by task %r when the task ended; aiolock releases it now. %s",
                what,
                hold.keys.name,
                task.get_name(),
                _LEFT_OPEN if hold.scopes else _NEVER_RELEASED,
            )
            self.registry.remove(hold)
            self._ended(hold)
            hold.owner = ORPHAN
            self._release_in_background(hold, "release of a hold whose task ended")

    # -- release -----------------------------------------------------------------------

    async def release(self, hold: Hold) -> None:
        """Release one hold; the last one frees the lock or hands it to the next local waiter."""
        # Closing waits for the releases in progress (Cleanup.drain): a holder cancelled
        # at a graceful shutdown may still be sending its release, or passing on a
        # hand-over to a waiter that gave up, when the manager closes.
        self.cleanup.begin()
        try:
            await self._release(hold)
        finally:
            self.cleanup.end()

    async def _release(self, hold: Hold) -> None:
        if hold.count > 1:
            await self._release_nested(hold)
            return
        release_id = self._release_id(hold)  # every resend, from any path, uses it
        handoff = self._reserve_successor(hold)

        async def send() -> LockError | None:
            outcome = await self._send_final(hold, release_id, handoff)
            if handoff is not None:
                handoff.waiter.reserved = False
            error = self._apply_release(hold, outcome)
            if handoff is not None and outcome.status is ReleaseStatus.HANDED_OVER:
                await self._deliver(hold, handoff, outcome.value)
            return error

        def hand_over() -> None:
            # Unconfirmed: the retrier owns the hold now. Parked, it no longer counts as
            # held, so this task's next acquire takes a new field and simply waits for
            # the old hold to be released (or to expire): it never re-enters it.
            self.registry.park(hold)
            self._ended(hold)  # for its owner, the hold ends here
            what = f"release of {hold.keys.name!r}"
            self.cleanup.add(what, send, max(hold.valid_until, time.monotonic()))
            if handoff is not None:  # the queue's head fends for itself meanwhile
                handoff.waiter.reserved = False
                self.hub.wake(hold.kind.channel(hold.keys))

        try:
            error = await send()
        except asyncio.CancelledError:
            # The command may or may not have run; sending it again is harmless.
            await finish_despite_cancel(lambda: send_or(send, hand_over))
            raise
        except LockConnectionError:
            hand_over()
            raise
        except LockKeyTypeError:
            self.registry.unpark(hold, settled=False)
            self.registry.lose_reported(hold, "its key was replaced by a value of another type")
            raise
        if error is not None:
            self.registry.pop_lost(hold.resource, hold.owner)  # reported right here
            raise error

    def _release_id(self, hold: Hold) -> str:
        """The id of *hold*'s final release, made when it is first sent."""
        if hold.release_id is None:
            hold.release_id = f"{self.rt.manager_id}:{self.rt.next_id()}"
            hold.release_sent_at = time.monotonic()
        return hold.release_id

    def _send_final(
        self, hold: Hold, release_id: str, handoff: _Handoff | None = None
    ) -> Awaitable[Released]:
        """The kind's final release of *hold* (awaitable; no coroutine layer of its own)."""
        channel = hold.kind.channel(hold.keys)
        return hold.kind.release(
            hold,
            1,
            release_id,
            handoff.successor if handoff is not None else None,
            self.hub.streak(channel) < MAX_LOCAL_STREAK,
            self.hub.listening(channel),
        )

    def _reserve_successor(self, hold: Hold) -> _Handoff | None:
        if not hold.kind.hand_over:
            return None
        waiter = self.hub.successor(hold.kind.channel(hold.keys))
        # A waiter under replicas= gets its grant by an acknowledged attempt: a hand-over
        # is a grant that no WAIT follows.
        if waiter is None or waiter.acknowledged:
            return None
        waiter.reserved = True
        lease = self.rt.lease if waiter.lease is None else waiter.lease
        field = hold.kind.hold_field(waiter.owner, self.rt.next_id())
        return _Handoff(waiter, Successor(field, lease), waiter.lease is None, time.monotonic())

    async def _deliver(self, hold: Hold, handoff: _Handoff, token: int) -> None:
        """Redis handed the lock to *handoff*'s waiter: give it the hold, or pass it on."""
        waiter, successor = handoff.waiter, handoff.successor
        new = Hold(hold.kind, hold.keys, waiter.owner, successor.field, token,
                   successor.lease, handoff.renew, handoff.sent_at, hold.permits)  # fmt: skip
        if waiter.left or self.hub.closed:  # it gave up meanwhile: it must never see it
            new.owner = ORPHAN
            await self.release_quietly(new, pass_on=True)
        else:
            waiter.give(new)  # registered by the waiter's own task when it takes it

    async def _release_nested(self, hold: Hold) -> None:
        """Release one of several holds: only the count changes, and the client's count rules.

        The script sets the count to the client's count minus one, and the final release
        deletes the lock whatever the count, so an unconfirmed decrement needs no retry:
        the local count goes down regardless, and a lost or resent command changes nothing
        that matters.
        """
        count = hold.count
        hold.count -= 1  # whatever becomes of the command, even if it is cancelled
        try:
            outcome = await hold.kind.release(hold, count, "-", None, False, False)
        except LockConnectionError as exc:
            logger.warning(
                "lock %r: a nested release was not confirmed (%s); the outer "
                "release will settle it",
                hold.keys.name,
                exc,
            )
            return
        error = self._apply_release(hold, outcome)
        if error is not None:
            self.registry.pop_lost(hold.resource, hold.owner)  # reported right here
            raise error

    def _apply_release(self, hold: Hold, outcome: Released) -> LockError | None:
        """Update local state from a release's outcome; the error to raise, if any."""
        status = outcome.status
        if status is ReleaseStatus.STILL_HELD:
            hold.count = outcome.value
            return None
        self.registry.remove(hold)
        self.registry.unpark(hold, settled=status is not ReleaseStatus.NOT_HELD)
        if hold.observed_at is not None and status is not ReleaseStatus.NOT_HELD:
            self._ended(hold)  # (NOT_HELD: the loss below reports it)
        channel = hold.kind.channel(hold.keys)
        if status is ReleaseStatus.RELEASED:
            hold.count = 0
            hold.release_id = None
            self.hub.count_handover(channel, handed=False)
            if hold.kind.queued:
                pass  # Redis granted the next waiter; its release message wakes it alone
            elif outcome.value > 0:  # others heard it: our own tasks yield to them a while
                self.hub.yield_to_others(channel, YIELD_WINDOW)
            else:
                self.hub.wake(channel)
            return None
        if status is ReleaseStatus.HANDED_OVER:
            hold.count = 0
            hold.release_id = None
            self.hub.count_handover(channel, handed=True)
            return None
        late = time.monotonic() - hold.release_sent_at > TOMBSTONE_TTL
        hold.release_id = None
        # Remembered: a background retry has nobody to raise to, so the owner's next
        # release() reports it; a caller that raises the error itself forgets it.
        self.registry.lose(hold, "Redis no longer had it when it was released")
        return LockLostError(
            f"lock {hold.keys.name!r} was no longer held by this task when it was "
            "released: its lease ended or it was force-released, so another owner may "
            "have entered the critical section"
            + (
                f" (or this release ran more than {TOMBSTONE_TTL:.0f} s ago and its reply was lost)"
                if late
                else ""
            )
        )

    def release_lost(self, hold: Hold) -> None:
        """A hold lost locally may still exist in Redis: free it in the background."""
        if self.hub.closed:
            return  # closing released what it could; nothing would run this job now
        self._release_in_background(hold, f"release of lost {hold.keys.name!r}")

    def _release_in_background(self, hold: Hold, what: str) -> None:
        release_id = self._release_id(hold)
        self.cleanup.add(what, lambda: self._free(hold, release_id), time.monotonic() + hold.lease)

    async def _free(self, hold: Hold, release_id: str) -> None:
        """Send *hold*'s final release (no hand-over); wake the local head if it freed it."""
        outcome = await self._send_final(hold, release_id)
        if outcome.status is ReleaseStatus.RELEASED and not hold.kind.queued:
            self.hub.wake(hold.kind.channel(hold.keys))  # our own message is ignored by the hub

    async def release_quietly(self, hold: Hold, *, pass_on: bool = False) -> None:
        """Release *hold* entirely, logging instead of raising; *pass_on* may hand it over."""
        hold.count = 1
        self.cleanup.begin()  # closing waits for it (see release())
        try:
            if pass_on:
                await self.release(hold)
            else:
                await self._free(hold, self._release_id(hold))
                self.registry.remove(hold)
        except LockError as exc:
            hold.lost_reason += f"; releasing it failed, it expires by its lease: {exc}"
            logger.warning("could not release lock %r: %s", hold.keys.name, exc)
        finally:
            self.cleanup.end()

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
            f"lock {hold.keys.name!r} could not be extended: its lease had already ended "
            "or it was force-released"
        )

    async def force_release(self, kind: LockKind, keys: LockKeys) -> bool:
        held = await kind.force_release(keys)
        for hold in self.registry:
            if hold.keys.lock == keys.lock:
                self.registry.lose(hold, "it was force-released")
        self.hub.wake(kind.channel(keys))
        return held

    async def shutdown(self) -> None:
        """Release every hold (all counts at once) and fail the bodies still using them;
        then wait for the releases other tasks are sending (see :meth:`Cleanup.drain`)."""
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

    def manager_closed(self) -> ManagerNotOpenError:
        return ManagerNotOpenError(
            "the LockManager is closing (or stopped acquiring) and hands out no more "
            "locks; waiting tasks gave up. Open a new LockManager to keep using locks"
        )


def _shortest(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)
