"""One task's wait for one lock: the wait machine every acquisition that waits goes through.

A :class:`Wait` is made by :meth:`~aiolock._engine.acquire.AcquirePath.wait` for a task
that did not get its lock at once, from the acquire path's general way or the fast path's
step (which hands over its waiter and the outcome of its one attempt). It owns what the
wait knows, in place of a long function's locals: whether it should try now, the lease
left on the lock (``ttl``), the backoff of connection errors, whether the subscription
was confirmed when the lock was last found busy (``quiet``), its registration in Redis
(``field``, ``claimed``). Its steps:

* :meth:`run`: undo the fast path's attempt if it failed in flight, then loop: take a
  hand-over, :meth:`_try` when it is this task's turn, :meth:`_expired` past the
  deadline, else :meth:`_sleep` until woken or a timer runs out;
* :meth:`_try`: yield to others, probe instead of attempting after a quiet wait, or
  attempt; :meth:`_found_busy` records what a refusal says and listens for the release;
* :meth:`_finish`: the one cleanup of every way out (grant, timeout, error,
  cancellation): leave the queue, end the turn, withdraw the registration, pass on a
  hand-over that came too late.

The rules of who tries when are the hub's (:mod:`aiolock._engine.hub`); the attempt and its
undo are the acquire path's (:mod:`aiolock._engine.acquire`), which the wait reaches through
:class:`WaitEngine`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

from aiolock._engine.kind import Attempt, Busy, Hold, LockKind
from aiolock._engine.state import ORPHAN
from aiolock._engine.turns import STARVE_AFTER, end_turn
from aiolock._engine.waiter import Waiter
from aiolock._errors import LockConnectionError, LockPermissionError
from aiolock._keys import LockKeys
from aiolock._redis.reach import QUIET_LIMIT

if TYPE_CHECKING:
    from aiolock._engine.claims import WaiterClaims
    from aiolock._engine.cleanup import Cleanup
    from aiolock._engine.contention import Contention
    from aiolock._engine.hub import WaiterHub
    from aiolock._engine.listeners import ListenerRegistrations
    from aiolock._engine.runtime import Runtime
    from aiolock._errors import ManagerNotOpenError
    from aiolock._redis.reach import Reachability

__all__ = ["MAX_BACKOFF", "MIN_BACKOFF", "READY_WAIT", "Wait", "WaitEngine"]

#: Seconds the head of a queue waits for its subscription to be confirmed before it
#: retries anyway (the pub/sub connection may be down; it then falls back to TTL waits).
READY_WAIT = 1.0
#: Backoff between attempts of a waiter whose attempts fail on a connection error.
MIN_BACKOFF, MAX_BACKOFF = 0.05, 2.0


class WaitEngine(Protocol):
    """What a wait uses of its acquire path (:class:`~aiolock._engine.acquire.AcquirePath`):
    its parts, and the attempt, probe, turn and undo steps it shares with the other paths."""

    hub: WaiterHub
    rt: Runtime
    reach: Reachability
    cleanup: Cleanup
    contention: Contention
    starved: dict[str, float]
    connection_errors: int
    claims: WaiterClaims
    listeners: ListenerRegistrations

    def manager_closed(self) -> ManagerNotOpenError: ...

    def timed_out(self, kind: LockKind, keys: LockKeys) -> None: ...

    def adopt(self, hold: Hold, granted: bool = False) -> Hold: ...

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
    ) -> Hold | Busy: ...

    async def still_held(self, kind: LockKind, keys: LockKeys) -> float | None: ...

    async def in_turn(self, waiter: Waiter, deadline: float | None) -> tuple[bool, bool]: ...

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
    ) -> Attempt: ...

    async def undo(self, kind: LockKind, attempt: Attempt, until: float | None = None) -> None: ...

    async def release_quietly(self, hold: Hold, *, pass_on: bool = False) -> None: ...


class Wait:
    """One task's wait for *keys* (see the module docstring)."""

    __slots__ = (
        "acquired",
        "backoff",
        "busy",
        "claimed",
        "deadline",
        "engine",
        "entered",
        "failure",
        "field",
        "first",
        "keys",
        "kind",
        "lease",
        "owner",
        "permits",
        "quiet",
        "ready_until",
        "resource",
        "should_try",
        "timeout",
        "ttl",
        "waiter",
        "woken",
    )

    def __init__(
        self,
        engine: WaitEngine,
        kind: LockKind,
        keys: LockKeys,
        owner: str,
        lease: float | None,
        deadline: float | None,
        timeout: float | None,
        permits: int,
        waiter: Waiter,
        field: str | None,
        first: Busy | BaseException | None,
    ) -> None:
        self.engine = engine
        self.kind, self.keys, self.owner, self.lease = kind, keys, owner, lease
        self.deadline, self.timeout, self.permits = deadline, timeout, permits
        self.waiter = waiter
        #: a waiter that registers in Redis keeps one field for its whole wait (renamed
        #: after a connection error: see _try)
        self.field = field
        #: the fast path's outcome, in place of the first attempt (None once used)
        self.first = first
        self.acquired = self.claimed = False
        #: (contention) whether it waits, behind a holder or other waiters, and since when
        self.busy = isinstance(first, Busy) or not waiter.is_head
        #: its lock as the registry and the contention table name it
        self.resource = kind.resource(keys)
        self.entered = engine.contention.wait_began(self.resource, kind.name, keys.name)
        self.should_try = waiter.is_head  # the head tries at once; the rest wait their turn
        self.ttl: float | None = None
        #: hub.losses when an attempt, sent with the subscription confirmed, found the
        #: lock busy (None otherwise): then a wait that ends unwoken probes instead
        self.quiet: int | None = None
        self.woken = True
        #: the lease's end (monotonic) while a READY_WAIT timer stands in for it
        self.ready_until: float | None = None
        self.backoff = MIN_BACKOFF
        self.failure: LockConnectionError | None = None

    async def run(self, undo: Attempt | None) -> Hold:
        engine, hub, waiter = self.engine, self.engine.hub, self.waiter
        try:
            if undo is not None:  # it may have run: as AcquirePath.attempt does
                await engine.undo(self.kind, undo, self.deadline)
            first = self.first
            if first is not None and not isinstance(first, (Busy, LockConnectionError)):
                raise first  # cancelled (or an error) in the fast path's attempt
            while True:
                if waiter.handed is not None:  # a local releaser handed the lock over
                    self.acquired = True
                    return engine.adopt(waiter.handed)
                if hub.closed:
                    raise engine.manager_closed()
                if hub.failure is not None:
                    raise LockPermissionError(hub.failure)
                if self.should_try and (hold := await self._try()) is not None:
                    self.acquired = True
                    return hold
                remaining = None if self.deadline is None else self.deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise await self._expired()
                await self._sleep(remaining)
        finally:
            await self._finish()

    async def _try(self) -> Hold | None:
        """This task's turn: yield, probe or attempt; the hold if it got it."""
        engine, kind, keys, waiter = self.engine, self.kind, self.keys, self.waiter
        hub, channel = engine.hub, keys.channel
        # (The fast path's attempt was sent before its queue existed, so with no
        # subscription confirmed: no quiet wait follows it.)
        losses = hub.losses if self.first is None and hub.confirmed(channel) else None
        # others' turn first: try when it ends (the fast path's outcome is in), unless this
        # manager starves for a lock with turns (its turn may be now; a kind without turns
        # keeps yielding: other clients rely on it)
        starving = kind.turns and waiter.queue.busy >= STARVE_AFTER
        self.ttl = hub.yielding(channel) if self.first is None and not starving else 0.0
        if self.ttl > 0:
            waiter.queue.answered = time.monotonic()  # others were heard waiting
            return None
        if (
            not self.woken
            and losses is not None
            and losses == self.quiet
            and (probed := await engine.still_held(kind, keys))
        ):
            self.ttl = probed  # renewed by a live holder: no attempt needed
            return None
        self.quiet = self.ready_until = None
        try:
            if self.first is None:
                if starving and not waiter.queue.asked:
                    # from this attempt on (see aiolock._engine.turns)
                    waiter.queue.asked = True
                    engine.claims.add(kind, keys, engine.rt.manager_id)
                outcome = await engine.attempt(
                    kind, keys, self.owner, self.lease, permits=self.permits, field=self.field,
                    until=self.deadline, turn=waiter.queue.asked,
                )  # fmt: skip
            else:  # the fast path's attempt, already made
                made, self.first = self.first, None
                if not isinstance(made, Busy):
                    raise made  # a LockConnectionError, undone in run()
                outcome = made
        except LockConnectionError as exc:
            self._connection_error(exc)
            return None
        if isinstance(outcome, Hold):
            return outcome
        self._found_busy(outcome, losses)
        return None

    def _connection_error(self, exc: LockConnectionError) -> None:
        """Ride it out until this waiter's own deadline."""
        engine = self.engine
        engine.connection_errors += 1
        self.failure, self.ttl = exc, self.backoff
        self.backoff = min(self.backoff * 2, MAX_BACKOFF)
        if self.field is not None:
            # The undo of that attempt may still be retried in the background, and it
            # withdraws whatever its field holds when it lands, a later grant included: go
            # on under a new field (that undo withdrew the old one's place anyway).
            if self.claimed:
                self.claimed = False
                engine.claims.discard(self.kind, self.keys, self.field)
            self.field = engine.hub.rename(self.waiter, f"{self.owner}:{engine.rt.next_id()}")

    def _found_busy(self, outcome: Busy, losses: int | None) -> None:
        """An attempt found the lock held: wait for its release, listening for it."""
        engine, kind, keys, waiter = self.engine, self.kind, self.keys, self.waiter
        hub = engine.hub
        self.failure, self.backoff, self.busy = None, MIN_BACKOFF, True
        self.quiet = losses
        waiter.queue.answered = time.monotonic()
        waiter.queue.busy += 1
        self.ttl = outcome.ttl if outcome.ttl > 0 else engine.rt.lease
        if self.field is not None and not self.claimed:
            self.claimed = True
            engine.claims.add(kind, keys, self.field)
        hub.listen(waiter)
        if kind.registers_listeners:
            engine.listeners.listening(kind, keys)
        if (
            not hub.confirmed(keys.channel)
            and (not kind.queued or hub.first(waiter))
            and self.ttl > READY_WAIT
        ):
            # The confirmation wakes it. (A queued kind's later waiters cannot be granted
            # before the first: the hub wakes each when it becomes the first, see _hub.)
            self.ready_until = time.monotonic() + self.ttl
            self.ttl = READY_WAIT

    async def _expired(self) -> Exception:
        """The deadline passed: the error to raise (an outage, or a timeout)."""
        engine, kind, keys = self.engine, self.kind, self.keys
        deadline, timeout = self.deadline, self.timeout
        assert deadline is not None  # (we are past it)
        assert timeout is not None  # (the deadline came from it)
        failure = self.failure or engine.reach.failure
        if failure is None and self.waiter.queue.answered < deadline - min(timeout, QUIET_LIMIT):
            # No attempt for this lock was answered lately: a slow server, one that refuses
            # connections while redis-py retries inside them, or one that stopped after it
            # found the lock held.
            failure = await engine.reach.probe()
        if failure is not None:  # an outage, whichever attempt saw it last
            what = f"{kind.name} {keys.name!r}"
            error = engine.reach.unreachable_error(what, timeout, failure)
            error.__cause__ = failure
            return error
        engine.timed_out(kind, keys)
        if not self.waiter.queue.answered:  # nobody was seen holding it
            return engine.reach.unanswered_error(f"{kind.name} {keys.name!r}", timeout)
        return kind.timeout_error(keys, timeout, self.permits)

    async def _sleep(self, remaining: float | None) -> None:
        """Sleep until woken, or until this head's timer runs out; then decide whether to
        try."""
        engine, hub, waiter = self.engine, self.engine.hub, self.waiter
        hub.admission.pause(waiter)
        self.woken = await waiter.wait(
            _shortest(remaining, self.ttl) if waiter.is_head else remaining
        )
        if self.woken or not waiter.is_head or waiter.handed is not None:
            self.should_try = self.woken
        elif (
            self.ready_until is not None
            and hub.subscribing(self.keys.channel)
            and (left := self.ready_until - time.monotonic()) > 0
        ):
            # Not confirmed within READY_WAIT, but SUBSCRIBE is out on the current
            # connection: its confirmation wakes this head, or the connection's loss does
            # (hub.on_lost). A retry now would find what the one after the confirmation
            # finds; at 50,000 new waiters, whose confirmations take seconds to arrive,
            # trying would be one more attempt per waiter.
            self.should_try, self.ttl = False, left
        else:  # the head's timer ran out: it tries too, but in a turn
            self.should_try, self.woken = await engine.in_turn(waiter, self.deadline)

    async def _finish(self) -> None:
        """Every way out: leave the queue, end the turn, withdraw the registration, pass on
        a hand-over that came too late."""
        engine, kind, keys, waiter, acquired = (
            self.engine, self.kind, self.keys, self.waiter, self.acquired,
        )  # fmt: skip
        engine.contention.wait_ended(
            self.resource, kind.name, keys.name, self.entered, self.busy, waiter.handed is not None
        )
        # A shared grant lets the next waiter try at once, as a failed one does.
        engine.hub.leave(waiter, acquired=acquired and not kind.shared)
        if not waiter.queue.waiters:
            end_turn(engine.claims, engine.cleanup, engine.starved, engine.rt.manager_id,
                     kind, keys, waiter.queue, acquired)  # fmt: skip
        if self.field is not None:
            if self.claimed:
                engine.claims.discard(kind, keys, self.field)
            if not acquired:
                # Withdraw the registration now (and pass on a grant that came too late),
                # rather than when it expires.
                await engine.undo(
                    kind,
                    engine.new_attempt(keys, self.owner, self.field, self.lease, self.permits,
                                        kind=kind),
                    self.deadline,
                )  # fmt: skip
        if not acquired and (orphan := waiter.take_handed()) is not None:
            # The lock was handed over just as this task gave up: pass it on, without ever
            # registering it under this task.
            orphan.owner = ORPHAN
            await engine.release_quietly(orphan, pass_on=True)


def _shortest(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)
