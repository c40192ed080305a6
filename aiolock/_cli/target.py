"""What the ``aiolock`` command talks to: one Redis server, or a Redis Cluster.

:func:`connect` asks the server whether it is a cluster node (``HELLO``'s mode, the check
:func:`aiolock._redis.cluster.refuse_cluster_node` makes) and then uses a ``RedisCluster``
client: :func:`list_objects` reads every primary, :func:`describe_name` the primary that
owns the name's slot (every key of one name shares it). :func:`mask` hides the URL's
password in anything printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot
from redis.exceptions import AuthenticationError, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from aiolock._cli.inspect import (
    LockInfo,
    describe,
    find_objects,
    glob_escape,
    lock_key,
    parse_key,
    read_objects,
    resolve,
    scan,
    sort_objects,
)
from aiolock._keys import IDENTITY_TAG, split_key
from aiolock._redis.cluster import _server_mode

__all__ = [
    "HINT_SCAN_LIMIT",
    "RESCAN_INTERVAL",
    "ShardedWatch",
    "Target",
    "Unreachable",
    "connect",
    "describe_name",
    "hint",
    "list_objects",
    "mask",
]

#: keys the hint for an empty prefix looks at, at most per node (SCAN, never KEYS)
HINT_SCAN_LIMIT = 20_000
#: seconds between two scans of every primary by ``watch`` on a cluster (new objects)
RESCAN_INTERVAL = 2.0
#: seconds ``watch`` on a cluster sleeps when no node had a message
_POLL_INTERVAL = 0.05


class Unreachable(Exception):
    """Redis could not be reached: reported as one line, exit status 2."""


def mask(text: str, url: str) -> str:
    """*text* with *url* shown without its password, and the password itself hidden
    wherever else it appears (an error message that repeats it)."""
    secrets = _secrets(url)
    text = text.replace(url, _masked_url(url))
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _secrets(url: str) -> set[str]:
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return set()
    found = set()
    if password:
        found |= {password, unquote(password)}
    for pair in parts.query.split("&"):
        name, _, value = pair.partition("=")
        if name == "password" and value:
            found |= {value, unquote(value)}
    return found


def _masked_url(url: str) -> str:
    try:
        parts = urlsplit(url)
        if parts.password is None and "password=" not in parts.query:
            return url
        netloc = parts.netloc
        if parts.password is not None:
            user = quote(parts.username or "", safe="")
            netloc = f"{user}:***@{netloc.rpartition('@')[2]}"
        query = "&".join(
            "password=***" if pair.startswith("password=") else pair
            for pair in parts.query.split("&")
        )
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        return "<the url given>"


@dataclass
class Target:
    """What the command talks to: one server, or a Redis Cluster and its primaries."""

    redis: Redis
    cluster: RedisCluster | None = None
    #: clients of the cluster's primaries, by node name (made on first use)
    nodes: dict[str, Redis] = field(default_factory=dict)

    @property
    def client(self) -> Redis | RedisCluster:
        """The client a LockManager gets."""
        return self.cluster if self.cluster is not None else self.redis

    def primaries(self) -> list[Redis]:
        """A client per primary (the one server when it is not a cluster)."""
        if self.cluster is None:
            return [self.redis]
        return [self.node(node) for node in self.cluster.get_primaries()]

    def owner(self, prefix: str, name: str) -> Redis:
        """The client of the node that holds every key of *name* (they share one slot)."""
        if self.cluster is None:
            return self.redis
        # the slot of a real key, so that Redis's hash tag rule (first "{" to the next
        # "}") is applied as the server applies it, whatever the name holds
        slot = key_slot(lock_key(prefix, "lock", name).encode("utf-8"))
        return self.node(self.cluster.nodes_manager.get_node_from_slot(slot))

    def node(self, node: ClusterNode) -> Redis:
        client = self.nodes.get(node.name)
        if client is None:
            pool = ConnectionPool(connection_class=node.connection_class, **node.connection_kwargs)
            client = self.nodes[node.name] = Redis(connection_pool=pool)
        return client

    async def aclose(self) -> None:
        for client in self.nodes.values():
            await client.aclose()
        if self.cluster is not None:
            await self.cluster.aclose()
        await self.redis.aclose()


@contextlib.asynccontextmanager
async def connect(url: str) -> AsyncIterator[Target]:
    """The server at *url*, as a cluster when it says it is a Redis Cluster node."""
    try:
        redis = Redis.from_url(url)
    except ValueError as exc:  # not a redis URL at all
        raise Unreachable(str(exc)) from None
    target = Target(redis)
    try:
        try:
            await redis.ping()
            if await _is_cluster_node(redis):
                target.cluster = RedisCluster.from_url(url)
                await target.cluster.initialize()
        except AuthenticationError:
            raise  # reached, but refused: an error reply (exit 3), not "cannot reach"
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise Unreachable(str(exc) or type(exc).__name__) from None
        yield target
    finally:
        await target.aclose()


async def _is_cluster_node(redis: Redis) -> bool:
    """Whether the server is a Redis Cluster node (``HELLO``'s mode, as the manager checks)."""
    try:
        hello = await redis.execute_command("HELLO")  # type: ignore[no-untyped-call]
    except RedisError:  # a Redis older than 6.2: no HELLO, and no cluster to worry about
        return False
    return _server_mode(hello) == "cluster"


async def list_objects(target: Target, prefix: str) -> list[LockInfo]:
    """Every lock object under *prefix*: on a cluster, from every primary."""
    if target.cluster is None:
        return await scan(target.redis, prefix)
    infos: list[LockInfo] = []
    for node in target.primaries():
        infos += await read_objects(node, prefix, await find_objects(node, prefix), sharded=True)
    # each primary's objects are sorted: sort the merged list as one server's would be
    order = {obj: n for n, obj in enumerate(sort_objects((o.kind, o.name) for o in infos))}
    infos.sort(key=lambda info: order[(info.kind, info.name)])
    return await resolve(target.cluster, prefix, infos)


async def describe_name(target: Target, prefix: str, name: str) -> list[LockInfo]:
    """Every object under *name*, read on the node that owns its slot."""
    if target.cluster is None:
        return await describe(target.redis, prefix, name)
    node = target.owner(prefix, name)
    return await describe(node, prefix, name, sharded=True, identities=target.cluster)


async def hint(target: Target, prefix: str) -> str | None:
    """Which other prefixes hold aiolock keys (a mistyped ``--prefix`` is the usual
    reason for an empty list), as a line to print; None if none is found. Looks at
    :data:`HINT_SCAN_LIMIT` keys per node at most, and names ten prefixes at most."""
    found: set[str] = set()
    for node in target.primaries():
        cursor, seen = 0, 0
        while True:
            cursor, keys = await node.scan(cursor, match="*:*:{*", count=1000)
            seen += len(keys)
            for raw in keys:
                text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
                split = split_key(text)
                if split is not None and split[1] != IDENTITY_TAG and split[0] != prefix:
                    found.add(split[0])
            if cursor == 0 or seen >= HINT_SCAN_LIMIT or len(found) >= 10:
                break
    if not found:
        return None
    others = ", ".join(repr(p) for p in sorted(found))
    return f"no locks under the prefix {prefix!r}; aiolock keys exist under {others}: pass --prefix"


class ShardedWatch:
    """The release channels of every object under a prefix of a Redis Cluster, as
    ``watch`` follows them.

    aiolock announces releases there with SPUBLISH, and sharded pub/sub has no pattern
    subscription: each channel is SSUBSCRIBEd, one per command (a cluster refuses
    channels of two slots in one), on a connection to the primary that owns its slot. The
    channels are those of the objects a SCAN of every primary finds, repeated every
    :data:`RESCAN_INTERVAL` s to pick up new ones; a channel stays subscribed once found
    (a lock's key is gone between its holds), and one whose slot moves away (the server
    says so with a pushed SUNSUBSCRIBE) is subscribed again where the next scan finds it.
    """

    def __init__(self, target: Target, prefix: str) -> None:
        assert target.cluster is not None
        self._target = target
        self._cluster = target.cluster
        self._prefix = prefix
        #: node name -> its pub/sub connection, and the channels subscribed on it
        self._pubsubs: dict[str, PubSub] = {}
        self._channels: dict[str, set[str]] = {}
        self._next_scan = 0.0

    async def get(self, timeout: float) -> dict[str, Any] | None:
        """The next release message (``smessage``) of any node within *timeout* s, or None."""
        end = time.monotonic() + timeout
        while True:
            if time.monotonic() >= self._next_scan:
                await self.rescan()
                self._next_scan = time.monotonic() + RESCAN_INTERVAL
            for name, pubsub in list(self._pubsubs.items()):
                message = await self._poll(name, pubsub)
                if message is not None:
                    return message
            left = end - time.monotonic()
            if left <= 0:
                return None
            await asyncio.sleep(min(_POLL_INTERVAL, left))

    async def rescan(self) -> None:
        """SSUBSCRIBE the channels of the objects found on each primary since last time."""
        for node in self._cluster.get_primaries():
            client = self._target.node(node)
            subscribed = self._channels.setdefault(node.name, set())
            for channel in sorted(await release_channels(client, self._prefix) - subscribed):
                pubsub = self._pubsubs.get(node.name)
                if pubsub is None:
                    pubsub = self._pubsubs[node.name] = client.pubsub()
                await pubsub.ssubscribe(channel)
                subscribed.add(channel)

    async def _poll(self, name: str, pubsub: PubSub) -> dict[str, Any] | None:
        try:
            message: dict[str, Any] | None = await pubsub.get_message(timeout=0.0)
        except ResponseError:
            # MOVED for an SSUBSCRIBE: the slot moved between the scan and it; the next
            # scan finds the object on its new node and subscribes there
            return None
        if message is None:
            return None
        kind, channel = _text(message.get("type")), _text(message.get("channel"))
        if kind == "smessage":
            return message
        if kind == "sunsubscribe":
            # pushed by the server: the slot left this node (a migration, a failover)
            self._channels.get(name, set()).discard(channel)
            pubsub.shard_channels.pop(channel.encode("utf-8"), None)
            pubsub.shard_channels.pop(channel, None)
        return None

    async def aclose(self) -> None:
        for pubsub in self._pubsubs.values():
            await pubsub.aclose()  # type: ignore[no-untyped-call]


async def release_channels(redis: Redis, prefix: str) -> set[str]:
    """The release channel of every object with a key under *prefix* on *redis* (any of
    its keys: a lock's fencing state outlives its hold, so a lock just released counts)."""
    found: set[str] = set()
    async for raw in redis.scan_iter(match=f"{glob_escape(prefix)}:*", count=500):
        parsed = parse_key(prefix, _text(raw))
        if parsed is not None:
            found.add(f"{lock_key(prefix, parsed[0], parsed[1])}:released")
    return found


def _text(value: Any) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)
