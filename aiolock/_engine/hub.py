"""The pub/sub hub: one subscription connection per manager, and local waiter queues.

Waiting tasks never poll and never hold a connection. Each lock name with waiters has a
:class:`ChannelQueue`: a first-in first-out queue of :class:`Waiter` objects and one
subscription to the lock's release channel, made once a waiter of the queue found the
lock busy. Every acquiring task joins the queue before its first attempt, so tasks are
served in the order they called, and only the *head* of a queue talks to Redis; the
others wait for their turn, so a release wakes exactly one task in this process, and a
task that releases and asks again queues behind the tasks already waiting (no barging).

Fairness between processes is kept here too, without any state in Redis: after a
release that other clients heard, this manager *yields* the channel for a short window
(monotonic clock): its tasks queue instead of trying, so the woken clients get their
turn. And the engine counts hand-overs in a row within this manager (``streak``) to
bound them while others listen.

Progress rests on one invariant: the head of a non-empty queue is either awake, or
asleep with a timer at the holder's lease expiry, or asleep while a task of this same
manager holds the lock (whose release or loss wakes it). Hence:

* a release message, a local release, a local loss, a confirmed (re)subscription and a
  head that leaves without the lock each wake the (new) head;
* a wake that arrives while the head is busy is kept (``pending``), never dropped;
* a waiter cancelled after being woken passes the wake on.

A queue of a *queued* kind (the fair lock, whose waiters' order Redis keeps) works
differently: every waiter is its own head and tries at once, and a release message names
the waiter it was granted to (its field), so the hub wakes that one only (found by its
field in a dict). Redis grants in its queue's order, which is this process's call order
(the first attempts go out in order: Client.run_in_order), so the only waiter of ours
that a missed message can have named is the first in the local queue: a confirmation,
a reconnect or another wake of unknown target wakes that one alone, and while the
subscription is not confirmed each first waiter that leaves wakes the next.

Bookkeeping (join, leave, wake) is synchronous and never awaits; all I/O happens in
two background tasks: the *pump* sends SUBSCRIBE/UNSUBSCRIBE for the channels whose
demand changed, in batches, and the *reader* receives messages and confirmations. If
the connection drops, every head is woken (a release may have been missed), the
subscriptions are re-established, and each confirmation wakes its head again.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import anyio
from redis import exceptions as rex
from redis.asyncio import Redis
from redis.asyncio.client import PubSub

from aiolock._engine.kind import Hold
from aiolock._errors import LockPermissionError
from aiolock._redis.client import as_text, translate
from aiolock._redis.reach import LOG_INTERVAL

__all__ = ["ChannelQueue", "HubStatistics", "Waiter", "WaiterHub"]

logger = logging.getLogger("aiolock")


class Waiter:
    """One task waiting for one lock; lives in its channel's queue until it leaves.

    A releasing task of the same manager may hand the lock straight to the head waiter
    (one round trip instead of a release, a wake-up and an acquire): it *reserves* the
    waiter, and once Redis confirms, :meth:`give` delivers the new hold.
    """

    __slots__ = (
        "_future",
        "acknowledged",
        "field",
        "handed",
        "lease",
        "left",
        "owner",
        "pending",
        "queue",
        "reserved",
        "task",
    )

    def __init__(
        self, queue: ChannelQueue, owner: str, lease: float | None, field: str | None = None
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
        #: a hand-over to this waiter is in flight
        self.reserved = False
        #: the hold handed over to this waiter
        self.handed: Hold | None = None
        self.left = False
        #: its grants must be acknowledged by replicas (replicas=): never handed over
        self.acknowledged = False
        #: the waiting task (it joins the queue itself)
        self.task = asyncio.current_task()

    def give(self, hold: Hold) -> None:
        self.reserved = False
        self.handed = hold
        self.wake()

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
        "channel",
        "confirmed",
        "fields",
        "listen",
        "queued",
        "waiters",
    )

    def __init__(self, channel: str, queued: bool = False, anonymous: bool = False) -> None:
        self.channel = channel
        #: the kind keeps its waiters' order in Redis (see the module docstring)
        self.queued = queued
        #: messages do not say who released (a foreign wire format): see _dispatch
        self.anonymous = anonymous
        self.waiters: deque[Waiter] = deque()
        #: a queued kind's waiters by field, for the release messages that name them
        self.fields: dict[str, Waiter] = {}
        #: a waiter found the lock busy: the queue needs the release channel
        self.listen = False
        #: the server confirmed our SUBSCRIBE (and no UNSUBSCRIBE since)
        self.confirmed = False
        #: an attempt of this queue found the lock busy: a waiter whose wait runs out may
        #: say it was held (until then, Redis has not answered the queue at all)
        self.answered = False

    def wake_head(self) -> None:
        # In a queued kind's queue every waiter is a head, but a wake of unknown target
        # (a confirmation, a reconnect, a local loss) is for the first of ours in Redis's
        # queue, the one a missed grant can have named: the first in call order.
        if self.waiters:
            self.waiters[0].wake()

    def wake_field(self, field: str) -> bool:
        """Wake the waiter registered as *field*; False if none of ours is."""
        waiter = self.fields.get(field)
        if waiter is None:
            return False
        waiter.wake()
        return True


@dataclass(frozen=True)
class HubStatistics:
    """A snapshot of the hub, for debugging and tests.

    Attributes:
        queues: lock names with at least one local waiter.
        waiters: tasks waiting, over all names.
        subscriptions: channels subscribed on the server (confirmed).
        messages: release messages received from other clients.
        reconnects: times the pub/sub connection was lost and re-established.
    """

    #: lock names with at least one local waiter
    queues: int
    #: tasks waiting, over all names
    waiters: int
    #: channels subscribed on the server (confirmed)
    subscriptions: int
    #: release messages received from other clients
    messages: int
    #: times the pub/sub connection was lost and re-established
    reconnects: int


class WaiterHub:
    """Local waiter queues plus the one pub/sub connection that feeds them."""

    #: how long the reader may hear nothing before it PINGs the server
    PING_INTERVAL = 15.0

    def __init__(self, redis: Redis, manager_id: str) -> None:
        self._redis = redis
        self._manager_id = manager_id
        self._queues: dict[str, ChannelQueue] = {}
        #: channels this manager yields, until when (monotonic)
        self._yields: dict[str, float] = {}
        #: hand-overs in a row within this manager, per channel, since it was last freed
        #: (kept apart from the queues, which come and go between hand-overs)
        self._streaks: dict[str, int] = {}
        self._subscribed: set[str] = set()  # SUBSCRIBE sent on the current connection
        self._unsubscribing: set[str] = set()  # UNSUBSCRIBE sent, not yet confirmed
        self._dirty = asyncio.Event()
        #: channels whose subscription may have to change: each pump pass looks at
        #: these only, so its cost follows what changed, not how many names are waited on
        self._changed: set[str] = set()
        #: channels the pump has looked at, over all passes (a count for tests)
        self.examined = 0
        self._connected = asyncio.Event()
        self._pubsub: PubSub | None = None
        self._messages = 0
        self._reconnects = 0
        #: reconnects redis-py made by itself, not yet counted (see _count_reconnects)
        self._client_reconnects = 0
        #: connection losses seen, of either kind, counted at once (see :attr:`losses`)
        self._losses = 0
        self.closed = False
        #: why subscribing is refused (an ACL or credentials problem), while it is
        self.failure: str | None = None

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
    ) -> Waiter:
        """Queue a new waiter at the tail of *channel*'s queue (no I/O yet).

        *field* names its registration in Redis, if its kind has one; *queued* says that
        the kind keeps the waiters' order there (see the module docstring); *anonymous*
        that its release messages do not name the releasing client.
        """
        queue = self._queues.get(channel)
        if queue is None:
            queue = self._queues[channel] = ChannelQueue(channel, queued, anonymous)
        waiter = Waiter(queue, owner, lease, field)
        queue.waiters.append(waiter)
        if queued and field is not None:
            queue.fields[field] = waiter
        return waiter

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
            if queue.channel not in self._subscribed:
                self._mark(queue.channel)

    def yield_to_others(self, channel: str, window: float) -> None:
        """Other clients heard our release: keep our tasks off *channel* for *window* s."""
        now = time.monotonic()
        if len(self._yields) > 4096:  # forget windows long past
            self._yields = {c: t for c, t in self._yields.items() if t > now}
        self._yields[channel] = now + window
        asyncio.get_running_loop().call_later(window, self.wake, channel)

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

    def streak(self, channel: str) -> int:
        """Hand-overs in a row within this manager since the lock was last freed."""
        return self._streaks.get(channel, 0)

    def count_handover(self, channel: str, handed: bool) -> None:
        """A final release handed the lock over (*handed*) or freed it."""
        if not handed:
            self._streaks.pop(channel, None)
            return
        if len(self._streaks) > 4096:  # locks handed over, then never freed by us
            self._streaks.clear()
        self._streaks[channel] = self._streaks.get(channel, 0) + 1

    def leave(self, waiter: Waiter, *, acquired: bool) -> None:
        """Remove *waiter*; without the lock, a head (or a woken waiter) wakes the next."""
        queue = waiter.queue
        was_head = waiter.is_head
        was_first = self.first(waiter)
        waiter.left = True
        try:
            queue.waiters.remove(waiter)
        except ValueError:
            return  # already gone (the hub was closed)
        if waiter.field is not None and queue.fields.get(waiter.field) is waiter:
            del queue.fields[waiter.field]
        if queue.queued and was_first and not queue.confirmed and queue.waiters:
            # A grant to the next of ours may be announced while we do not listen: the
            # new first waiter tries (and keeps trying at READY_WAIT, see the engine).
            queue.waiters[0].wake()
        # A reserved waiter's releaser passes the lock on itself when the hand-over lands.
        # (In a queued kind's queue nobody waits for a turn that this waiter held.)
        if (
            not acquired
            and not queue.queued
            and not waiter.reserved
            and (was_head or waiter.pending)
        ):
            queue.wake_head()
        if not queue.waiters:
            if queue.listen or queue.channel in self._subscribed:
                queue.listen = False
                self._mark(queue.channel)  # the pump unsubscribes and forgets the queue
            elif self._queues.get(queue.channel) is queue:
                # Never subscribed (the common, uncontended case): forget it now, without
                # waking the pump on every acquisition.
                del self._queues[queue.channel]

    def _mark(self, channel: str) -> None:
        """*channel*'s subscription may have to change: the pump looks at it."""
        self._changed.add(channel)
        self._dirty.set()

    def successor(self, channel: str) -> Waiter | None:
        """The waiter a releasing task of this manager may hand the lock to, if any."""
        queue = self._queues.get(channel)
        if queue is None or self.closed or not queue.waiters or queue.queued:
            return None
        head = queue.waiters[0]  # first come, first served: only the head
        # A head being cancelled is about to leave (and to wake the next in line): the
        # lock is freed for it rather than handed to a task that will not take it.
        if head.reserved or head.handed is not None or head.cancelling:
            return None
        return head

    def listening(self, channel: str) -> bool:
        """Whether the server may count this manager among *channel*'s subscribers."""
        return channel in self._subscribed or channel in self._unsubscribing

    def confirmed(self, channel: str) -> bool:
        queue = self._queues.get(channel)
        return queue is not None and queue.confirmed

    @property
    def losses(self) -> int:
        """How many times the pub/sub connection was lost so far (it only grows).

        A waiter whose subscription was confirmed, and that sees this unchanged since,
        has missed no release message meanwhile (see the engine's quiet waits).
        """
        return self._losses

    def wake(self, channel: str) -> None:
        """The lock behind *channel* may be free: let its head try."""
        queue = self._queues.get(channel)
        if queue is not None:
            queue.wake_head()

    def close(self) -> None:
        """Wake every waiter; they find the hub closed and give up."""
        self.closed = True
        self._wake_all()

    def _wake_all(self) -> None:
        for queue in self._queues.values():
            for waiter in queue.waiters:
                waiter.wake()

    def statistics(self) -> HubStatistics:
        return HubStatistics(
            queues=sum(1 for q in self._queues.values() if q.waiters),
            waiters=sum(len(q.waiters) for q in self._queues.values()),
            subscriptions=sum(1 for q in self._queues.values() if q.confirmed),
            messages=self._messages,
            reconnects=self._reconnects,
        )

    # -- I/O: two background tasks in the manager's task group -------------------------

    async def run(self) -> None:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._pump)
                tg.start_soon(self._reader)
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(2.0):
                await self._drop_connection()

    async def _pump(self) -> None:
        """Bring the server's subscriptions in line with the queues, in batches."""
        backoff = 0.05
        warned_at = -LOG_INTERVAL
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            changed, self._changed = self._changed, set()
            self.examined += len(changed)
            try:
                await self._sync_subscriptions(changed)
                backoff = 0.05
            except Exception as exc:  # any failure of this I/O is retried, never fatal
                self._changed |= changed  # looked at again (what was done is skipped)
                self._note_refusal(exc)
                # Retried every 2 s at most during an outage: warn at most every
                # LOG_INTERVAL (the engine logs the outage and its end, see _reach).
                level = logging.DEBUG
                if time.monotonic() - warned_at >= LOG_INTERVAL:
                    level, warned_at = logging.WARNING, time.monotonic()
                logger.log(level, "pub/sub subscription change failed, will retry: %s", exc)
                self._dirty.set()
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    def _differences(self, changed: set[str]) -> tuple[list[str], list[str]]:
        """Of *changed*, the channels to subscribe and those to unsubscribe."""
        to_add: list[str] = []
        to_drop: list[str] = []
        for name in sorted(changed):
            queue = self._queues.get(name)
            wanted = queue is not None and queue.listen
            if wanted and name not in self._subscribed:
                to_add.append(name)
            elif not wanted and name in self._subscribed:
                to_drop.append(name)
        return to_add, to_drop

    def _forget_idle(self, changed: set[str]) -> None:
        """Forget the queues of *changed* that nobody uses any more (nor the server)."""
        for name in changed:
            queue = self._queues.get(name)
            if queue is not None and not queue.waiters and name not in self._subscribed:
                del self._queues[name]

    async def _sync_subscriptions(self, changed: set[str]) -> None:
        """Bring the subscriptions of the *changed* channels in line with their queues."""
        to_add, to_drop = self._differences(changed)
        if to_add:
            pubsub = self._ensure_pubsub()
            await pubsub.subscribe(*to_add)
            self._count_reconnects(pubsub)
            self._subscribed.update(to_add)
            self._connected.set()
        if to_drop and self._pubsub is not None:
            self._subscribed.difference_update(to_drop)
            self._unsubscribing.update(to_drop)
            for name in to_drop:
                queue = self._queues.get(name)
                if queue is not None:
                    queue.confirmed = False
            await self._pubsub.unsubscribe(*to_drop)
        self._forget_idle(changed)

    def _count_reconnects(self, pubsub: PubSub) -> None:
        """Count the reconnects redis-py makes by itself on *pubsub*'s connection.

        Its retry policy re-establishes a dropped pub/sub connection inside a read and
        subscribes every channel again, so the reader sees no failure; the connection's
        connect callbacks (ours after redis-py's own, registered after its first connect)
        are how this side learns of it. Registering twice registers once.
        """
        connection = pubsub.connection
        if connection is not None:
            connection.register_connect_callback(self._reconnected_by_client)

    def _uncount_reconnects(self, pubsub: PubSub) -> None:
        """Before *pubsub* gives its connection back to the pool, where other commands'
        reconnects are none of the hub's business."""
        connection = pubsub.connection
        if connection is not None:
            connection.deregister_connect_callback(self._reconnected_by_client)

    def _reconnected_by_client(self, connection: object) -> None:
        # Counted once a read on it succeeds (_settle_reconnects): if the connection
        # fails again first, the hub's own reconnect counts that one loss instead.
        self._client_reconnects += 1
        self._losses += 1

    def _settle_reconnects(self) -> None:
        """A read succeeded: the reconnects redis-py made for it are done, count them."""
        if self._client_reconnects:
            self._reconnects += self._client_reconnects
            self._client_reconnects = 0
            logger.warning(
                "pub/sub connection lost and re-established by the Redis client; "
                "its channels are subscribed again"
            )

    def _ensure_pubsub(self) -> PubSub:
        if self._pubsub is None:
            self._pubsub = self._redis.pubsub()
        return self._pubsub

    async def _reader(self) -> None:
        backoff = 0.05
        last_heard = time.monotonic()
        ping_sent = False
        while True:
            await self._connected.wait()
            pubsub = self._pubsub
            if pubsub is None or pubsub.connection is None:
                self._connected.clear()
                continue
            try:
                message = await pubsub.get_message(timeout=self.PING_INTERVAL)
                self._settle_reconnects()
                if message is None:
                    if ping_sent and time.monotonic() - last_heard > 2 * self.PING_INTERVAL:
                        raise rex.ConnectionError("no answer to PING on the pub/sub connection")
                    if not ping_sent:
                        await pubsub.ping()
                        ping_sent = True
                    continue
            except Exception as exc:  # e.g. RedisError, OSError, or redis-py's RuntimeError
                # SUBSCRIBE's refusal arrives here, as the reply read after it.
                self._note_refusal(exc)
                await self._reconnect(exc, backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            last_heard, ping_sent, backoff = time.monotonic(), False, 0.05
            self._dispatch(message)

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind = as_text(message.get("type"))
        channel = as_text(message.get("channel"))
        queue = self._queues.get(channel)
        if kind == "message":
            data = as_text(message.get("data"))
            if queue is not None and queue.queued:
                # A queued kind's release names the waiter it was granted to (which may
                # be one of ours, released by one of ours), or is "" if nobody waited.
                self._messages += 1
                if data:
                    queue.wake_field(data)
            # Our own releases already woke the local head directly.
            elif data != self._manager_id:
                self._messages += 1
                # Another client released: the clients we yielded to had their turn. An
                # anonymous message may be our own release echoed back, so it ends no
                # yield (the window's timer wakes the head when it is over).
                if queue is None or not queue.anonymous:
                    self._yields.pop(channel, None)
                if queue is not None:
                    queue.wake_head()
        elif kind == "subscribe" and queue is not None:
            self.failure = None
            # First confirmation: the head may now retry without missing a release.
            # A repeated one follows a reconnect made inside redis-py, during which
            # releases may have been missed: either way, wake the head.
            queue.confirmed = True
            queue.wake_head()
        elif kind == "unsubscribe":
            self._unsubscribing.discard(channel)
            if queue is not None and channel not in self._subscribed:
                queue.confirmed = False

    def _note_refusal(self, exc: Exception) -> None:
        """An ACL or credentials refusal: fail the waiters instead of letting them poll."""
        if not isinstance(exc, rex.RedisError):
            return
        error = translate(exc, "subscribing to lock release channels")
        if isinstance(error, LockPermissionError):
            # No retry helps until an administrator acts; without pub/sub the waiters
            # would silently fall back to retrying at lease intervals.
            self.failure = str(error)
            self._wake_all()

    async def _reconnect(self, exc: BaseException, backoff: float) -> None:
        """The connection failed: wake every head, then start over on a new connection."""
        logger.warning("pub/sub connection lost, reconnecting: %s", exc)
        self._reconnects += 1
        self._losses += 1
        self._client_reconnects = 0  # one loss, counted here (redis-py's try failed)
        for queue in self._queues.values():
            queue.confirmed = False
            # A release may have been missed; heads fall back to TTL waits (a queued
            # kind's queue: the first waiter, see wake_head)
            queue.wake_head()
        await self._drop_connection()
        await anyio.sleep(backoff)
        self._changed.update(self._queues)  # nothing is subscribed on the next connection
        self._dirty.set()

    async def _drop_connection(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        self._subscribed.clear()
        self._unsubscribing.clear()
        self._connected.clear()
        if pubsub is not None:
            self._uncount_reconnects(pubsub)
            try:
                await pubsub.aclose()  # type: ignore[no-untyped-call]
            except Exception as exc:  # the connection is already broken
                logger.debug("closing the pub/sub connection: %s", exc)
