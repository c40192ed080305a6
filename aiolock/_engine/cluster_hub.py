"""The pub/sub hub on a Redis Cluster: sharded subscriptions, one connection per node.

On a cluster, release messages are published with ``SPUBLISH`` (see
:func:`aiolock._redis.cluster.sharded`): a sharded channel lives on the primary that owns its
slot, and only clients subscribed *there* with ``SSUBSCRIBE`` hear it (and only they are
counted by ``SPUBLISH`` and ``PUBSUB SHARDNUMSUB``, which the hand-over decisions use).
:class:`ClusterHub` keeps the waiter queues and every bookkeeping rule of
:class:`~aiolock._engine.hub.WaiterHub` and replaces its I/O: one pub/sub connection per
primary that owns a channel with waiters, each with its own reader task.

Slot moves. When a slot migrates or its primary fails over, the server pushes an
unsolicited ``sunsubscribe`` for each of the slot's channels (or the connection drops,
or an ``SSUBSCRIBE`` sent on a stale map answers ``MOVED``). Each of these:

1. marks the channel unconfirmed and wakes its queue's head at once, which retries (its
   command follows the slot to the new owner): a release published on the new owner
   before our subscription there is not lost, because the head looks for itself;
2. reloads the slot map and subscribes the channel again on the node that owns it now;
   that confirmation wakes the head once more, as any first confirmation does.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import anyio
from anyio.abc import TaskGroup
from redis import exceptions as rex
from redis.asyncio.client import PubSub
from redis.crc import key_slot

from aiolock._engine.hub import WaiterHub
from aiolock._redis.client import as_text
from aiolock._redis.cluster import ClusterClient

__all__ = ["ClusterHub"]

logger = logging.getLogger("aiolock")


class _NodeLink:
    """The pub/sub connection to one primary and the channels subscribed on it."""

    __slots__ = ("channels", "done", "leaving", "name", "pubsub", "reading", "scope")

    def __init__(self, name: str, pubsub: PubSub) -> None:
        self.name = name
        self.pubsub = pubsub
        #: channels subscribed (SSUBSCRIBE sent), and unsubscribed but not yet confirmed
        self.channels: set[str] = set()
        self.leaving: set[str] = set()
        #: its reader task was started; the reader's cancel scope, and set once it ended
        self.reading = False
        self.scope: anyio.CancelScope | None = None
        self.done = anyio.Event()


class ClusterHub(WaiterHub):
    """:class:`~aiolock._engine.hub.WaiterHub` with SSUBSCRIBE on the node owning each channel."""

    def __init__(self, client: ClusterClient, manager_id: str) -> None:
        # The base class's own connection (made from this client) is never opened here.
        super().__init__(client.redis, manager_id)  # type: ignore[arg-type]
        self._client = client
        #: node name -> its pub/sub link
        self._links: dict[str, _NodeLink] = {}
        #: channel -> the node it was subscribed on
        self._where: dict[str, str] = {}
        self._tg: TaskGroup | None = None
        #: slot moves noticed (pushed sunsubscribe or MOVED), for statistics and tests
        self.moves = 0

    # -- I/O -------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                tg.start_soon(self._pump)
        finally:
            self._tg = None
            with anyio.CancelScope(shield=True), anyio.move_on_after(2.0):
                await self._drop_connection()

    async def _sync_subscriptions(self, changed: set[str]) -> None:
        to_add, to_drop = self._differences(changed)
        for channel in to_drop:
            self._subscribed.discard(channel)
            queue = self._queues.get(channel)
            if queue is not None:
                queue.confirmed = False
            link = self._links.get(self._where.pop(channel, ""))
            if link is None:
                continue
            link.channels.discard(channel)
            link.leaving.add(channel)
            self._unsubscribing.add(channel)
            # One channel per command: a cluster refuses channels of two slots in one.
            await link.pubsub.sunsubscribe(channel)
        for channel in to_add:
            node = await self._client.owner(key_slot(channel.encode("utf-8")))
            link = self._link(node.name, node)
            try:
                await link.pubsub.ssubscribe(channel)
                self._count_reconnects(link.pubsub)
            except Exception:
                # The node cannot be reached: drop the link; the pump retries with a
                # fresh slot map (the node may have been failed over meanwhile).
                self._links.pop(link.name, None)
                self._forget(link)
                await self._close_link(link)
                await self._client.refresh()
                raise
            self._where[channel] = node.name
            link.channels.add(channel)
            self._subscribed.add(channel)
            if not link.reading and self._tg is not None:
                link.reading = True
                self._tg.start_soon(self._node_reader, link)
        self._forget_idle(changed)
        # A node with nothing subscribed any more gives its connection back, once the
        # server confirmed every unsubscription (until then it counts us as listening).
        for name, link in list(self._links.items()):
            if not link.channels and not link.leaving:
                del self._links[name]
                await self._close_link(link)

    def _link(self, name: str, node: Any) -> _NodeLink:
        link = self._links.get(name)
        if link is None:
            pubsub = self._client.node_redis(node).pubsub()
            link = self._links[name] = _NodeLink(name, pubsub)
        return link

    async def _node_reader(self, link: _NodeLink) -> None:
        """Read one node's messages until its link is closed or fails."""
        try:
            with anyio.CancelScope() as scope:
                link.scope = scope
                await self._read_link(link)
        finally:
            link.done.set()

    async def _read_link(self, link: _NodeLink) -> None:
        last_heard = time.monotonic()
        ping_sent = False
        while self._links.get(link.name) is link:
            try:
                message = await link.pubsub.get_message(timeout=self.PING_INTERVAL)
                self._settle_reconnects()
                if message is None:
                    if ping_sent and time.monotonic() - last_heard > 2 * self.PING_INTERVAL:
                        raise rex.ConnectionError("no answer to PING on a pub/sub connection")
                    if not ping_sent and link.pubsub.connection is not None:
                        await link.pubsub.ping()
                        ping_sent = True
                    continue
            except Exception as exc:  # MOVED for an SSUBSCRIBE, a dropped connection, ...
                if self._links.get(link.name) is not link:
                    return  # closed on purpose meanwhile
                self._note_refusal(exc)
                await self._lose_link(link, exc)
                return
            last_heard, ping_sent = time.monotonic(), False
            self._dispatch_sharded(link, message)

    def _dispatch_sharded(self, link: _NodeLink, message: dict[str, Any]) -> None:
        kind = as_text(message.get("type"))
        channel = as_text(message.get("channel"))
        if kind == "smessage":
            self._dispatch({**message, "type": "message"})
        elif kind == "ssubscribe":
            self._dispatch({**message, "type": "subscribe"})
        elif kind == "sunsubscribe":
            if channel in link.leaving:
                link.leaving.discard(channel)
                self._dispatch({**message, "type": "unsubscribe"})
                if not link.channels and not link.leaving:
                    self._dirty.set()  # the pump closes the idle link
            elif channel in link.channels:
                # Pushed by the server: the slot moved to another node (a migration, a
                # failover). Forget the subscription here, let the head look for itself
                # now, and subscribe again where the slot lives now.
                self.moves += 1
                self._losses += 1  # releases may be missed until it is subscribed again
                link.channels.discard(channel)
                link.pubsub.shard_channels.pop(channel.encode(), None)
                link.pubsub.shard_channels.pop(channel, None)
                self._where.pop(channel, None)
                self._subscribed.discard(channel)
                self._changed.add(channel)  # subscribed again where the slot lives now
                queue = self._queues.get(channel)
                if queue is not None:
                    queue.confirmed = False
                    queue.wake_head()
                self._resubscribe_soon()

    async def _lose_link(self, link: _NodeLink, exc: BaseException) -> None:
        """A node's connection failed (or answered MOVED): move its channels elsewhere."""
        logger.warning("pub/sub connection to %s lost, resubscribing: %s", link.name, exc)
        self._losses += 1  # its subscriptions may have missed releases (see WaiterHub.losses)
        if isinstance(exc, rex.MovedError):
            self.moves += 1
        else:
            self._reconnects += 1
            self._client_reconnects = 0  # one loss, counted here (redis-py's try failed)
        self._links.pop(link.name, None)
        self._forget(link)
        await self._close_link(link, by_reader=True)
        await anyio.sleep(0.05)
        self._resubscribe_soon()

    def _forget(self, link: _NodeLink) -> None:
        """*link* is gone: its channels are no longer subscribed anywhere."""
        for channel in link.leaving:
            self._unsubscribing.discard(channel)
        for channel in link.channels:
            self._subscribed.discard(channel)
            self._where.pop(channel, None)
            queue = self._queues.get(channel)
            if queue is not None:
                queue.confirmed = False
                queue.wake_head()  # a release may have been missed
        if link.channels:
            self._changed.update(link.channels)
            self._dirty.set()  # the pump subscribes them again, wherever they live now
        link.channels.clear()
        link.leaving.clear()

    def _resubscribe_soon(self) -> None:
        """Reload the slot map, then let the pump subscribe what is missing."""
        if self._tg is None:
            return

        async def refresh_then_sync() -> None:
            try:
                await self._client.refresh()
            except Exception as exc:  # the pump retries with its own backoff
                logger.warning("reloading the Redis Cluster slot map failed: %s", exc)
            self._dirty.set()

        self._tg.start_soon(refresh_then_sync)

    async def _close_link(self, link: _NodeLink, *, by_reader: bool = False) -> None:
        # Stop its reader first: a closed connection goes back to the pool, which may
        # hand it (reconnected) to another link while the old reader still reads it.
        if not by_reader and link.scope is not None:
            link.scope.cancel()
            await link.done.wait()
        self._uncount_reconnects(link.pubsub)
        try:
            await link.pubsub.aclose()  # type: ignore[no-untyped-call]
        except Exception as exc:  # the connection is already broken
            logger.debug("closing a pub/sub connection: %s", exc)

    async def _drop_connection(self) -> None:
        links, self._links = self._links, {}
        self._subscribed.clear()
        self._unsubscribing.clear()
        self._where.clear()
        for link in links.values():
            await self._close_link(link)
