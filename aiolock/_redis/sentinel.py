"""Sentinel: following a failover of the primary that a manager's client points at.

redis-py's ``Sentinel.master_for()`` client asks the sentinels for the primary when it
opens a connection, and moves a connection only when the old primary answers READONLY.
That is not enough for locks, measured with redis-server 7.0 and ``SENTINEL FAILOVER``:
the old and the new primary both answer as primary for about 10 s, so a kept connection
(aiolock keeps a few between round trips, plus one for pub/sub) goes on running lock
scripts on the old primary without any error, while other clients, freshly connected,
take the same locks on the new one.

So a manager on a Sentinel-managed client runs a :class:`PrimaryWatch`: it asks every
sentinel for the primary every :attr:`PrimaryWatch.INTERVAL` seconds and at once
whenever a sentinel announces ``+switch-master`` on its pub/sub channel, and follows the
newest configuration reported (see :meth:`PrimaryWatch._discover`). When the primary has
moved, it

1. records the new address in the pool (kept connections to the old one are then
   dropped when next used; see ``_client._current``) and closes every connection of the
   pool, idle, kept, in flight and pub/sub: commands in flight fail and are retried (or
   undone) on the new primary, and the hub resubscribes there and wakes its heads, which
   try again against the new primary;
2. re-checks every hold on the new primary at once (one renewal round): a hold the new
   primary does not have (its grant never replicated, or it was taken on the old
   primary after the switch) is lost, and its holder is told (``LockLostError``, body
   cancelled), as for any loss.

Between moves, every round also closes any connection of the pool open to a node that is
not the primary (one being opened as the primary moved may have reached the old one).

What remains (see ``docs/sentinel.md``): between the switch and its detection (up to
:attr:`PrimaryWatch.INTERVAL`, usually a pub/sub message away) this manager may still
write to the old primary, and two holders may then overlap until the re-check.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import anyio
from redis import exceptions as rex
from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool

from aiolock._redis.client import as_text

__all__ = ["PrimaryWatch", "check_sentinels", "is_sentinel_primary", "sentinel_client"]

logger = logging.getLogger("aiolock")

#: The sentinels' pub/sub channel announcing a new primary:
#: ``<service> <old ip> <old port> <new ip> <new port>``.
SWITCH_CHANNEL = "+switch-master"


class _NoAnswer:
    """A sentinel that could not be asked (unreachable, or too slow)."""


_NO_ANSWER = _NoAnswer()


def is_sentinel_primary(redis: Redis) -> bool:
    """Whether *redis* is a ``Sentinel.master_for()`` client (a primary's pool)."""
    pool = redis.connection_pool
    return isinstance(pool, SentinelConnectionPool) and pool.is_master


def check_sentinels(sentinels: object, service_name: object) -> list[tuple[str, int]]:
    """Validate ``from_sentinel()``'s addresses and service name; the addresses as a list."""
    if not isinstance(service_name, str):
        raise TypeError(f"service_name must be a str, not {type(service_name).__name__}")
    if not service_name:
        raise ValueError("service_name must name the primary the sentinels monitor, not ''")
    if isinstance(sentinels, (str, bytes)) or not isinstance(sentinels, Sequence):
        raise TypeError(
            "sentinels must be a list of (host, port) pairs, e.g. "
            f"[('10.0.0.1', 26379), ('10.0.0.2', 26379)], not {sentinels!r}"
        )
    if not sentinels:
        raise ValueError("sentinels must list at least one (host, port) pair")
    checked: list[tuple[str, int]] = []
    for entry in sentinels:
        if not (isinstance(entry, (tuple, list)) and len(entry) == 2):
            raise TypeError(f"each sentinel must be a (host, port) pair, not {entry!r}")
        host, port = entry
        if not isinstance(host, str) or not host:
            raise TypeError(f"a sentinel's host must be a non-empty str, not {host!r}")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"a sentinel's port must be an int in 1..65535, not {port!r}")
        checked.append((host, port))
    return checked


def sentinel_client(
    sentinels: list[tuple[str, int]],
    service_name: str,
    sentinel_kwargs: Mapping[str, Any] | None,
    connection_kwargs: dict[str, Any],
) -> Redis:
    """``Sentinel(sentinels, ...).master_for(service_name)``, its options checked now."""
    if sentinel_kwargs is not None and not isinstance(sentinel_kwargs, Mapping):
        raise TypeError(f"sentinel_kwargs must be a dict, not {type(sentinel_kwargs).__name__}")
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        sentinels,
        sentinel_kwargs=None if sentinel_kwargs is None else dict(sentinel_kwargs),
        **connection_kwargs,
    )
    redis: Redis = sentinel.master_for(service_name)
    try:
        # Builds a connection object without connecting: an unknown option fails here,
        # at the call, rather than at the first acquire.
        redis.connection_pool.make_connection()  # type: ignore[no-untyped-call]
    except TypeError as exc:
        raise TypeError(
            f"LockManager.from_sentinel() got an option that redis-py's connections do not "
            f"take ({exc}); the manager's own options are listed in its docstring, the rest "
            "go to redis.asyncio.sentinel.Sentinel(...) and on to each connection"
        ) from None
    return redis


class PrimaryWatch:
    """Follows the primary of a Sentinel-managed client; see the module docstring."""

    #: seconds between two questions to the sentinels (a +switch-master message is
    #: acted on at once; this is the fallback if the message is missed)
    INTERVAL = 1.0
    #: the longest the re-check of the holds on a new primary is retried
    CONFIRM_FOR = 10.0
    #: seconds one sentinel may take to answer
    ASK_TIMEOUT = 1.0

    def __init__(
        self,
        redis: Redis,
        recheck_holds: Callable[[], Awaitable[bool]],
        *,
        owns_sentinels: bool = False,
    ) -> None:
        """*recheck_holds*: one renewal round over every hold of the manager (its
        watchdog's), True once Redis answered; run on the new primary after a move."""
        pool = redis.connection_pool
        if not isinstance(pool, SentinelConnectionPool):
            raise TypeError("PrimaryWatch needs a Sentinel.master_for() client")
        self._pool = pool
        self._sentinel: Sentinel = pool.sentinel_manager
        self._service = pool.service_name
        self._recheck_holds = recheck_holds
        self._owns_sentinels = owns_sentinels
        self._check = anyio.Event()
        #: the primary as last seen by this watch
        self.primary: tuple[str, int] | None = None
        #: moves of the primary acted on
        self.failovers = 0
        #: the last round reached no sentinel at all (not: they said the primary is down)
        self._no_sentinel = False
        # redis-py asks the sentinels whenever the pool opens a connection, and fails it if
        # none answers; with every sentinel gone, new connections go to the primary last
        # seen instead (see _master_address), restored when the watch ends.
        self._lookup = pool.get_master_address
        pool.get_master_address = self._master_address  # type: ignore[method-assign]

    async def _master_address(self) -> tuple[str, int]:
        """The pool's lookup, falling back to the primary last seen when no sentinel can be
        reached: locks go on working on it (a partition that also hides a failover is
        what ``min-replicas-to-write`` guards against; see docs/sentinel.md)."""
        known = self.primary
        if self._no_sentinel and known is not None:
            # Known unreachable (the watch asks again every second): asking them here
            # would cost every new connection redis-py's retries on each sentinel.
            return known
        if known is None:
            return await self._lookup()  # type: ignore[no-untyped-call,no-any-return]
        try:
            # Bounded like one of the watch's own questions: until the watch's next round
            # has found every sentinel gone, redis-py's lookup would retry each of them
            # (about 10 s for three with redis-py 8), however short the caller's timeout.
            return await asyncio.wait_for(self._lookup(), self.ASK_TIMEOUT)  # type: ignore[no-untyped-call]
        except asyncio.TimeoutError:
            pass  # no sentinel answered in the time the watch gives one
        except MasterNotFoundError:
            # Either the sentinels answer that no primary is usable, or none could be
            # reached (redis-py without retries fails at once): ask them all as the watch
            # does, each bounded, to tell which.
            await self._discover()
            if not self._no_sentinel:
                raise  # sentinels answer that there is no usable primary: fail, retry
        self._check.set()  # the watch asks them all now, and moves us if need be
        return known

    async def run(self) -> None:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._poll, name="aiolock sentinel poll")
                for client in list(self._sentinel.sentinels):
                    tg.start_soon(self._listen, client, name="aiolock sentinel listener")
        finally:
            # The client may outlive the manager: give its pool redis-py's lookup back.
            vars(self._pool).pop("get_master_address", None)
            if self._owns_sentinels:
                with anyio.CancelScope(shield=True), anyio.move_on_after(2.0):
                    for client in self._sentinel.sentinels:
                        await client.aclose()

    async def _poll(self) -> None:
        while True:
            # A fresh event before asking: a +switch-master that arrives while the
            # sentinels are being asked makes the next round start at once.
            self._check = anyio.Event()
            try:
                address = await self._discover()
                if address is not None:
                    await self._seen(address)
            except Exception as exc:  # never let the watch fail the manager
                logger.warning("following the Sentinel primary failed, will retry: %r", exc)
            with anyio.move_on_after(self.INTERVAL):
                await self._check.wait()

    async def _discover(self) -> tuple[str, int] | None:
        """The primary in the newest configuration any sentinel reports, or None.

        Every sentinel is asked: during a failover the leader keeps reporting the old
        primary until it has reconfigured the replicas (a second here), while the others
        already report the new one (see :meth:`_ask`). redis-py's own lookup,
        made whenever a connection opens, takes the first valid answer in list order,
        so the sentinel with the newest configuration is moved to the front (as redis-py
        itself reorders the list), and connections opened from now on go to the new
        primary too.
        """
        clients = list(self._sentinel.sentinels)
        answers = await asyncio.gather(*(self._ask(client) for client in clients))
        self._no_sentinel = all(answer is _NO_ANSWER for answer in answers)
        best: tuple[tuple[int, bool], tuple[str, int], Redis] | None = None
        for client, answer in zip(clients, answers, strict=True):
            if isinstance(answer, tuple) and (best is None or answer[0] > best[0]):
                best = (answer[0], answer[1], client)
        if best is None:
            return None
        order = self._sentinel.sentinels
        if best[2] in order and order[0] is not best[2]:
            i = order.index(best[2])
            order[0], order[i] = order[i], order[0]
        return best[1]

    async def _ask(
        self, client: Redis
    ) -> tuple[tuple[int, bool], tuple[str, int]] | _NoAnswer | None:
        """The rank and address of the primary as one sentinel sees it, if valid
        (``None`` if not; ``_NO_ANSWER`` if the sentinel could not be asked).

        The rank is the config epoch, then whether the sentinel is not in the middle of a
        failover: the leader already reports the new epoch with the old primary until it
        has reconfigured the replicas, while the others report the new primary.
        """
        try:
            state = await asyncio.wait_for(client.sentinel_master(self._service), self.ASK_TIMEOUT)
        except (rex.RedisError, OSError, asyncio.TimeoutError) as exc:
            logger.debug("asking a sentinel for %r failed: %s", self._service, exc)
            return _NO_ANSWER
        # The checks redis-py's discover_master makes.
        if (
            not isinstance(state, dict)
            or not state.get("is_master")
            or state.get("is_sdown")
            or state.get("is_odown")
            or int(state.get("num-other-sentinels", 0)) < self._sentinel.min_other_sentinels
        ):
            return None
        host = getattr(self._sentinel, "_force_master_ip", None) or as_text(state["ip"])
        flags = state.get("flags", "")
        flags = ",".join(map(as_text, flags)) if isinstance(flags, (set, list)) else as_text(flags)
        rank = (int(state.get("config-epoch", 0)), "failover_in_progress" not in flags)
        return rank, (host, int(state["port"]))

    async def _listen(self, client: Redis) -> None:
        """Wake the poll on a sentinel's +switch-master for our service."""
        backoff = 0.1
        while True:
            pubsub: PubSub = client.pubsub()
            try:
                await pubsub.subscribe(SWITCH_CHANNEL)
                backoff = 0.1
                while True:
                    message = await pubsub.get_message(timeout=30.0)
                    if message is None or as_text(message.get("type")) != "message":
                        continue
                    if as_text(message.get("data")).split(" ", 1)[0] == self._service:
                        self._check.set()
            except Exception as exc:  # RedisError, OSError, redis-py's RuntimeError...
                logger.debug("sentinel pub/sub connection failed: %r", exc)
            finally:
                with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
            await anyio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    async def _seen(self, address: tuple[str, int]) -> None:
        """The sentinels name *address* as the primary: act if that is a move."""
        known, self.primary = self.primary, address
        recorded = self._pool.master_address  # what the pool last connected to
        if known is not None and known != address:
            await self._moved(known, address)
        elif recorded is not None and tuple(recorded) != address:
            # The pool's connections went to another node (opened before this watch
            # started, or from an answer of a sentinel that was behind).
            await self._moved(tuple(recorded), address)
        else:
            await self._sweep(address)

    async def _sweep(self, primary: tuple[str, int]) -> None:
        """Close any connection of the pool that is open to another server than *primary*.

        A connection that was being opened while the primary moved may have reached the
        old one (the hub's pub/sub connection, above all: it would listen there for
        releases that now happen elsewhere).
        """
        await self._close_connections(keep=primary, why="no longer the primary")

    async def _close_connections(self, keep: tuple[str, int], why: str) -> None:
        """Close the pool's connections, idle or in use, except those open to *keep*.

        Closed without waiting for the peer: a stopped server never finishes a close
        (redis-py's pool.disconnect() waits, and raises on a timeout). redis-py keeps a
        pool's connections in two private lists; if they are renamed, its
        pool.disconnect() is used instead, bounded in time.
        """
        pool = self._pool
        available = getattr(pool, "_available_connections", None)
        in_use = getattr(pool, "_in_use_connections", None)
        if available is None or in_use is None:  # pragma: no cover - other redis-py
            with anyio.move_on_after(2.0):
                await pool.disconnect(inuse_connections=True)
            return
        for conn in [*available, *in_use]:
            where = (getattr(conn, "host", None), getattr(conn, "port", None))
            if where == keep or not conn.is_connected:
                continue
            logger.info("closing a connection to %s:%s: %s", *where, why)
            try:
                await conn.disconnect(nowait=True)
            except Exception as exc:  # it is being dropped anyway
                logger.debug("closing a connection to %s:%s: %r", *where, exc)

    async def _moved(self, old: tuple[Any, ...], new: tuple[str, int]) -> None:
        self.failovers += 1
        logger.warning(
            "Sentinel service %r: the primary moved from %s:%s to %s:%s; reconnecting, and "
            "checking every hold on the new primary",
            self._service,
            *old[:2],
            *new,
        )
        # From here on, a kept connection to any other address is stale.
        self._pool.master_address = new
        # Every connection of the pool, in use or not, the hub's pub/sub one included.
        await self._close_connections(keep=new, why="the primary moved")
        await self._confirm_holds()

    async def _confirm_holds(self) -> None:
        give_up = time.monotonic() + self.CONFIRM_FOR
        while not await self._recheck_holds():
            if time.monotonic() > give_up:
                logger.warning("could not check the holds on the new primary; the watchdog retries")
                break
            await anyio.sleep(0.1)
