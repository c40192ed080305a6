"""The pub/sub hub: one subscription connection per manager, and local waiter queues.

Waiting tasks never poll and never hold a connection. Each lock name with waiters has a
:class:`ChannelQueue`: a first-in first-out queue of :class:`Waiter` objects (both in
:mod:`aiolock._engine.waiter`) and one subscription to the lock's release channel, made
once a waiter of the queue found the lock busy. Every acquiring task joins the queue
before its first attempt, so tasks are served in the order they called, and only the
*head* of a queue talks to Redis; the others wait for their turn, so a release wakes
exactly one task in this process, and a task that releases and asks again queues behind
the tasks already waiting (no barging).

Progress rests on one invariant: the head of a non-empty queue is either awake, or
asleep with a timer at the holder's lease expiry, or asleep while a task of this same
manager holds the lock (whose release or loss wakes it). The rules that keep it are the
hub's own methods (and its :class:`~aiolock._engine.admission.Admission`'s), which the
rest of the engine calls; no other module writes a waiter's state or the hub's:

* :meth:`WaiterHub.wake`: the lock may be free (a local loss, a release the hub does
  not hear of itself): its head tries. A release message (:meth:`on_message`), a
  confirmed (re)subscription and a lost connection wake the head the same way, and a
  head that leaves without the lock (:meth:`leave`) wakes the next;
* :meth:`released`: a final release of this manager freed the lock. If other clients
  heard it, this manager *yields* the lock to them for :data:`YIELD_WINDOW` (its tasks
  queue instead of trying: :meth:`idle`, :meth:`yielding`), until another client's
  release or the window's end wakes the head; else the head tries at once;
* :meth:`hand_over_freely`: at most :data:`MAX_LOCAL_STREAK` hand-overs in a row within
  this manager (:meth:`handed_over`) while others listen; :meth:`reserve_successor` and
  :meth:`deliver` choose the waiter a release hands the lock to, and give it the hold;
* the turns (:mod:`aiolock._engine.admission`): at most ``Admission.WAKES`` waiters
  talk to Redis at once; a wake beyond them waits its turn, in order, and one whose
  waiter leaves first is passed on like any other; a head whose timer runs out (to probe
  or retry) takes a turn too, and waits in the same line; a waiter about to sleep ends
  its turn (``pause``); a wake that arrives while a waiter is awake is kept
  (``pending``), never dropped, and a waiter cancelled after being woken passes it on.

Fairness between processes is kept without any state in Redis (but for the turns of
:mod:`aiolock._engine.turns`, asked for by a manager that keeps losing the race).

A queue of a *queued* kind (the fair lock, whose waiters' order Redis keeps) works
differently: every waiter is its own head and tries at once, and a release message names
the waiter it was granted to (its field), so the hub wakes that one only (found by its
field in a dict). Redis grants in its queue's order, which is this process's call order
(the first attempts go out in order: Client.run_in_order), so the only waiter of ours
that a missed message can have named is the first in the local queue: a confirmation,
a reconnect or another wake of unknown target wakes that one alone, and while the
subscription is not confirmed each first waiter that leaves wakes the next.

Bookkeeping (join, leave, wake) is synchronous and never awaits. All I/O happens in the
hub's *source* of subscriptions (:mod:`aiolock._redis.pubsub`: one connection on a single
server, one per primary on a Redis Cluster, chosen by whoever builds the hub), which
tells the hub what it hears: release messages, confirmed subscriptions, and lost ones.
If a connection drops, every head of its channels is woken (a release may have been
missed), the subscriptions are re-established, and each confirmation wakes its head again.

The fast path's first attempt (:mod:`aiolock._engine.fast`) joins *lazily*:
while its lock has no queue, :meth:`WaiterHub.enter` records an entry
(:data:`~aiolock._engine.waiter.FastEntry`) and a turn, no queue nor waiter. The entry
stands for a queue of that one waiter: :meth:`~WaiterHub.idle` is false for its lock,
the statistics count it, and whatever would act on that queue or its head (a join
behind it, a successor, a wake, a message, a confirmation, a loss, the hub closing)
first makes them from the entry (``_make``), then acts as it always did; what only reads
a queue answers for the entry as for a new one. Only an attempt nobody needed to see
ends without a queue: :meth:`~WaiterHub.drop` undoes the entry as leave() its queue.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Container

from aiolock._engine.admission import Admission
from aiolock._engine.kind import Hold
from aiolock._engine.runtime import task_in
from aiolock._engine.waiter import ChannelQueue, FastEntry, HubStatistics, Waiter
from aiolock._redis.pubsub import Source, SubscriptionEvents

__all__ = ["MAX_LOCAL_STREAK", "YIELD_WINDOW", "WaiterHub"]

#: After a release that other clients heard, this manager's tasks keep off the lock for
#: this long (or until another client's release message arrives), so that the waiters
#: elsewhere, woken later than a local task could be, get their turn.
YIELD_WINDOW = 0.02
#: Hand-overs in a row within this manager while other clients wait for the same lock:
#: a few keep the fast local path (one round trip per hand-over); a bound keeps it fair.
MAX_LOCAL_STREAK = 2


class WaiterHub(SubscriptionEvents):
    """Local waiter queues, fed by the events of a source of subscriptions."""

    def __init__(self, source: Source, manager_id: str) -> None:
        #: the subscriptions: wanted here, kept by the source, which reports to the hub
        self.source = source
        self.loop: asyncio.AbstractEventLoop | None = None  # LockManager._loop: see there
        source.bind(self)
        self._manager_id = manager_id
        self._queues: dict[str, ChannelQueue] = {}
        #: the fast path's entries (see enter): a channel has a queue or an entry, never
        #: both; each holds a turn. _made: waiters made from entries by others (_make),
        #: until their fast path takes them (materialize, drop)
        self._lazy: dict[str, FastEntry] = {}
        self._made: dict[str, Waiter] = {}
        #: channels this manager yields, until when (monotonic)
        self._yields: dict[str, float] = {}
        #: hand-overs in a row within this manager, per channel, since it was last freed
        #: (kept apart from the queues, which come and go between hand-overs)
        self._streaks: dict[str, int] = {}
        self._messages = 0
        #: what statistics() reports, kept as the queues change so that asking costs
        #: O(1), not a walk over every waited-on name
        self._waiting = 0
        self._busy = 0  # queues with a waiter
        self._confirmed = 0  # queues whose subscription is confirmed
        #: the turns of the waiters that talk to Redis, at most Admission.WAKES at once
        self.admission = Admission()
        self.closed = False
        #: why subscribing is refused (an ACL or credentials problem), while it is
        self.failure: str | None = None
        #: channels of locks this manager holds and listens to, and who is told of a
        #: release it did not make or a confirmed subscription there (aiolock._engine.heed,
        #: which keeps both: a queue that empties leaves their subscription alone)
        self.held: Container[str] = ()
        self.on_held_release: Callable[[str], None] | None = None

    # -- bookkeeping: synchronous, called by acquiring and releasing tasks ---------------

    def join(
        self,
        channel: str,
        owner: str,
        lease: float | None,
        field: str | None = None,
        *,
        queued: bool = False,
        anonymous: bool = False,
        acknowledged: bool = False,
        turn: bool = False,
    ) -> Waiter:
        """Queue a new waiter at the tail of *channel*'s queue (no I/O yet).

        *field* names its registration in Redis, if its kind has one; *queued* says that
        the kind keeps the waiters' order there (see the module docstring); *anonymous*
        that its release messages do not name the releasing client; *acknowledged* that
        its grants must be acknowledged by replicas (it is never handed the lock).
        *turn*: it is about to attempt, and takes a turn if one is free at once
        (:meth:`Admission.at_once <aiolock._engine.admission.Admission.at_once>`; else
        see :meth:`Admission.take <aiolock._engine.admission.Admission.take>`), here
        rather than in a call of its own (the fast path's, see :mod:`aiolock._engine.fast`).
        """
        queue = self._queue(channel)  # (behind a fast attempt in flight: see enter)
        if queue is None:
            queue = self._queues[channel] = ChannelQueue(channel, queued, anonymous)
        waiter = Waiter(queue, owner, lease, field, acknowledged)
        loop = self.loop  # (the task joins itself)
        waiter.task = asyncio.current_task() if loop is None else task_in(loop)
        if turn:
            self.admission.at_once(waiter)
        if not queue.waiters:
            self._busy += 1
        queue.waiters.append(waiter)
        self._waiting += 1
        if queued and field is not None:
            queue.fields[field] = waiter
        return waiter

    def enter(
        self, channel: str, owner: str, lease: float | None, *, queued: bool, anonymous: bool
    ) -> FastEntry | None:
        """The fast path's lazy place in *channel*'s queue for its first attempt: what
        :meth:`join` with ``turn=True`` would make, unmade (see the module docstring).

        Only if *channel* has no queue (nor entry) and a turn is free at once (fewer than
        WAKES taken, nobody in line); the fast path ends it with :meth:`drop`, or goes on
        with :meth:`materialize`. None: it joins as the engine's waiters do.
        """
        admission = self.admission  # (Admission.at_once, inline: every fast acquisition)
        if (
            channel in self._queues
            or channel in self._lazy
            or admission.taken >= admission.WAKES
            or admission.line
        ):
            return None
        admission.taken += 1  # (as join's turn=True: the waiter made from it has this turn)
        # (A tuple: an object of its own cost half of what the lazy entry saves. The task
        # is recorded here as in join: nobody else can tell it later, Waiter.cancelling.)
        loop = self.loop
        task = asyncio.current_task() if loop is None else task_in(loop)
        entry = self._lazy[channel] = (owner, lease, queued, anonymous, task)
        return entry

    def materialize(self, channel: str, entry: FastEntry) -> Waiter:
        """The waiter of the fast path's *entry* for *channel* (the engine's wait goes on
        with it): made now, or by whoever needed the queue meanwhile."""
        if self._lazy.get(channel) is entry:
            self._make(channel)
        return self._made.pop(channel)

    def drop(self, channel: str, entry: FastEntry, *, acquired: bool) -> None:
        """The fast path's *entry* for *channel* leaves: its waiter as :meth:`leave` says,
        if somebody needed it made; else only the entry."""
        if self._lazy.pop(channel, None) is not entry:
            # (made: its waiter heads the queue until it leaves, so no new entry is made
            # for the channel meanwhile)
            self.leave(self._made.pop(channel), acquired=acquired)
            return
        # Nobody needed it: what leave() does for the lone waiter of a queue that never
        # subscribed, acquired or not. Its turn ends (admitting the next in line); never
        # woken nor reserved, it has nobody to wake after it; and nothing to unsubscribe:
        # a channel without a queue has no subscription (only a queue's waiters want one,
        # and a queue is forgotten only once its subscription is gone).
        admission = self.admission  # (Admission.leave, inline: every fast acquisition)
        admission.taken -= 1
        if admission.line:
            admission.admit()

    def _make(self, channel: str) -> ChannelQueue:
        """Make *channel*'s queue and head waiter from the fast path's entry, as join()
        would have made them when it was recorded (the waiter is kept in ``_made``)."""
        owner, lease, queued, anonymous, task = self._lazy.pop(channel)
        # (no queue exists: enter() records none then, and a join meanwhile makes this)
        queue = self._queues[channel] = ChannelQueue(channel, queued, anonymous)
        waiter = self._made[channel] = Waiter(queue, owner, lease)
        waiter.task = task
        waiter.start_turn()  # the entry's turn, counted since enter()
        queue.waiters.append(waiter)
        self._busy += 1
        self._waiting += 1
        return queue

    def _queue(self, channel: str) -> ChannelQueue | None:
        """*channel*'s queue, made from the fast path's entry if it has one: for whoever
        acts on the queue or its head (see enter)."""
        queue = self._queues.get(channel)
        if queue is None and channel in self._lazy:
            queue = self._make(channel)
        return queue

    def idle(self, channel: str) -> bool:
        """Whether *channel* has no local waiter (no task of this manager waits for the
        lock or is acquiring it in its queue, lazily or not; an empty queue may stay for
        its subscription) and this manager does not yield it: what the engine's fast path
        needs (see :mod:`aiolock._engine.fast`)."""
        queue = self._queues.get(channel)
        return (
            (queue is None or not queue.waiters)
            and channel not in self._lazy
            and (not self._yields or self.yielding(channel) <= 0)
        )

    def rename(self, waiter: Waiter, field: str) -> str:
        """*waiter* goes on under a new *field* (its old registration is withdrawn)."""
        fields = waiter.queue.fields
        if waiter.field is not None and fields.get(waiter.field) is waiter:
            del fields[waiter.field]
        waiter.field = field
        if waiter.queue.queued:
            fields[field] = waiter
        return field

    def first(self, waiter: Waiter) -> bool:
        """Whether *waiter* is the first of its queue (in a queued kind's queue too)."""
        waiters = waiter.queue.waiters
        return bool(waiters) and waiters[0] is waiter

    def listen(self, waiter: Waiter) -> None:
        """*waiter* found the lock busy: subscribe its queue to the release channel."""
        queue = waiter.queue
        if not queue.listen:
            queue.listen = True
            self.source.want(queue.channel)

    # -- the progress rules between this manager and other clients ---------------------

    def released(self, channel: str, *, queued: bool, heard: bool) -> None:
        """A final release of this manager freed *channel*'s lock (no hand-over): the
        streak of hand-overs ends, and who may take the lock next is decided:

        * a queued kind's lock: Redis granted it to its next waiter, whose release
          message wakes that one alone;
        * a release *heard* by other clients (they listen): this manager yields the lock
          to them for :data:`YIELD_WINDOW` (its tasks queue instead of trying: see
          :meth:`idle`); another client's release message, or the window's end, wakes the
          head;
        * else the local head, if any, tries at once (the hub ignores our own message).
        """
        self._streaks.pop(channel, None)
        if queued:
            return
        if heard:
            now = time.monotonic()
            if len(self._yields) > 4096:  # forget windows long past
                self._yields = {c: t for c, t in self._yields.items() if t > now}
            self._yields[channel] = now + YIELD_WINDOW
            asyncio.get_running_loop().call_later(YIELD_WINDOW, self.wake, channel)
        elif channel in self._queues or channel in self._lazy:  # (no call if nobody waits)
            self.wake(channel)

    def yielding(self, channel: str) -> float:
        """Seconds this manager still yields *channel* (0 if it does not)."""
        until = self._yields.get(channel)
        if until is None:
            return 0.0
        left = until - time.monotonic()
        if left <= 0:
            del self._yields[channel]
            return 0.0
        return left

    def handed_over(self, channel: str) -> None:
        """A final release of this manager handed *channel*'s lock to a local waiter."""
        if len(self._streaks) > 4096:  # locks handed over, then never freed by us
            self._streaks.clear()
        self._streaks[channel] = self._streaks.get(channel, 0) + 1

    def streak(self, channel: str) -> int:
        """Hand-overs in a row within this manager since the lock was last freed."""
        return self._streaks.get(channel, 0)

    def hand_over_freely(self, channel: str) -> bool:
        """Whether a release may hand *channel*'s lock to a local waiter even while other
        clients wait for it: fewer than :data:`MAX_LOCAL_STREAK` hand-overs in a row since
        it was last freed (past them, only while nobody else listens, which the kind's
        release decides from Redis)."""
        return self._streaks.get(channel, 0) < MAX_LOCAL_STREAK

    def reserve_successor(self, channel: str) -> Waiter | None:
        """The waiter a releasing task of this manager hands the lock to, if any, now
        reserved for it (see :meth:`Waiter.reserve`): the head of a queue whose order is
        this manager's, unless a hand-over to it is already in flight or landed, it is
        being cancelled, or its grants must be acknowledged by replicas (a hand-over is a
        grant no WAIT follows)."""
        queue = self._queue(channel)  # (a fast attempt in flight may be handed it)
        if queue is None or self.closed or not queue.waiters or queue.queued:
            return None
        head = queue.waiters[0]  # first come, first served: only the head
        # A head being cancelled is about to leave (and to wake the next in line): the
        # lock is freed for it rather than handed to a task that will not take it.
        if head.reserved or head.handed is not None or head.acknowledged or head.cancelling:
            return None
        head.reserve()
        return head

    def deliver(self, waiter: Waiter, hold: Hold) -> bool:
        """Redis handed the lock over to *waiter* (reserved): give it *hold*, unless it
        left meanwhile or the hub closed. Then it must never see it (False): the releaser
        passes the lock on."""
        if waiter.left or self.closed:
            return False
        waiter.give(hold)  # registered by the waiter's own task when it takes it
        return True

    def leave(self, waiter: Waiter, *, acquired: bool) -> None:
        """Remove *waiter*; without the lock, a head (or a woken waiter) wakes the next."""
        queue = waiter.queue
        waiters = queue.waiters
        was_first = bool(waiters) and waiters[0] is waiter  # (first() and is_head, inline)
        was_head = queue.queued or was_first
        owed = self.admission.leave(waiter)  # (it held a place in line, and the wake)
        try:
            waiters.remove(waiter)
        except ValueError:
            return  # already gone (the hub was closed)
        self._waiting -= 1
        if not waiters:
            self._busy -= 1
        if waiter.field is not None and queue.fields.get(waiter.field) is waiter:
            del queue.fields[waiter.field]
        if queue.queued and was_first and not queue.confirmed and queue.waiters:
            # A grant to the next of ours may be announced while we do not listen: the
            # new first waiter tries (and keeps trying at READY_WAIT, see the engine).
            self.admission.wake(queue.waiters[0])
        # A reserved waiter's releaser passes the lock on itself when the hand-over lands.
        # (In a queued kind's queue nobody waits for a turn that this waiter held.)
        if (
            not acquired
            and not queue.queued
            and not waiter.reserved
            and (was_head or waiter.pending or owed)
        ):
            self._wake_head(queue)
        if not queue.waiters:
            if queue.channel in self.held:
                pass  # a hold of ours listens there: the queue and its subscription stay
            elif queue.listen or self.source.subscribed(queue.channel):
                queue.listen = False
                # The source unsubscribes, then reports it dropped: the queue is forgotten.
                self.source.unwant(queue.channel)
            elif self._queues.get(queue.channel) is queue:
                # Never subscribed (the common, uncontended case): forget it now, without
                # waking the source on every acquisition.
                self._forget(queue)

    def hold(self, channel: str, queued: bool, anonymous: bool) -> None:
        """A hold of this manager listens on *channel* (aiolock._engine.heed): through a
        queue's subscription, as its waiters do, kept until :meth:`unhold`."""
        queue = self._queue(channel)  # (made from a fast path's entry too)
        if queue is None:
            queue = self._queues[channel] = ChannelQueue(channel, queued, anonymous)
        if not queue.listen:
            queue.listen = True
            self.source.want(channel)

    def unhold(self, channel: str) -> None:
        """No hold listens on *channel* any more: the subscription goes with its waiters."""
        queue = self._queues.get(channel)
        if queue is not None and queue.listen and not queue.waiters:
            queue.listen = False
            self.source.unwant(channel)  # reported dropped: the empty queue is forgotten

    def wanted(self, channel: str) -> bool:
        """Whether a waiter of this manager found *channel*'s lock busy and waits there
        (the subscription is wanted, confirmed or not)."""
        queue = self._queues.get(channel)  # (a fast path's entry wants none)
        return queue is not None and queue.listen and bool(queue.waiters)

    def listening(self, channel: str) -> bool:
        """Whether the server may count this manager among *channel*'s subscribers."""
        return self.source.listening(channel)

    def subscribing(self, channel: str) -> bool:
        """Whether SUBSCRIBE for *channel* is out on the current connection and not yet
        confirmed: its confirmation, or the connection's loss, will wake the head."""
        return self.source.subscribed(channel) and not self.confirmed(channel)

    def confirmed(self, channel: str) -> bool:
        queue = self._queues.get(channel)  # (a fast path's entry has no subscription)
        return queue is not None and queue.confirmed

    @property
    def losses(self) -> int:
        """How many times the pub/sub connection was lost so far (it only grows).

        A waiter whose subscription was confirmed, and that sees this unchanged since,
        has missed no release message meanwhile (see the engine's quiet waits).
        """
        return self.source.tally.losses

    @property
    def examined(self) -> int:
        """Channels the source's pumps looked at, over all passes (a count for tests)."""
        return self.source.tally.examined

    def wake(self, channel: str) -> None:
        """The lock behind *channel* may be free: let its head try."""
        queue = self._queues.get(channel)
        if queue is None and channel in self._lazy:  # (_queue, inline: every release)
            queue = self._make(channel)  # a fast attempt in flight keeps it (pending)
        if queue is not None:
            self._wake_head(queue)

    def _wake_head(self, queue: ChannelQueue) -> None:
        # In a queued kind's queue every waiter is a head, but a wake of unknown target
        # (a confirmation, a reconnect, a local loss) is for the first of ours in Redis's
        # queue, the one a missed grant can have named: the first in call order.
        if queue.waiters:
            self.admission.wake(queue.waiters[0])

    def close(self) -> None:
        """Wake every waiter; they find the hub closed and give up."""
        self.closed = True
        self._wake_all()

    def _wake_all(self) -> None:
        for channel in list(self._lazy):
            self._make(channel)  # (their waiters are woken as every other)
        for queue in self._queues.values():
            for waiter in queue.waiters:
                waiter.wake()

    def statistics(self) -> HubStatistics:
        lazy = len(self._lazy)  # each a queue with one waiter (see enter)
        return HubStatistics(
            queues=self._busy + lazy,
            waiters=self._waiting + lazy,
            subscriptions=self._confirmed,
            messages=self._messages,
            reconnects=self.source.tally.reconnects,
        )

    # -- the source's events (see aiolock._redis.pubsub.SubscriptionEvents) -------------------

    async def run(self) -> None:
        """Run the source's I/O (in the manager's task group)."""
        await self.source.run()

    def on_message(self, channel: str, data: str) -> None:
        if channel in self.held and data != self._manager_id and self.on_held_release:
            # A release (or a fair lock's grant) we did not make: is our hold still there?
            self.on_held_release(channel)
        queue = self._queue(channel)
        if queue is not None and queue.queued:
            # A queued kind's release names the waiter it was granted to (which may be
            # one of ours, released by one of ours), or is "" if nobody waited.
            self._messages += 1
            if data:
                waiter = queue.fields.get(data)
                if waiter is not None:
                    self.admission.wake(waiter)
        # Our own releases already woke the local head directly.
        elif data != self._manager_id:
            self._messages += 1
            # Another client released: the clients we yielded to had their turn. An
            # anonymous message may be our own release echoed back, so it ends no
            # yield (the window's timer wakes the head when it is over).
            if queue is None or not queue.anonymous:
                self._yields.pop(channel, None)
            if queue is not None:
                self._wake_head(queue)

    def on_confirmed(self, channel: str) -> None:
        if channel in self.held and self.on_held_release:
            self.on_held_release(channel)  # a release may have come before it: check once
        queue = self._queue(channel)
        if queue is not None:
            self.failure = None
            # First confirmation: the head may now retry without missing a release.
            # A repeated one follows a reconnect made inside redis-py, during which
            # releases may have been missed: either way, wake the head.
            self._confirm(queue, True)
            self._wake_head(queue)

    def on_unconfirmed(self, channel: str) -> None:
        queue = self._queues.get(channel)  # (a fast path's entry is not confirmed)
        if queue is not None:
            self._confirm(queue, False)

    def on_dropped(self, channel: str) -> None:
        """Forget the queue of *channel* if nobody uses it any more (nor the server)."""
        queue = self._queues.get(channel)  # (a fast path's entry is in use)
        if queue is not None and not queue.waiters:
            self._forget(queue)

    def _confirm(self, queue: ChannelQueue, confirmed: bool) -> None:
        if queue.confirmed != confirmed:
            queue.confirmed = confirmed
            self._confirmed += 1 if confirmed else -1

    def _forget(self, queue: ChannelQueue) -> None:
        if queue.confirmed:
            self._confirm(queue, False)
        del self._queues[queue.channel]

    def on_lost(self, channels: Collection[str]) -> None:
        for channel in channels:
            queue = self._queue(channel)
            if queue is not None:
                self._confirm(queue, False)
                # A release may have been missed; heads fall back to TTL waits (a queued
                # kind's queue: the first waiter, see _wake_head)
                self._wake_head(queue)

    def on_failed(self, exc: Exception, refusal: str | None) -> None:
        if refusal is not None:
            # An ACL or credentials refusal: no retry helps until an administrator acts;
            # without pub/sub the waiters would silently fall back to retrying at lease
            # intervals, so they fail instead.
            self.failure = refusal
            self._wake_all()
