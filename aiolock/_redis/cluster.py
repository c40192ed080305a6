"""The door to a Redis Cluster: each command goes to the primary that owns its keys' slot.

:class:`ClusterClient` has the interface the engine and the kinds use (:meth:`run`,
:meth:`call`, :meth:`aclose`, the counters), so nothing above it knows the topology. Every
key and the channel of one lock share one slot (:attr:`aiolock._keys.LockKeys.slot`), so
every script runs whole on one node.

Per primary it keeps one single-node :class:`~aiolock._redis.client.Client` over a
``redis.asyncio.Redis`` of its own, connected to that node with the cluster client's
connection settings: commands to one node get the single-node fast path (its RESP
encoding, hiredis reads and pipelining of concurrent commands), and NOSCRIPT on a node
that never saw a script (a new primary after a failover) is handled there, by loading
it on that node and sending the command again.

The manager's ``max_in_flight`` is shared by the primaries' clients (see
:meth:`ClusterClient._per_node`). A command whose first key ran a command before goes
straight to that node's client (:meth:`ClusterClient._remember`); the others look their
slot up in the map first.

The slot map is redis-py's (``RedisCluster.nodes_manager``), refreshed when a node says
the slot moved (which forgets every remembered route):

* ``MOVED``: the slot has a new owner; refresh the map and send the command there;
* ``ASK``: the slot is being migrated and the keys are on the importing node; send
  ``ASKING`` and the command there, in one round trip on one connection;
* ``TRYAGAIN`` (a migration left the keys of a multi-key command on two nodes),
  ``CLUSTERDOWN``/``MASTERDOWN`` (a failover in progress): wait a little, refresh, retry;
* a connection error (after the node's client retried once on a fresh connection):
  refresh the map and retry once if the slot has another owner now.

All of these are bounded: :data:`MAX_REDIRECTS` redirects, and :data:`RETRY_WINDOW`
seconds of retries with backoff. During a migration Redis answers TRYAGAIN to any
multi-key command whose keys are not all present on the node asked, and aiolock's
scripts always name a key that does not exist yet (a void marker, a tombstone): so
acquisitions and releases of locks in a slot being migrated wait for the migration to
finish (single-key reads and renewals follow ASK). Every command aiolock sends is
idempotent or protected by a void marker, so a resend is safe.

Scripts publish release messages with ``SPUBLISH`` here (sharded pub/sub, received on
the node that owns the channel's slot), and count listeners with ``PUBSUB SHARDNUMSUB``:
:func:`sharded` derives that variant of each script once.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import anyio
from redis import exceptions as rex
from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot

from aiolock._errors import LockBackendError, LockConnectionError, LockError
from aiolock._redis.client import Arg, Client, as_text, translate
from aiolock._redis.reach import describe
from aiolock._redis.scripts import Script

__all__ = [
    "MAX_REDIRECTS",
    "RETRY_WINDOW",
    "ClusterClient",
    "check_cluster_support",
    "is_cluster",
    "refuse_cluster_node",
    "sharded",
]

#: the most MOVED/ASK redirects one command follows
MAX_REDIRECTS = 16
#: seconds one command keeps being retried while the cluster answers TRYAGAIN (a slot
#: migration in progress), CLUSTERDOWN or MASTERDOWN (a failover in progress)
RETRY_WINDOW = 5.0
#: first and largest pause between retries of a command the cluster cannot take yet
_BACKOFF_START, _BACKOFF_MAX = 0.01, 0.25

#: Commands that name no key and may go to any primary.
_ANY_NODE = frozenset({"PING"})

_SHARDED: dict[str, Script] = {}

#: the error of a try on a remembered route, and the node client it was sent to
_Failed = tuple[LockError, Client]


def sharded(script: Script) -> Script:
    """*script* publishing with SPUBLISH and counting listeners with PUBSUB SHARDNUMSUB.

    Derived from the ``.lua`` file by replacing the two calls, so the scripts are written
    once; the derived source has its own SHA1, loaded on demand like any script.
    """
    derived = _SHARDED.get(script.name)
    if derived is None:
        source = script.source.replace("redis.call('publish',", "redis.call('spublish',")
        source = source.replace("'pubsub', 'numsub'", "'pubsub', 'shardnumsub'")
        derived = Script.__new__(Script)
        derived.name = f"{script.name} (sharded)"
        derived.what = script.what
        derived.source = source
        derived.sha = hashlib.sha1(source.encode("utf-8")).hexdigest()
        derived.writes = script.writes
        _SHARDED[script.name] = derived
    return derived


def is_cluster(redis: object) -> bool:
    return isinstance(redis, RedisCluster)


#: the oldest redis-py with sharded pub/sub in its asyncio client (PubSub.ssubscribe came
#: in 8.0; 8.0.1 fixed its pub/sub reads timing out): what cluster support needs
MIN_REDIS_PY = "8.0.1"


def check_cluster_support() -> None:
    """Fail with the redis-py version needed if this one lacks what cluster support uses."""
    if not hasattr(PubSub, "ssubscribe"):
        import redis

        raise TypeError(
            f"aiolock's Redis Cluster support needs redis-py >= {MIN_REDIS_PY}, for sharded "
            f"pub/sub in its asyncio client (PubSub.ssubscribe), which redis-py "
            f"{redis.__version__} lacks; upgrade it (pip install -U 'redis>={MIN_REDIS_PY}'), "
            "or use a single Redis server"
        )


#: seconds open() waits for a plain client's server to say whether it is a Cluster node
MODE_CHECK_TIMEOUT = 5.0


async def refuse_cluster_node(client: Client) -> None:
    """Refuse a plain client whose server is a Redis Cluster node (when the manager opens).

    Such a client works for the locks whose slots that node owns, until a renewal batch
    spans slots (CROSSSLOT): every hold of the batch is then lost. ``HELLO`` without
    arguments changes nothing on the connection, names the server's mode, and is a
    command an ACL user of aiolock already has. A server that cannot answer within
    :data:`MODE_CHECK_TIMEOUT` (down, or older than Redis 6.2: an error reply) is not
    refused here: whether it is reachable is not this check's question.
    """
    reply: Any = None
    with contextlib.suppress(LockError), anyio.move_on_after(MODE_CHECK_TIMEOUT):
        reply = await client.call("HELLO")
    if _server_mode(reply) != "cluster":
        return
    raise LockBackendError(
        f"the Redis server at {describe(client.redis)} is a node of a Redis Cluster, and a "
        "plain redis.asyncio.Redis client talks to that one node only: locks whose slots "
        "other nodes own would fail with MOVED, and renewals with CROSSSLOT. Pass a "
        "redis.asyncio.cluster.RedisCluster client to LockManager, or use "
        "LockManager.from_url(url, cluster=True)."
    )


def _server_mode(hello: Any) -> str | None:
    """The ``mode`` of a HELLO reply: a map (RESP3) or a flat list of pairs (RESP2)."""
    if isinstance(hello, list):
        hello = dict(zip(hello[::2], hello[1::2], strict=False))
    if not isinstance(hello, dict):
        return None
    for name, value in hello.items():
        if as_text(name) == "mode":
            return as_text(value)
    return None


def _cause(exc: BaseException) -> BaseException | None:
    """The redis-py error behind one of ours (``translate`` chains it)."""
    return exc.__cause__


class ClusterClient:
    """Runs aiolock's scripts and commands on a ``redis.asyncio.cluster.RedisCluster``.

    Args:
        cluster: the cluster client; its slot map and connection settings are used, its
            own command path is not (aiolock keeps a client per primary).
        command_timeout: as for :class:`~aiolock._redis.client.Client`, per node round trip.
        max_in_flight: commands or pipelines in flight at once, shared by the primaries
            (see :meth:`_per_node`).
    """

    #: renewal batches never span slots (a script may touch one slot only)
    cluster = True

    def __init__(
        self,
        cluster: RedisCluster,
        command_timeout: float | None = None,
        max_in_flight: int = 3,
    ) -> None:
        self.redis = cluster
        self.command_timeout = command_timeout
        self.max_in_flight = max_in_flight
        #: node name ("host:port") -> the client of that node (made on first use)
        self._nodes: dict[str, Client] = {}
        self._initialized = False
        self._refreshing: asyncio.Task[None] | None = None
        #: counters of node clients dropped since (so statistics never go backwards)
        self._retired = [0, 0, 0, 0]
        #: first key of a command -> the client of the node that last ran a command on it
        #: (see _remember); emptied whenever the slot map is reloaded
        self._routes: dict[str, Client] = {}
        #: MOVED/ASK replies followed (ASK also counted alone), slot map refreshes,
        #: retries after TRYAGAIN etc.
        self.redirects = 0
        self.asks = 0
        self.refreshes = 0
        self.retries = 0

    # -- the interface the engine and the kinds use ----------------------------------

    @property
    def round_trips(self) -> int:
        return self._retired[0] + sum(c.round_trips for c in self._nodes.values())

    @property
    def pipelines(self) -> int:
        return self._retired[1] + sum(c.pipelines for c in self._nodes.values())

    @property
    def pipelined(self) -> int:
        return self._retired[2] + sum(c.pipelined for c in self._nodes.values())

    @property
    def connection_errors(self) -> int:
        return self._retired[3] + sum(c.connection_errors for c in self._nodes.values())

    def run(
        self, script: Script, keys: Sequence[str], args: Sequence[Arg]
    ) -> Coroutine[Any, Any, Any]:
        """EVALSHA the sharded variant of *script* on the primary owning *keys*' slot
        (awaitable; a plain function: no coroutine layer of its own on every call)."""
        return self._run(script, keys, args, False)

    def run_in_order(
        self, script: Script, keys: Sequence[str], args: Sequence[Arg]
    ) -> Coroutine[Any, Any, Any]:
        """:meth:`run` through the owning primary's ordered lane (Client.run_in_order)."""
        return self._run(script, keys, args, True)

    async def _run(
        self, script: Script, keys: Sequence[str], args: Sequence[Arg], ordered: bool
    ) -> Any:
        if not keys:
            raise LockError(f"the {script.name} script names no key: it cannot be routed")
        variant = _SHARDED.get(script.name) or sharded(script)
        key = keys[0]
        client = self._routes.get(key)
        if client is not None:  # the common case: straight to the node's client
            try:
                if ordered:
                    return await client.run_in_order(variant, keys, args)
                return await client.run(variant, keys, args)
            except LockError as exc:
                failed: _Failed | None = (exc, client)
        else:
            failed = None

        def send(client: Client) -> Awaitable[Any]:
            if ordered:
                return client.run_in_order(variant, keys, args)
            return client.run(variant, keys, args)

        command = ("EVALSHA", variant.sha, len(keys), *keys, *args)
        return await self._routed(key, send, command, variant, failed)

    async def call(self, *args: Arg, key: str | None = None) -> Any:
        """Send one plain command to the primary owning *key*'s slot (PING: any primary)."""
        if key is None:
            name = as_text(args[0]).upper()
            if name not in _ANY_NODE:
                raise LockError(
                    f"the {name} command names no key, so aiolock cannot tell which Redis "
                    "Cluster node it is for"
                )
            await self._ensure_map()
            node = self.redis.get_default_node() or self.redis.get_primaries()[0]
            return await self._client(node).call(*args)
        client = self._routes.get(key)
        if client is not None:
            try:
                return await client.call(*args, key=key)
            except LockError as exc:
                failed: _Failed | None = (exc, client)
        else:
            failed = None

        def send(client: Client) -> Coroutine[Any, Any, Any]:
            return client.call(*args, key=key)

        return await self._routed(key, send, tuple(args), None, failed)

    async def aclose(self) -> None:
        """Wait for the commands in flight and close the per-node clients."""
        refreshing = self._refreshing
        if refreshing is not None and not refreshing.done():
            refreshing.cancel()
            await asyncio.wait((refreshing,))
        self._routes = {}
        nodes, self._nodes = self._nodes, {}
        for client in nodes.values():
            await self._retire(client)

    # -- for the hub -------------------------------------------------------------------

    async def owner(self, slot: int) -> ClusterNode:
        """The primary that owns *slot*, by the current map."""
        await self._ensure_map()
        try:
            return self.redis.nodes_manager.get_node_from_slot(slot)
        except rex.SlotNotCoveredError as exc:
            raise LockConnectionError(
                f"no primary of the Redis Cluster serves slot {slot} now (a failover in "
                "progress, or slots left unassigned): try again later"
            ) from exc

    async def primary_clients(self) -> list[Client]:
        """The client of every primary of the current map: for the commands that read
        every node, not a slot (the SCAN of :mod:`aiolock._redis.layout`)."""
        await self._ensure_map()
        return [self._client(node) for node in self.redis.get_primaries()]

    def node_redis(self, node: ClusterNode) -> Redis:
        """The plain client of *node* (its pool also serves the hub's pub/sub connections)."""
        return self._client(node).redis

    async def refresh(self) -> None:
        """Reload the slot map from the cluster (one reload for concurrent callers)."""
        task = self._refreshing
        if task is None or task.done():
            task = self._refreshing = asyncio.get_running_loop().create_task(self._reload())
        # Shielded: one caller's cancellation must not abort the reload the others await.
        await asyncio.shield(task)

    # -- routing -----------------------------------------------------------------------

    async def _routed(
        self,
        key: str,
        send: Callable[[Client], Awaitable[Any]],
        command: tuple[Arg, ...],
        script: Script | None,
        failed: _Failed | None = None,
    ) -> Any:
        """Send *command* to the owner of *key*'s slot, following redirects and riding out
        migrations and failovers (see the module docstring).

        *failed* is the error of a first try on a remembered route (see :attr:`_routes`)
        and the node client it went to: it is handled here like any failed try.
        """
        slot = key_slot(key.encode("utf-8"))
        backoff = _BACKOFF_START
        redirects = 0
        reloaded = False
        retry_until: float | None = None
        ask: rex.AskError | None = None
        sent_to: Client | None = None  # the owner's client of the last try (not ASK's)
        if failed is not None:
            error, sent_to = failed
        while True:
            if failed is None:
                try:
                    if ask is not None:
                        target, ask = ask, None
                        return await self._ask(target, command, script, key)
                    sent_to = self._client(await self.owner(slot))
                    reply = await send(sent_to)
                    self._remember(key, sent_to)
                    return reply
                except LockError as exc:
                    error = exc
            failed = None
            cause = _cause(error)
            if isinstance(cause, rex.AskError):  # MOVED is a subclass of ASK
                redirects += 1
                self.redirects += 1
                if redirects > MAX_REDIRECTS:
                    raise self._redirected(command, script, error) from error
                if isinstance(cause, rex.MovedError):
                    await self.refresh()
                else:
                    self.asks += 1
                    ask = cause
                continue
            if isinstance(
                cause,
                (
                    rex.TryAgainError,
                    rex.ClusterDownError,
                    rex.MasterDownError,
                    rex.SlotNotCoveredError,
                ),
            ) or _is_loading(cause):
                # A migration in progress (a multi-key command whose keys are not all
                # on one node yet: Redis answers TRYAGAIN until it completes) or a
                # failover: wait, with backoff, for up to RETRY_WINDOW seconds.
                now = asyncio.get_running_loop().time()
                if retry_until is None:
                    retry_until = now + RETRY_WINDOW
                elif now > retry_until:
                    raise self._redirected(command, script, error) from error
                self.retries += 1
                await asyncio.sleep(backoff * (0.5 + random.random()))
                backoff = min(backoff * 2, _BACKOFF_MAX)
                await self.refresh()
                continue
            if (
                isinstance(error, LockConnectionError)
                and isinstance(cause, (rex.ConnectionError, OSError))
                and not isinstance(cause, TimeoutError)  # out of time: not retried
                and not reloaded
            ):
                # The node's client already retried once on a fresh connection: the
                # node is gone or unreachable. If the map says another node owns the
                # slot now (a failover), send it there; else report the failure.
                reloaded = True
                self.retries += 1
                await self.refresh()
                if self._nodes.get((await self.owner(slot)).name) is not sent_to:
                    continue
            raise error

    #: keys remembered in :attr:`_routes`: lock keys repeat on every command, void markers
    #: never come first; it is simply emptied when full (a miss costs one map lookup)
    ROUTES_MAX = 4096

    def _remember(self, key: str, client: Client) -> None:
        """Send the next commands on *key* straight to *client* (the node that just ran one).

        The route skips the slot's CRC16, the map lookup and two coroutine layers of
        :meth:`_routed` per command. It needs no other invalidation than emptying it with
        each map reload: a command on a stale route (the slot moved, or its node failed
        over) gets MOVED or a connection error from that node, which :meth:`_routed`
        handles as for any try, reloading the map.
        """
        if not any(mine is client for mine in self._nodes.values()):
            return  # retired by a map reload while the command was in flight
        routes = self._routes
        if len(routes) >= self.ROUTES_MAX:
            routes.clear()
        routes[key] = client

    def _redirected(
        self, command: tuple[Arg, ...], script: Script | None, last: LockError
    ) -> LockConnectionError:
        return LockConnectionError(
            f"the Redis Cluster kept redirecting {_what(command, script)} or answering "
            f"that it cannot take it yet (last: {last}); the cluster may be resharding or "
            "failing over: try again later"
        )

    async def _ask(
        self, ask: rex.AskError, command: tuple[Arg, ...], script: Script | None, key: str
    ) -> Any:
        """Send ASKING + *command* on one connection of the importing node.

        Error replies are raised as our errors chained to redis-py's, as the node
        clients raise them, so that the caller's loop handles them alike.
        """
        node = self.redis.nodes_manager.get_node(host=ask.host, port=ask.port)
        if node is None:
            node = ClusterNode(ask.host, ask.port, **self.redis.nodes_manager.connection_kwargs)
        client = self._client(node)
        what = _what(command, script)
        changes = script is not None and script.writes
        try:
            if script is not None:
                # The importing node may never have seen the script: load it first, so
                # the EVALSHA after ASKING cannot answer NOSCRIPT (a retry would lose
                # ASKING).
                (loaded,) = await client._exchange([("SCRIPT", "LOAD", script.source)], [None])
                if isinstance(loaded, rex.RedisError):
                    raise loaded
            _asking, reply = await client._exchange([("ASKING",), command], [None, None])
        except rex.RedisError as exc:
            raise translate(exc, what, key, changes=changes) from exc
        if isinstance(reply, rex.RedisError):
            raise translate(reply, what, key, changes=changes) from reply
        return reply

    def _client(self, node: ClusterNode) -> Client:
        client = self._nodes.get(node.name)
        if client is None:
            pool = ConnectionPool(
                connection_class=node.connection_class,
                max_connections=node.max_connections,
                **node.connection_kwargs,
            )
            redis = Redis(connection_pool=pool)
            client = self._nodes[node.name] = Client(redis, self.command_timeout, self._per_node())
        return client

    def _per_node(self) -> int:
        """The round trips one primary's client may have in flight: an equal share of
        :attr:`max_in_flight` (at least one), as the map counts primaries now.

        The manager's ``max_in_flight`` is its total, as on one server: with 3 per
        primary, the commands of 64 tasks went out in three times as many round trips
        of a third the size, and the client's CPU per command (a round trip costs a
        write, reads and event-loop turns) was what bounded W2 (~47 against
        ~62 us of client CPU per cycle with one per primary of three).
        """
        primaries = len(self.redis.get_primaries()) or 1
        return max(1, self.max_in_flight // primaries)

    async def _ensure_map(self) -> None:
        if not self._initialized:
            await self.refresh()

    async def _reload(self) -> None:
        self.refreshes += 1
        try:
            if not self._initialized:
                await self.redis.initialize()
            else:
                await self.redis.nodes_manager.initialize()
        except rex.RedisError as exc:
            raise translate(exc, "reading the Redis Cluster slot map", changes=False) from exc
        except rex.RedisClusterException as exc:  # e.g. no startup node could be reached
            raise LockConnectionError(
                f"could not read the Redis Cluster slot map: {exc}; check that the nodes "
                "given to RedisCluster are reachable"
            ) from exc
        self._initialized = True
        self._routes = {}  # remembered for the old map
        # Forget clients of nodes that left the cluster (their connections would fail).
        live = {node.name for node in self.redis.get_nodes()}
        for name in [n for n in self._nodes if n not in live]:
            await self._retire(self._nodes.pop(name))

    async def _retire(self, client: Client) -> None:
        for i, value in enumerate(
            (client.round_trips, client.pipelines, client.pipelined, client.connection_errors)
        ):
            self._retired[i] += value
        try:
            await client.aclose()
        finally:
            await client.redis.aclose()


def _is_loading(cause: BaseException | None) -> bool:
    return isinstance(cause, rex.BusyLoadingError)


def _what(command: tuple[Arg, ...], script: Script | None) -> str:
    if script is not None:
        return script.what
    return f"the {as_text(command[0])} command"
