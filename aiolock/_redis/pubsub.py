"""The one pub/sub reader loop: connections kept subscribed to wanted sets of channels.

Waiting tasks (the manager's hub) and the Redlock's masters hear releases the same way:
a :class:`Subscriber` owns one pub/sub connection and a *wanted* set of channels, and
tells its owner what happens through :class:`SubscriptionEvents` (messages, confirmed
and unconfirmed subscriptions, lost connections). Two background tasks do the I/O:

* the *pump* sends SUBSCRIBE/UNSUBSCRIBE (or their sharded forms) for the channels whose
  demand changed since its last pass, in batches: each pass looks at the changed
  channels only, so its cost follows what changed, not how many channels are wanted;
* the *reader* receives messages and confirmations, PINGs a silent connection, and when
  the connection fails, reports every channel lost (a release may have been missed),
  makes a new connection after a backoff and subscribes the wanted channels again.

Reconnects made by redis-py itself (its retry policy re-establishes a dropped pub/sub
connection inside a read and subscribes again, so the reader sees no failure) are
counted too: see :meth:`Subscriber._count_reconnects`.

On a Redis Cluster, :class:`~aiolock._redis.cluster_pubsub.ClusterSubscriptions` keeps one
sharded :class:`Subscriber` per primary and routes each channel to its slot's owner.
Both are a :class:`Source`: what the hub is given by whoever builds it (the manager), so
the hub knows nothing of the topology.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
from redis import exceptions as rex
from redis.asyncio import Redis
from redis.asyncio.client import PubSub

from aiolock._errors import LockPermissionError
from aiolock._redis.client import as_text, translate
from aiolock._redis.reach import LOG_INTERVAL

__all__ = ["Source", "Subscriber", "SubscriptionEvents", "Tally"]

logger = logging.getLogger("aiolock")

#: first and longest pause before a failed subscription change or connection is retried
FIRST_BACKOFF = 0.05
MAX_BACKOFF = 2.0


class SubscriptionEvents:
    """What a subscription source tells its owner. Every call is synchronous (it runs in
    the reader's or the pump's task) and must not raise; the defaults do nothing."""

    def on_message(self, channel: str, data: str) -> None:
        """A message was published on *channel*."""

    def on_confirmed(self, channel: str) -> None:
        """The server confirmed the subscription to *channel* (again, after a reconnect
        made inside redis-py, during which messages may have been missed)."""

    def on_unconfirmed(self, channel: str) -> None:
        """The subscription to *channel* ends: UNSUBSCRIBE was sent, or confirmed while
        no new SUBSCRIBE was sent since."""

    def on_dropped(self, channel: str) -> None:
        """*channel* is neither wanted nor subscribed any more: its state may be forgotten."""

    def on_lost(self, channels: Collection[str]) -> None:
        """The connection holding *channels* was lost: messages may have been missed.
        They are subscribed again on a new connection (those still wanted)."""

    def on_moved(self, channel: str) -> None:
        """The server ended the subscription to *channel* by itself (its slot moved to
        another node); it is subscribed again unless it is no longer wanted here."""
        self.on_lost((channel,))

    def on_failed(self, exc: Exception, refusal: str | None) -> None:
        """A subscription change or a read failed (it is retried). *refusal* says why, if
        Redis refused it for good (ACL, credentials): no retry helps until someone acts."""


@dataclass
class Tally:
    """Counters of one source (shared by the subscribers of a cluster's nodes)."""

    #: times a connection was lost and made again (by us, or by redis-py inside a read)
    reconnects: int = 0
    #: connection losses of either kind and moved subscriptions, counted at once: a
    #: subscription confirmed before and this unchanged since has missed no message
    losses: int = 0
    #: subscriptions the server ended or refused (MOVED) because their slot moved
    moves: int = 0
    #: channels the pumps looked at, over all passes
    examined: int = 0
    #: when a failed change was last logged as a warning (they are rate-limited)
    warned_at: float = -LOG_INTERVAL


class Source(Protocol):
    """Where a hub's subscriptions live: one :class:`Subscriber`, or a cluster's router."""

    tally: Tally

    def bind(self, events: SubscriptionEvents) -> None: ...

    def want(self, channel: str) -> None: ...

    def unwant(self, channel: str) -> None: ...

    def subscribed(self, channel: str) -> bool: ...

    def listening(self, channel: str) -> bool: ...

    async def run(self) -> None: ...


class Subscriber:
    """One pub/sub connection, kept subscribed to the wanted channels.

    *sharded* uses SSUBSCRIBE/SUNSUBSCRIBE, one channel per command (a cluster refuses
    channels of two slots in one). With a *time_limit*, every subscription change and
    PING must be sent within that many seconds (a server that stopped answering is left
    for a new connection), and a failed change drops the connection: a command cut off
    half-way leaves it unusable. Without one, a failed change is retried on the same
    connection (redis-py reconnects it), and the reader notices a dead one.
    """

    #: how long the reader may hear nothing before it PINGs the server
    PING_INTERVAL = 15.0

    def __init__(
        self,
        redis: Redis,
        events: SubscriptionEvents | None = None,
        *,
        sharded: bool = False,
        time_limit: float | None = None,
        ping_interval: float | None = None,
        where: str = "",
        tally: Tally | None = None,
    ) -> None:
        self._redis = redis
        self._events = events if events is not None else SubscriptionEvents()
        self._sharded = sharded
        self._limit = time_limit
        if ping_interval is not None:
            self.PING_INTERVAL = ping_interval
        #: how log lines name the connection: "" or " to <server>"
        self._where = where
        self.tally = tally if tally is not None else Tally()
        self._wanted: set[str] = set()
        self._subscribed: set[str] = set()  # SUBSCRIBE sent on the current connection
        self._unsubscribing: set[str] = set()  # UNSUBSCRIBE sent, not yet confirmed
        #: channels whose subscription may have to change: the pump's next pass
        self._changed: set[str] = set()
        self._dirty = asyncio.Event()
        self._connected = asyncio.Event()
        self._pubsub: PubSub | None = None
        #: reconnects redis-py made by itself, not yet counted (see _count_reconnects)
        self._client_reconnects = 0

    def bind(self, events: SubscriptionEvents) -> None:
        self._events = events

    # -- the wanted set: synchronous, the pump does the I/O ---------------------------

    def want(self, channel: str) -> None:
        if channel not in self._wanted:
            self._wanted.add(channel)
            if channel not in self._subscribed:
                self._mark(channel)

    def unwant(self, channel: str) -> None:
        if channel in self._wanted or channel in self._subscribed:
            self._wanted.discard(channel)
            self._mark(channel)  # unsubscribed, or reported dropped

    def _mark(self, channel: str) -> None:
        self._changed.add(channel)
        self._dirty.set()

    @property
    def wanted(self) -> frozenset[str]:
        return frozenset(self._wanted)

    def subscribed(self, channel: str) -> bool:
        """Whether SUBSCRIBE for *channel* was sent on the current connection."""
        return channel in self._subscribed

    def listening(self, channel: str) -> bool:
        """Whether the server may count this connection among *channel*'s subscribers."""
        return channel in self._subscribed or channel in self._unsubscribing

    @property
    def idle(self) -> bool:
        """Nothing wanted, and nothing the server may still count."""
        return not (self._wanted or self._subscribed or self._unsubscribing)

    # -- I/O: two background tasks ----------------------------------------------------

    async def run(self) -> None:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._pump)
                tg.start_soon(self._reader)
        finally:
            await self._close(self._detach())

    async def _pump(self) -> None:
        """Bring the server's subscriptions in line with the wanted set, in batches."""
        backoff = FIRST_BACKOFF
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            changed, self._changed = self._changed, set()
            self.tally.examined += len(changed)
            try:
                with anyio.fail_after(self._limit):
                    await self._sync(changed)
                backoff = FIRST_BACKOFF
            except Exception as exc:  # any failure of this I/O is retried, never fatal
                self._changed |= changed  # looked at again (what was done is skipped)
                self._fail(exc)
                # Retried every 2 s at most during an outage: warn at most every
                # LOG_INTERVAL (the engine logs the outage and its end, see _reach).
                level = logging.DEBUG
                if time.monotonic() - self.tally.warned_at >= LOG_INTERVAL:
                    level, self.tally.warned_at = logging.WARNING, time.monotonic()
                logger.log(
                    level, "pub/sub subscription change%s failed, will retry: %s", self._where, exc
                )
                if self._limit is not None and self._pubsub is not None:
                    await self._reconnect(exc, backoff, self._pubsub)
                else:
                    self._dirty.set()
                    await anyio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)

    async def _sync(self, changed: set[str]) -> None:
        """Bring the subscriptions of the *changed* channels in line with the wanted set."""
        to_add: list[str] = []
        to_drop: list[str] = []
        for name in sorted(changed):
            wanted = name in self._wanted
            if wanted and name not in self._subscribed:
                to_add.append(name)
            elif not wanted and name in self._subscribed:
                to_drop.append(name)
        if to_add:
            pubsub = self._ensure_pubsub()
            for batch in [[c] for c in to_add] if self._sharded else [to_add]:
                await (pubsub.ssubscribe if self._sharded else pubsub.subscribe)(*batch)
                if self._pubsub is not pubsub:  # dropped meanwhile: the reader starts over
                    self._changed |= changed
                    return
                self._count_reconnects(pubsub)
                self._subscribed.update(batch)
                self._connected.set()
        if to_drop and self._pubsub is not None:
            pubsub = self._pubsub
            self._subscribed.difference_update(to_drop)
            self._unsubscribing.update(to_drop)
            for name in to_drop:
                self._events.on_unconfirmed(name)
            for batch in [[c] for c in to_drop] if self._sharded else [to_drop]:
                await (pubsub.sunsubscribe if self._sharded else pubsub.unsubscribe)(*batch)
        for name in changed:
            if name not in self._wanted and name not in self._subscribed:
                self._events.on_dropped(name)

    def _ensure_pubsub(self) -> PubSub:
        if self._pubsub is None:
            self._pubsub = self._redis.pubsub()
        return self._pubsub

    async def _reader(self) -> None:
        backoff = FIRST_BACKOFF
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
                        with anyio.fail_after(self._limit):
                            await pubsub.ping()
                        ping_sent = True
                    continue
            except Exception as exc:  # e.g. RedisError, OSError, or redis-py's RuntimeError
                if self._pubsub is not pubsub:
                    continue  # dropped meanwhile by the pump, which made a new one
                # SUBSCRIBE's refusal arrives here, as the reply read after it.
                self._fail(exc)
                await self._reconnect(exc, backoff, pubsub)
                backoff = min(backoff * 2, MAX_BACKOFF)
                last_heard, ping_sent = time.monotonic(), False
                continue
            last_heard, ping_sent, backoff = time.monotonic(), False, FIRST_BACKOFF
            self._dispatch(message)

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind = as_text(message.get("type"))
        channel = as_text(message.get("channel"))
        if kind in ("message", "smessage"):
            self._events.on_message(channel, as_text(message.get("data")))
        elif kind in ("subscribe", "ssubscribe"):
            self._events.on_confirmed(channel)
        elif kind in ("unsubscribe", "sunsubscribe"):
            if channel in self._unsubscribing:
                self._unsubscribing.discard(channel)
                if channel not in self._subscribed:
                    self._events.on_unconfirmed(channel)
            elif channel in self._subscribed:
                self._moved(channel)

    def _moved(self, channel: str) -> None:
        """The server unsubscribed *channel* by itself: its slot moved (a migration, a
        failover). Forget the subscription here and report it."""
        self.tally.moves += 1
        self.tally.losses += 1  # messages may be missed until it is subscribed again
        self._subscribed.discard(channel)
        if self._pubsub is not None:  # or redis-py would subscribe it again here
            known = self._pubsub.shard_channels if self._sharded else self._pubsub.channels
            known.pop(channel.encode(), None)
            known.pop(channel, None)
        self._mark(channel)  # subscribed again, unless the owner no longer wants it here
        self._events.on_moved(channel)

    def _fail(self, exc: Exception) -> None:
        """Report a failure, and whether Redis refused it for good (ACL, credentials)."""
        refusal = None
        if isinstance(exc, rex.RedisError):
            error = translate(exc, "subscribing to lock release channels")
            if isinstance(error, LockPermissionError):
                refusal = str(error)
        self._events.on_failed(exc, refusal)

    async def _reconnect(self, exc: BaseException, backoff: float, pubsub: PubSub) -> None:
        """The connection failed: report its channels lost, then start over on a new one."""
        if self._pubsub is not pubsub:
            return  # already dropped
        logger.warning("pub/sub connection%s lost, reconnecting: %s", self._where, exc)
        if isinstance(exc, rex.MovedError):
            self.tally.moves += 1  # SSUBSCRIBE on a stale slot map: the server is fine
        else:
            self.tally.reconnects += 1
        self.tally.losses += 1
        self._client_reconnects = 0  # one loss, counted here (redis-py's try failed)
        channels = self._wanted | self._subscribed | self._unsubscribing
        self._events.on_lost(channels)
        await self._close(self._detach())
        await anyio.sleep(backoff)
        # Nothing is subscribed on the next connection; the pump also reports the
        # channels no longer wanted as dropped.
        self._changed |= channels | self._wanted
        self._dirty.set()

    def _detach(self) -> PubSub | None:
        pubsub, self._pubsub = self._pubsub, None
        self._subscribed.clear()
        self._unsubscribing.clear()
        self._connected.clear()
        return pubsub

    async def _close(self, pubsub: PubSub | None) -> None:
        if pubsub is None:
            return
        self._uncount_reconnects(pubsub)
        # Shielded: the connection must go back to the pool even if this subscriber is
        # being stopped (a cluster's router stops one from within its callbacks).
        with anyio.CancelScope(shield=True), anyio.move_on_after(2.0):
            try:
                await pubsub.aclose()  # type: ignore[no-untyped-call]
            except Exception as exc:  # the connection is already broken
                logger.debug("closing a pub/sub connection%s: %s", self._where, exc)

    # -- reconnects made inside redis-py ---------------------------------------------

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
        reconnects are none of this subscriber's business."""
        connection = pubsub.connection
        if connection is not None:
            connection.deregister_connect_callback(self._reconnected_by_client)

    def _reconnected_by_client(self, connection: object) -> None:
        # Counted once a read on it succeeds (_settle_reconnects): if the connection
        # fails again first, our own reconnect counts that one loss instead.
        self._client_reconnects += 1
        self.tally.losses += 1

    def _settle_reconnects(self) -> None:
        """A read succeeded: the reconnects redis-py made for it are done, count them."""
        if self._client_reconnects:
            self.tally.reconnects += self._client_reconnects
            self._client_reconnects = 0
            logger.warning(
                "pub/sub connection%s lost and re-established by the Redis client; "
                "its channels are subscribed again",
                self._where,
            )
