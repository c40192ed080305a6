"""Subscriptions on a Redis Cluster: sharded, on the primary that owns each channel's slot.

On a cluster, release messages are published with ``SPUBLISH`` (see
:func:`aiolock._redis.cluster.sharded`): a sharded channel lives on the primary that owns its
slot, and only clients subscribed *there* with ``SSUBSCRIBE`` hear it (and only they are
counted by ``SPUBLISH`` and ``PUBSUB SHARDNUMSUB``, which the hand-over decisions use).
:class:`ClusterSubscriptions` is a :class:`~aiolock._redis.pubsub.Source` like a single
:class:`~aiolock._redis.pubsub.Subscriber`: it routes each wanted channel to a sharded
subscriber of the primary that owns it (one connection per primary that owns a wanted
channel), and passes their events on to its owner (the hub).

Slot moves. When a slot migrates or its primary fails over, the server pushes an
unsolicited ``sunsubscribe`` for each of the slot's channels (or the connection drops,
or an ``SSUBSCRIBE`` sent on a stale map answers ``MOVED``). Each of these:

1. reports the channel lost at once, so the hub wakes its queue's head, which retries
   (its command follows the slot to the new owner): a release published on the new
   owner before our subscription there is not lost, because the head looks for itself;
2. reloads the slot map and subscribes the channel again on the node that owns it now;
   that confirmation wakes the head once more, as any first confirmation does.

A node whose connection failed (or on which a subscription change failed: it may have
been failed over) is given up: its channels are routed again, after a backoff and a
fresh slot map, maybe to a new subscriber of the same node.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection

import anyio
from anyio.abc import TaskGroup
from redis.asyncio.cluster import ClusterNode
from redis.crc import key_slot

from aiolock._redis.cluster import ClusterClient
from aiolock._redis.pubsub import FIRST_BACKOFF, MAX_BACKOFF, Subscriber, SubscriptionEvents, Tally
from aiolock._redis.reach import LOG_INTERVAL

__all__ = ["ClusterSubscriptions"]

logger = logging.getLogger("aiolock")


class _Node(SubscriptionEvents):
    """A primary's sharded subscriber; its events go to the router."""

    def __init__(self, router: ClusterSubscriptions, name: str, subscriber: Subscriber) -> None:
        self.router = router
        self.name = name
        self.subscriber = subscriber
        subscriber.bind(self)
        #: cancelled when the node is retired (which may happen before it started)
        self.scope = anyio.CancelScope()

    def on_message(self, channel: str, data: str) -> None:
        self.router.owner.on_message(channel, data)

    def on_confirmed(self, channel: str) -> None:
        self.router.confirmed(self, channel)

    def on_unconfirmed(self, channel: str) -> None:
        self.router.unconfirmed(self, channel)

    def on_dropped(self, channel: str) -> None:
        self.router.dropped(self, channel)

    def on_lost(self, channels: Collection[str]) -> None:
        self.router.give_up(self)

    def on_moved(self, channel: str) -> None:
        self.router.moved(self, channel)

    def on_failed(self, exc: Exception, refusal: str | None) -> None:
        self.router.owner.on_failed(exc, refusal)
        self.router.give_up(self)


class ClusterSubscriptions:
    """A :class:`~aiolock._redis.pubsub.Source` over a Redis Cluster: one sharded subscriber per
    primary that owns a wanted channel, each channel routed to the owner of its slot."""

    def __init__(self, client: ClusterClient) -> None:
        self._client = client
        #: whom the events go to (the hub)
        self.owner = SubscriptionEvents()
        #: the counters of every node's subscriber
        self.tally = Tally()
        #: node name -> its subscriber
        self._nodes: dict[str, _Node] = {}
        #: channel -> the node it is routed to (whose subscriber wants it)
        self._where: dict[str, str] = {}
        self._wanted: set[str] = set()
        #: channels whose routing may have to change
        self._changed: set[str] = set()
        self._dirty = asyncio.Event()
        self._tg: TaskGroup | None = None
        self._recovering = False
        #: the pause before routing again after a failure (reset by a confirmation)
        self._backoff = FIRST_BACKOFF

    @property
    def moves(self) -> int:
        """Slot moves noticed (a pushed sunsubscribe, or MOVED), for statistics and tests."""
        return self.tally.moves

    def bind(self, events: SubscriptionEvents) -> None:
        self.owner = events

    def want(self, channel: str) -> None:
        if channel not in self._wanted:
            self._wanted.add(channel)
            self._mark(channel)

    def unwant(self, channel: str) -> None:
        self._wanted.discard(channel)
        self._mark(channel)

    def _mark(self, channel: str) -> None:
        self._changed.add(channel)
        self._dirty.set()

    def subscribed(self, channel: str) -> bool:
        node = self._nodes.get(self._where.get(channel, ""))
        return node is not None and node.subscriber.subscribed(channel)

    def listening(self, channel: str) -> bool:
        # (asked on every release: with no subscription anywhere, no generator is made)
        return bool(self._nodes) and any(
            node.subscriber.listening(channel) for node in self._nodes.values()
        )

    # -- routing -------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                tg.start_soon(self._route_loop)
        finally:  # each node's subscriber closed its connection as it ended
            self._tg = None
            self._nodes.clear()
            self._where.clear()

    async def _route_loop(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            changed, self._changed = self._changed, set()
            try:
                await self._route(changed)
            except Exception as exc:  # no owner known for a slot now: retried
                self._changed |= changed
                level = logging.DEBUG
                if time.monotonic() - self.tally.warned_at >= LOG_INTERVAL:
                    level, self.tally.warned_at = logging.WARNING, time.monotonic()
                logger.log(level, "pub/sub subscription change failed, will retry: %s", exc)
                self._recover_soon()
            for node in list(self._nodes.values()):
                self._retire_if_idle(node)

    async def _route(self, changed: set[str]) -> None:
        """Hand each of the *changed* channels to the subscriber of its slot's owner."""
        for channel in sorted(changed):
            if channel not in self._wanted:
                node = self._nodes.get(self._where.pop(channel, ""))
                if node is not None:
                    node.subscriber.unwant(channel)  # which reports it dropped
                else:
                    self.owner.on_dropped(channel)
                continue
            owner = await self._client.owner(key_slot(channel.encode("utf-8")))
            here = self._where.get(channel)
            if here == owner.name and here in self._nodes:
                continue
            if channel not in self._wanted:  # no longer, while the map was read
                self._mark(channel)
                continue
            node = self._nodes.get(here or "")
            if node is not None:
                node.subscriber.unwant(channel)
            self._node(owner).subscriber.want(channel)
            self._where[channel] = owner.name

    def _node(self, owner: ClusterNode) -> _Node:
        node = self._nodes.get(owner.name)
        if node is None:
            assert self._tg is not None
            subscriber = Subscriber(
                self._client.node_redis(owner),
                sharded=True,
                where=f" to {owner.name}",
                tally=self.tally,
            )
            node = self._nodes[owner.name] = _Node(self, owner.name, subscriber)
            self._tg.start_soon(self._run_node, node)
        return node

    async def _run_node(self, node: _Node) -> None:
        with node.scope:
            await node.subscriber.run()

    def _retire_if_idle(self, node: _Node) -> None:
        """A node with nothing subscribed gives its connection back, once the server
        confirmed every unsubscription (until then it counts us as listening)."""
        if node.subscriber.idle and self._nodes.get(node.name) is node:
            del self._nodes[node.name]
            node.scope.cancel()

    def _recover_soon(self) -> None:
        """After a backoff, reload the slot map, then route what is missing."""
        if self._tg is None or self._recovering:
            return
        self._recovering = True

        async def refresh_then_route() -> None:
            try:
                await anyio.sleep(self._backoff)
                self._backoff = min(self._backoff * 2, MAX_BACKOFF)
                try:
                    await self._client.refresh()
                except Exception as exc:  # routing retries with the backoff
                    logger.warning("reloading the Redis Cluster slot map failed: %s", exc)
            finally:
                self._recovering = False
                self._dirty.set()

        self._tg.start_soon(refresh_then_route)

    # -- the nodes' events -----------------------------------------------------------------

    def confirmed(self, node: _Node, channel: str) -> None:
        if self._where.get(channel) == node.name:  # not a late one from a former node
            self._backoff = FIRST_BACKOFF
            self.owner.on_confirmed(channel)

    def unconfirmed(self, node: _Node, channel: str) -> None:
        if self._where.get(channel, node.name) == node.name:  # not subscribed elsewhere
            self.owner.on_unconfirmed(channel)
        self._retire_if_idle(node)

    def dropped(self, node: _Node, channel: str) -> None:
        if channel not in self._wanted:
            self.owner.on_dropped(channel)
        self._retire_if_idle(node)

    def give_up(self, node: _Node) -> None:
        """*node*'s connection failed, or a subscription change on it did (it may have
        been failed over): route its channels again with a fresh slot map."""
        if self._nodes.get(node.name) is not node:
            return  # given up already
        del self._nodes[node.name]
        node.scope.cancel()
        mine = [c for c in node.subscriber.wanted if self._where.get(c) == node.name]
        for channel in mine:
            del self._where[channel]
        self._changed.update(mine)
        # A release may have been missed where it was subscribed (a node that keeps
        # failing to subscribe wakes nobody at each retry).
        self.owner.on_lost([c for c in mine if node.subscriber.listening(c)])
        self._recover_soon()

    def moved(self, node: _Node, channel: str) -> None:
        """The server moved *channel* away from *node* (which counted it): route it again."""
        if self._where.get(channel) == node.name:
            del self._where[channel]
            node.subscriber.unwant(channel)
        self._changed.add(channel)
        self.owner.on_lost((channel,))
        self._recover_soon()
