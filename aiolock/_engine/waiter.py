"""A waiting task and its lock's local queue: the objects the hub keeps per waiter.

:class:`Waiter` is one task waiting for one lock (its sleep, its wake, a hand-over made
to it); :class:`ChannelQueue` is the local waiters of one lock and the state of its
subscription. Both are kept as small as they can be (``__slots__``, a list per queue):
at 50,000 waited-on names the per-waiter objects are most of the client's memory.
A :data:`FastEntry` stands for both while nobody needs them.
:class:`HubStatistics` is the hub's snapshot of them all. The
rules by which they are woken and served are the hub's (:mod:`aiolock._engine.hub`);
nothing here awaits anything but the waiter's own sleep.
"""

from __future__ import annotations

import asyncio
import enum
import sys
from dataclasses import dataclass

from aiolock._engine.kind import Hold

__all__ = ["ChannelQueue", "FastEntry", "HubStatistics", "Waiter", "WaiterState"]

#: The fast path's lazy place in its lock's queue (WaiterHub.enter): what its Waiter
#: would record (owner, lease, the kind's queued and anonymous flags, task).
FastEntry = tuple[str, "float | None", bool, bool, "asyncio.Task[object] | None"]


class WaiterState(enum.Enum):
    """Where a waiter is in its lock's queue: its turn among the woken waiters, or gone.

    The hub counts at most ``Admission.WAKES`` waiters *in turn* at once (those that talk
    to Redis), and keeps a line of those woken beyond them (*deferred*); a waiter is in
    one of these states, never two:

    * ``WAITING``: in its queue, without a turn: asleep, or between two steps of its wait;
    * ``DEFERRED``: in line for a turn (woken, or its timer ran out, while WAKES had one);
    * ``IN_TURN``: it has a turn, until it sleeps again or leaves;
    * ``LEFT``: out of its queue, for good.

    A hand-over (:attr:`Waiter.reserved`, :attr:`Waiter.handed`) is not one of them: a
    releaser of this manager may reserve the head in any of the first three (its own
    attempt may be in flight meanwhile), and a hand-over that lands after the waiter left
    is passed on. A wake that found the waiter awake (:attr:`Waiter.pending`) is apart too.
    """

    WAITING = 0
    DEFERRED = 1
    IN_TURN = 2
    LEFT = 3


WAITING = WaiterState.WAITING
DEFERRED = WaiterState.DEFERRED
IN_TURN = WaiterState.IN_TURN
LEFT = WaiterState.LEFT


class Waiter:
    """One task waiting for one lock; lives in its channel's queue until it leaves.

    Its :attr:`state` (a :class:`WaiterState`) changes only by its transition methods,
    each of which checks that it starts from where it may (the hub's admission makes them,
    :mod:`aiolock._engine.admission`). A releasing task of the same manager may hand the
    lock straight to the head waiter (one round trip instead of a release, a wake-up and
    an acquire): it reserves the waiter (:meth:`reserve`), and once Redis confirms,
    :meth:`give` delivers the new hold, which the waiter's task takes
    (:meth:`take_handed`).
    """

    # (One state, not a flag per state: at 50,000 waiters each slot is 400 kB.)
    __slots__ = (
        "_future",
        "acknowledged",
        "field",
        "handed",
        "lease",
        "owner",
        "pending",
        "queue",
        "reserved",
        "state",
        "task",
    )

    def __init__(
        self,
        queue: ChannelQueue,
        owner: str,
        lease: float | None,
        field: str | None = None,
        acknowledged: bool = False,
    ) -> None:
        self.queue = queue
        #: a queued kind's waiter: its field in Redis, which release messages name
        self.field = field
        #: the waiting task's owner id, and the fixed lease it asked for (None: renewed)
        self.owner = owner
        self.lease = lease
        #: a wake that arrived while the waiter was not blocked; consumed by wait()
        self.pending = False
        self._future: asyncio.Future[bool] | None = None
        #: its place among the woken waiters, or gone (see WaiterState)
        self.state = WAITING
        #: a hand-over to this waiter is in flight (reserve, unreserve)
        self.reserved = False
        #: the hold handed over to this waiter (give, take_handed)
        self.handed: Hold | None = None
        #: its grants must be acknowledged by replicas (replicas=): never handed over
        self.acknowledged = acknowledged
        self.task: asyncio.Task[object] | None = None  # the waiting task (WaiterHub.join)

    # -- its state's transitions (made by the hub's admission) ----------------------------

    @property
    def turn(self) -> bool:
        """Whether it has a turn among the woken waiters (see WaiterState)."""
        return self.state is IN_TURN

    @property
    def deferred(self) -> bool:
        """Whether it waits in line for a turn (see WaiterState)."""
        return self.state is DEFERRED

    @property
    def left(self) -> bool:
        return self.state is LEFT

    def start_turn(self) -> None:
        """WAITING or DEFERRED -> IN_TURN: one of the turns is its."""
        assert self.state is WAITING or self.state is DEFERRED, self.state
        self.state = IN_TURN

    def end_turn(self) -> None:
        """IN_TURN -> WAITING: it sleeps again."""
        assert self.state is IN_TURN, self.state
        self.state = WAITING

    def defer(self) -> None:
        """WAITING -> DEFERRED: it waits in line for a turn."""
        assert self.state is WAITING, self.state
        self.state = DEFERRED

    def step_out(self) -> None:
        """DEFERRED -> WAITING: it leaves the line without a turn (its entry in the line
        is skipped when it comes up)."""
        assert self.state is DEFERRED, self.state
        self.state = WAITING

    def leave(self) -> WaiterState:
        """Any state -> LEFT, for good; the state it left from (a turn to end, a place in
        line that was owed a wake)."""
        was = self.state
        assert was is not LEFT
        self.state = LEFT
        return was

    # -- a hand-over's transitions (made by a releasing task of this manager) ------------

    def reserve(self) -> None:
        """A release is about to hand the lock to this waiter (WaiterHub.reserve_successor
        chose it: no hand-over is in flight to it, nor landed)."""
        assert not self.reserved, "a hand-over to it is in flight"
        assert self.state is not LEFT
        self.reserved = True

    def unreserve(self) -> None:
        """The hand-over's outcome is in, or unknown (the release is retried in the
        background): the waiter fends for itself. A resent release ends it again."""
        self.reserved = False

    def give(self, hold: Hold) -> None:
        """Redis handed the lock over to it: deliver *hold*, and wake it to take it."""
        self.reserved = False
        self.handed = hold
        self.wake()

    def take_handed(self) -> Hold | None:
        """The hold handed over to it, if any, which it no longer has."""
        hold, self.handed = self.handed, None
        return hold

    @property
    def cancelling(self) -> bool:
        """Whether the waiting task is being cancelled (it will give up, not take a lock).

        A task cancelled while it sleeps in :meth:`wait` has its future cancelled at once
        (every Python); on 3.11+ ``Task.cancelling()`` also tells a task cancelled while
        it runs an attempt. A hand-over to such a task would land after it left, and the
        lock would then have to be passed on by one more round trip: at a graceful
        shutdown, after the manager had closed. (A task that swallowed a cancellation
        without ``uncancel()`` counts as cancelling: it loses only the hand-over's fast
        path, and takes the freed lock by its own attempt.)
        """
        future = self._future
        if future is not None and future.cancelled():
            return True
        if sys.version_info >= (3, 11) and self.task is not None:
            return self.task.cancelling() > 0
        return False

    @property
    def is_head(self) -> bool:
        queue = self.queue
        # In a queued kind's queue Redis keeps the order: every waiter tries for itself.
        return queue.queued or (bool(queue.waiters) and queue.waiters[0] is self)

    def wake(self) -> None:
        future = self._future
        if future is not None and not future.done():
            future.set_result(True)
        else:
            self.pending = True

    async def wait(self, timeout: float | None) -> bool:
        """Sleep until woken (True) or until *timeout* seconds pass (False)."""
        if self.pending:
            self.pending = False
            return True
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        self._future = future
        timer = None if timeout is None else loop.call_later(timeout, _expire, future)
        try:
            return await future
        except asyncio.CancelledError:
            # Woken in the same loop iteration as the cancellation: keep the wake so
            # that leave() passes it on instead of losing it.
            if future.done() and not future.cancelled() and future.result():
                self.pending = True
            raise
        finally:
            self._future = None
            if timer is not None:
                timer.cancel()


def _expire(future: asyncio.Future[bool]) -> None:
    if not future.done():
        future.set_result(False)


class ChannelQueue:
    """The local waiters of one lock, and the state of its subscription."""

    __slots__ = (
        "anonymous",
        "answered",
        "asked",
        "busy",
        "channel",
        "confirmed",
        "fields",
        "listen",
        "queued",
        "remembered",
        "waiters",
    )

    def __init__(self, channel: str, queued: bool = False, anonymous: bool = False) -> None:
        self.channel = channel
        #: the kind keeps its waiters' order in Redis (see the module docstring)
        self.queued = queued
        #: messages do not say who released (a foreign wire format): see _dispatch
        self.anonymous = anonymous
        #: a list, not a deque: most queues hold one waiter, and an empty deque with its
        #: first block takes about 600 B against a list's 88 (per-name memory
        #: at 50,000 waited-on names); the head's removal moves the rest, a few
        #: microseconds even for thousands of waiters on one name
        self.waiters: list[Waiter] = []
        #: a queued kind's waiters by field, for the release messages that name them
        self.fields: dict[str, Waiter] = {}
        #: a waiter found the lock busy: the queue needs the release channel
        self.listen = False
        #: the server confirmed our SUBSCRIBE (and no UNSUBSCRIBE since)
        self.confirmed = False
        #: when an attempt of this queue last found the lock busy (monotonic; 0: never): a
        #: waiter whose wait runs out may say it was held (until then, Redis has not
        #: answered the queue at all), and asks whether the server is there if nothing
        #: was answered during its wait
        self.answered = 0.0
        #: attempts of its waiters that found the lock busy while it had waiters, and
        #: whether their attempts ask for a turn (see aiolock._engine.turns)
        self.busy = 0
        self.asked = False
        #: the busy count it started with, from an earlier wait's starvation
        self.remembered = 0


@dataclass(frozen=True)
class HubStatistics:
    """A snapshot of the hub, for debugging and tests.

    Attributes:
        queues: lock names with at least one local waiter.
        waiters: tasks waiting, over all names.
        subscriptions: channels subscribed on the server (confirmed): those of locks
            this manager's tasks wait for, and of exclusive locks they have held 0.2 s or
            more (a release the manager did not make ends such a hold at once).
        messages: release messages received from other clients.
        reconnects: times the pub/sub connection was lost and re-established.
    """

    queues: int
    waiters: int
    subscriptions: int
    messages: int
    reconnects: int
