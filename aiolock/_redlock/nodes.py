"""The masters of a Redlock: checking the clients, talking to all of them, hearing releases.

A Redlock runs over N independent Redis masters (no replication between them). This
module holds what concerns the set of masters, not the lock:

* :func:`check_clients`: the clients given by the user, checked at the call;
* :class:`Node`: one master: its client (:class:`~aiolock._redis.client.Client`, with a
  per-command time limit, so a master that stopped answering costs a bounded wait) and
  its pub/sub listener;
* :func:`fan_out`: one call per master, concurrently, returning as soon as the outcome
  is decided (a majority said yes, or can no longer say yes);
* :class:`Signals` and :class:`Listener`: release messages from *any* master wake the
  local task waiting for that lock (each master's connection is a
  :class:`~aiolock._redis.pubsub.Subscriber`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from typing import Any, TypeVar

import anyio
from redis.asyncio import Redis

from aiolock._errors import LockConnectionError
from aiolock._redis.client import Client
from aiolock._redis.pubsub import Subscriber, SubscriptionEvents
from aiolock._redis.scripts import Script

__all__ = ["Listener", "Node", "Signals", "check_clients", "fan_out"]

logger = logging.getLogger("aiolock")

T = TypeVar("T")

#: After a majority answered, the other masters get this long to answer too before their
#: calls are cancelled: the hold is valid without them (release and renewal go to every
#: master anyway), and a master that stopped answering must not slow every acquisition
#: down to the per-command time limit.
STRAGGLER_GRACE = 0.005
#: Seconds a master that did not answer in time is skipped (see :class:`Node`).
DOWN_FOR = 1.0


def _address(redis: Redis) -> tuple[object, ...]:
    """The server a client's connections go to: (host, port), or ("unix", path).

    The database number is left out on purpose: two databases of one server are one
    master, and would fail together.
    """
    kwargs = redis.connection_pool.connection_kwargs
    if "path" in kwargs:
        return ("unix", kwargs["path"])
    return (str(kwargs.get("host", "localhost")).lower(), int(kwargs.get("port", 6379)))


def check_clients(clients: object) -> list[Redis]:
    """The masters' clients, checked: an odd number >= 3 of distinct asyncio clients."""
    if isinstance(clients, (str, bytes, Redis)) or not isinstance(clients, Iterable):
        raise TypeError(
            "redlock() takes a list of redis.asyncio.Redis clients, one per independent "
            f"master, not {type(clients).__name__}"
        )
    checked = list(clients)
    for i, client in enumerate(checked):
        if not isinstance(client, Redis):
            name = type(client).__name__
            hint = (
                " (a synchronous client; use redis.asyncio.Redis)"
                if "Redis" in name and not type(client).__module__.startswith("redis.asyncio")
                else ""
            )
            raise TypeError(
                f"redlock() client #{i} is a {name}{hint}, not a redis.asyncio.Redis; "
                "give one client per independent Redis master"
            )
    count = len(checked)
    if count < 3 or count % 2 == 0:
        raise ValueError(
            f"redlock() needs an odd number of at least 3 independent masters, got {count}: "
            "a lock is held when a majority (N // 2 + 1) of them grant it, so 1 master "
            "tolerates no failure, 2 masters need both (still no failure tolerated), and "
            "an even count tolerates no more failures than the odd count below it "
            "(4 tolerate 1, like 3) while adding a master to every round trip. Use 3 or 5 "
            "masters, or LockManager(redis) for a single server"
        )
    seen: dict[object, int] = {}
    for i, client in enumerate(checked):
        for key in (id(client), _address(client)):
            if key in seen:
                what = "the same client object" if isinstance(key, int) else f"{key}"
                raise ValueError(
                    f"redlock() clients #{seen[key]} and #{i} point at the same master "
                    f"({what}): every vote must come from an independent master, or one "
                    "server would count twice towards the majority"
                )
            seen[key] = i
    return checked


async def fan_out(
    calls: Sequence[Callable[[], Awaitable[T]]],
    decided: Callable[[list[T | BaseException | None]], bool],
    grace: float = STRAGGLER_GRACE,
    adopt: Callable[[asyncio.Task[Any]], None] | None = None,
) -> list[T | BaseException | None]:
    """Run every call concurrently; return their results once *decided* says so.

    A result is the call's value, its exception, or None if it had not finished (the
    outcome was decided without it; its command may still run on its master). Once
    *decided* is true, unfinished calls get *grace* seconds more; then they are handed
    to *adopt* to finish in the background (cancelling them would drop their connection
    and cost a reconnect on every round to a master that is merely slower than the
    others), or cancelled if there is no *adopt*. Every call is bounded by its client's
    command time limit. A cancellation of the caller cancels the calls and propagates
    (the caller then undoes whatever they may have done).
    """
    tasks = [asyncio.ensure_future(call()) for call in calls]
    results: list[T | BaseException | None] = [None] * len(tasks)
    finished = False
    try:
        pending = set(tasks)
        cutoff: float | None = None
        while pending:
            timeout = None if cutoff is None else max(0.0, cutoff - time.monotonic())
            done, pending = await asyncio.wait(
                pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                break  # the grace ran out
            for i, task in enumerate(tasks):
                if task in done:
                    results[i] = task.exception() or task.result()
            if cutoff is None and pending and decided(results):
                cutoff = time.monotonic() + grace
        finished = True
    finally:
        leftover = [task for task in tasks if not task.done()]
        if finished and adopt is not None:
            for task in leftover:
                adopt(task)
        elif leftover:
            for task in leftover:
                task.cancel()
            # Let the cancelled calls unwind (their connections are closed), so no task
            # outlives this call; shielded, as a cancelled caller must wait for it too.
            with anyio.CancelScope(shield=True):
                await asyncio.wait(leftover)
        for task in tasks:
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: the results carry it
    return results


class Signals:
    """Per release channel: one event set by a message (or confirmation) from any master."""

    def __init__(self, nodes: int) -> None:
        self._nodes = nodes
        #: channel -> tasks waiting on it; their event; masters subscribed to it
        self._wanted: dict[str, int] = {}
        self._events: dict[str, asyncio.Event] = {}
        self._confirmed: dict[str, set[int]] = {}
        #: channel -> release messages heard from other clients (any master)
        self._heard: dict[str, int] = {}
        #: channel -> the token of the last release heard (its duplicates are ignored)
        self._last: dict[str, str] = {}
        #: every master's subscriber: they follow the wanted channels
        self._subscribers: list[Subscriber] = []
        self.messages = 0
        self.closed = False

    def attach(self, subscriber: Subscriber) -> None:
        self._subscribers.append(subscriber)
        for channel in self._wanted:
            subscriber.want(channel)

    def listen(self, channel: str) -> asyncio.Event:
        """A waiter wants releases of *channel*; the listeners subscribe on every master."""
        count = self._wanted[channel] = self._wanted.get(channel, 0) + 1
        if count == 1:
            for subscriber in self._subscribers:
                subscriber.want(channel)
        return self.event(channel)

    def unlisten(self, channel: str) -> None:
        left = self._wanted.get(channel, 0) - 1
        if left > 0:
            self._wanted[channel] = left
            return
        self._wanted.pop(channel, None)
        self._events.pop(channel, None)
        self._heard.pop(channel, None)
        self._last.pop(channel, None)
        for subscriber in self._subscribers:
            subscriber.unwant(channel)

    def listening(self, channel: str) -> bool:
        return channel in self._wanted

    def event(self, channel: str) -> asyncio.Event:
        event = self._events.get(channel)
        if event is None:
            event = self._events[channel] = asyncio.Event()
        return event

    def confirmed_by(self, channel: str) -> int:
        """Masters on which the subscription to *channel* is confirmed."""
        return len(self._confirmed.get(channel, ()))

    def wake(self, channel: str) -> None:
        event = self._events.get(channel)
        if event is not None:
            event.set()

    def released(self, channel: str, token: str) -> None:
        """Another client's release message, from any master: every master that had the
        hold sends one, but it is one release (the first wakes; the others would only
        cost the woken waiter another round)."""
        self.messages += 1
        if self._last.get(channel) == token:
            return
        self._last[channel] = token
        if channel in self._wanted:
            self._heard[channel] = self._heard.get(channel, 0) + 1
        self.wake(channel)

    def heard(self, channel: str) -> int:
        """Release messages from other clients heard on *channel* while it was wanted."""
        return self._heard.get(channel, 0)

    # A confirmation lasts as long as the master's subscription, not the waiter's: a
    # waiter that stops and starts listening again before the listener unsubscribed
    # finds the subscription still there, and no new confirmation will come for it.

    def confirm(self, node: int, channel: str) -> None:
        self._confirmed.setdefault(channel, set()).add(node)
        self.wake(channel)  # the waiter may now try again without missing a release

    def unconfirm(self, node: int, channel: str) -> None:
        nodes = self._confirmed.get(channel)
        if nodes is not None:
            nodes.discard(node)
            if not nodes:
                del self._confirmed[channel]

    def unconfirm_all(self, node: int) -> None:
        """*node*'s pub/sub connection dropped: a release may have been missed there."""
        for channel in list(self._confirmed):
            self.unconfirm(node, channel)
            self.wake(channel)

    def close(self) -> None:
        self.closed = True
        for event in self._events.values():
            event.set()


class Listener(SubscriptionEvents):
    """One master's pub/sub connection: follows :class:`Signals`' wanted channels."""

    #: seconds of silence after which the connection is pinged, and then dropped; also
    #: the time limit of each subscription change and PING (a master that stopped)
    PING_INTERVAL = 1.0

    def __init__(self, index: int, redis: Redis, signals: Signals, manager_id: str) -> None:
        self.index = index
        #: the start of this manager's tokens: its own release messages
        self._own = f"{manager_id}:"
        self._signals = signals
        self.subscriber = Subscriber(
            redis,
            self,
            time_limit=self.PING_INTERVAL,
            ping_interval=self.PING_INTERVAL,
            where=f" to redlock master #{index}",
        )
        signals.attach(self.subscriber)

    @property
    def reconnects(self) -> int:
        return self.subscriber.tally.reconnects

    def subscribed(self, channel: str) -> bool:
        """Whether this connection is (or is about to be) subscribed to *channel*."""
        return self.subscriber.subscribed(channel)

    async def run(self) -> None:
        await self.subscriber.run()

    def on_message(self, channel: str, data: str) -> None:
        # This manager's own releases woke its local waiter already (and must not end
        # the moment it yields to other clients).
        if not data.startswith(self._own):
            self._signals.released(channel, data)

    def on_confirmed(self, channel: str) -> None:
        self._signals.confirm(self.index, channel)

    def on_unconfirmed(self, channel: str) -> None:
        self._signals.unconfirm(self.index, channel)

    def on_lost(self, channels: Collection[str]) -> None:
        self._signals.unconfirm_all(self.index)  # wakes every waiter: it retries now


class Node:
    """One independent master: its command client and its release listener.

    A master that did not answer within the time limit is *skipped* for :data:`DOWN_FOR`
    seconds: its calls fail at once instead of each costing the time limit again (a
    stopped server accepts connections and answers nothing). Skipping a vote is always
    safe; only the rounds that could not reach a majority without it still ask it.
    """

    def __init__(
        self, index: int, redis: Redis, signals: Signals, command_timeout: float, manager_id: str
    ) -> None:
        self.index = index
        self.redis = redis
        self.client = Client(redis, command_timeout)
        self.listener = Listener(index, redis, signals, manager_id)
        host = _address(redis)
        self.address = ":".join(str(part) for part in host)
        #: monotonic time until which this master is skipped
        self.down_until = 0.0

    def up(self, now: float) -> bool:
        return now >= self.down_until

    async def run(
        self, script: Script, keys: Sequence[str], args: Sequence[Any], *, force: bool = False
    ) -> Any:
        """Run *script* on this master, unless it is skipped (then fail at once)."""
        if not force and time.monotonic() < self.down_until:
            raise LockConnectionError(
                f"redlock master {self.address} is skipped: it did not answer within "
                "node_timeout a moment ago (it is asked again shortly)"
            )
        try:
            reply = await self.client.run(script, keys, args)
        except LockConnectionError:
            self.down_until = time.monotonic() + DOWN_FOR
            raise
        self.down_until = 0.0
        return reply

    def __repr__(self) -> str:
        return f"<redlock master #{self.index} {self.address}>"
