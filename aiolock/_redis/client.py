"""The one door to Redis: runs scripts and commands, and turns redis-py errors into ours.

Every command aiolock sends goes through :class:`Client`, so error translation, the
optional per-command time limit and EVALSHA's NOSCRIPT fallback live in one place. This
module does the round trips: RESP encoding, the connections kept between round trips,
their checks and time limits, and the retry after a dropped connection. What is sent
when, and in which pipeline, is :mod:`aiolock._redis.pipeline`'s; redis-py's errors
become ours in :mod:`aiolock._redis.translate`.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Coroutine, Sequence
from typing import Any, TypeVar

import anyio
from redis import exceptions as rex
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection

from aiolock._redis.pipeline import Arg, Pipelining
from aiolock._redis.reply import as_int, as_text
from aiolock._redis.translate import POOL_EXHAUSTED, is_permanent, key_type_error, translate
from aiolock._redis.transport import (
    RoundTripTimer,
    RoundTripTimers,
    exchange,
    fast_parser,
    where,
)

__all__ = [
    "POOL_EXHAUSTED",
    "Arg",
    "Client",
    "as_int",
    "as_text",
    "is_permanent",
    "key_type_error",
    "translate",
]

T = TypeVar("T")


#: RESP bulk strings of recent arguments: lock keys, channels, ids and numbers repeat on
#: every command, and encoding them dominated the client's profile. Unique values (owner
#: fields) churn through it; it is simply emptied when full.
_BULK: dict[Arg, bytes] = {}
_BULK_MAX = 4096


def _bulk(arg: Arg) -> bytes:
    data = arg.encode("utf-8") if type(arg) is str else arg
    if type(data) is not bytes:
        data = b"%d" % data if type(data) is int else repr(data).encode("ascii")
    encoded = b"$%d\r\n%s\r\n" % (len(data), data)
    if len(_BULK) >= _BULK_MAX:
        _BULK.clear()
    _BULK[arg] = encoded
    return encoded


def _pack(commands: Sequence[tuple[Arg, ...]]) -> bytes:
    """RESP-encode *commands* (arrays of bulk strings), ready to write in one go."""
    parts: list[bytes] = []
    known = _BULK.get
    for command in commands:
        parts.append(b"*%d\r\n" % len(command))
        # map() looks the arguments up without a Python-level call per argument
        encoded = [*map(known, command)]
        if None in encoded:  # some not encoded yet (a unique field, a void key)
            for i, found in enumerate(encoded):
                if found is None:
                    encoded[i] = _bulk(command[i])
        parts += encoded  # type: ignore[arg-type]  # (no None left in it)
    return b"".join(parts)


def _usable(conn: AbstractConnection) -> bool:
    """Whether a kept connection is still open (redis-py keeps its streams private).

    A connection the server closed (restart, CLIENT KILL, timeout) keeps an open transport
    once its end-of-file is read (asyncio half-closes), so that is checked too, as
    redis-py's pool does on checkout.
    """
    transport = getattr(getattr(conn, "_writer", None), "transport", None)
    reader = getattr(conn, "_reader", None)
    return (
        transport is not None
        and not transport.is_closing()
        and reader is not None
        and not reader.at_eof()
    )


def _current(pool: Any, conn: AbstractConnection) -> bool:
    """False for a connection to a Sentinel primary that a failover has replaced.

    Both the old and the new primary answer as primary for a while after a failover
    (about 10 s measured): a kept connection to the old one would keep running lock
    scripts there without any error, on data the new primary never sees. A Sentinel pool
    records the primary it last resolved (``master_address``; None once reset).
    """
    if not getattr(pool, "is_master", False) or not hasattr(pool, "master_address"):
        return True  # not a Sentinel primary pool
    primary = pool.master_address
    peer = (getattr(conn, "host", None), getattr(conn, "port", None))
    return primary is not None and tuple(primary) == peer


class Client(Pipelining):
    """Runs aiolock's scripts and commands on a ``redis.asyncio.Redis``.

    redis-py sends one command per connection at a time, so N concurrent commands would
    open N connections. Instead, at most *max_in_flight* commands or pipelines are in
    flight at once; a command that finds them all busy is queued, and what is queued is
    sent as pipelines of at most :attr:`MAX_BATCH` commands as soon as slots free up. A
    lone caller pays nothing for this: with a free slot its command is sent directly.

    Args:
        redis: the client; aiolock never changes its settings.
        command_timeout: seconds one command (or pipeline) may take before it fails with
            :class:`LockConnectionError`; ``None`` leaves it to the client's
            ``socket_timeout``.
        max_in_flight: commands or pipelines in flight at once (~ connections used).
    """

    #: one server: renewal batches may mix slots (see aiolock._redis.cluster for a cluster)
    cluster = False

    def __init__(
        self, redis: Redis, command_timeout: float | None = None, max_in_flight: int = 3
    ) -> None:
        self.redis = redis
        self.command_timeout = command_timeout
        # One connection of the pool is the hub's (pub/sub): never wait for more than the
        # pool can give, or a small pool would block commands until its timeout.
        capacity = getattr(redis.connection_pool, "max_connections", None)
        if isinstance(capacity, int) and capacity >= 2:
            max_in_flight = min(max_in_flight, capacity - 1)
        super().__init__(max_in_flight)
        #: a Sentinel primary's pool: connections may point at a replaced primary
        self._follows_primary = bool(getattr(redis.connection_pool, "is_master", False))
        #: connections kept between round trips (at most max_in_flight are ever in use)
        self._idle: list[AbstractConnection] = []
        #: round trips, pipelines sent, and commands sent in them (for statistics)
        self.round_trips = 0
        self.pipelines = 0
        self.pipelined = 0
        #: round trips that failed on a connection error (and were retried once)
        self.connection_errors = 0
        #: the one loop timer of the round trips' time limits (see RoundTripTimer); left
        #: as it is when the client closes, so a round trip still out stays bounded
        self._timers: RoundTripTimers | None = None

    async def aclose(self) -> None:
        """Wait for the pipelines in flight; fail what is still queued; give the kept
        connections back to the pool."""
        await super().aclose()
        idle, self._idle = self._idle, []
        for conn in idle:
            await self.redis.connection_pool.release(conn)

    async def _round_trip(self, commands: list[tuple[Arg, ...]]) -> list[Any]:
        """Write *commands* at once on one pooled connection and read their replies.

        This bypasses redis-py's command layer (its argument packing dominated the
        profile) and, where :mod:`._transport` can, its per-read time limit, but uses its
        pool, connections and reply parser. A dropped connection is retried once on a
        fresh one: every command aiolock sends is idempotent.
        """
        self.round_trips += 1
        if len(commands) > 1:
            self.pipelines += 1
            self.pipelined += len(commands)
        if self.redis.connection is not None:  # a single-connection client: its own path
            return await self._bounded(self._via_redis_py(commands))
        packed = _pack(commands)
        deadline = None
        if self.command_timeout is not None:  # one deadline for the round trip, retry included
            deadline = self._event_loop().time() + self.command_timeout
        try:
            return await self._attempt(packed, len(commands), deadline, kept=True)
        except (rex.ConnectionError, OSError) as exc:
            # TimeoutError is an OSError: a round trip out of time is not retried, nor is
            # a refused login (the next connection would be refused too).
            if isinstance(exc, (TimeoutError, rex.AuthenticationError)) or is_permanent(exc):
                raise
            self.connection_errors += 1
        # Whatever broke this connection (server restart, proxy or network drop) most
        # likely broke the kept idle ones too: retrying on one of them would fail the
        # same way. Drop them all and retry on a connection from the pool, which checks
        # or reconnects what it hands out.
        await self._drop_idle()
        return await self._attempt(packed, len(commands), deadline, kept=False)

    async def _attempt(
        self, packed: bytes, count: int, deadline: float | None, *, kept: bool
    ) -> list[Any]:
        """One try of a round trip on one connection (a kept one if *kept* allows)."""
        idle = self._idle
        if kept and idle and not self._follows_primary and _usable(idle[-1]):
            conn = idle.pop()  # (_checkout's common case, without its coroutine)
        else:
            conn = await self._checkout(deadline, kept=kept)
        reusable = False
        try:
            replies = await self._on(conn, packed, count, deadline)
            if self._follows_primary and not _current(self.redis.connection_pool, conn):
                # A Sentinel failover was detected while this ran (or the connection
                # opened just before): the replies came from the old primary. Retried.
                raise rex.ConnectionError(f"the primary moved away from {where(conn)}")
            reusable = True
            return replies
        except BaseException:
            await conn.disconnect(nowait=True)  # a reply may be pending: never reuse
            raise
        finally:
            if reusable:
                self._idle.append(conn)
            else:
                await self.redis.connection_pool.release(conn)

    async def _on(
        self, conn: AbstractConnection, packed: bytes, count: int, deadline: float | None
    ) -> list[Any]:
        """Send and read on *conn* within the round trip's time limit, if it has one.

        The limit is *deadline* (command_timeout) and, on the fast path, the connection's
        socket_timeout counted once for the whole round trip: redis-py counts it per read,
        and still does on the fallback path, so it is not armed twice there.
        """
        parser = fast_parser(conn)
        loop = self._event_loop()
        when, per_socket = deadline, False
        if parser is not None and conn.socket_timeout:
            socket_deadline = loop.time() + conn.socket_timeout
            if when is None or socket_deadline < when:
                when, per_socket = socket_deadline, True
        if when is None:
            return await self._talk(conn, parser, packed, count)
        timers = self._timers
        if timers is None or timers.loop is not loop:
            timers = self._timers = RoundTripTimers(loop)
        timer = RoundTripTimer(timers, when, conn)
        try:
            return await self._talk(conn, parser, packed, count)
        except Exception as exc:  # not CancelledError: the caller's cancellation wins
            if not timer.expired:
                raise
            # The timer aborted the transport; report what ran out, as before: redis-py's
            # TimeoutError for socket_timeout, ours (-> "command_timeout") for the other.
            if per_socket:
                raise rex.TimeoutError(f"Timeout reading from {where(conn)}") from exc
            raise TimeoutError from exc
        finally:
            timer.cancel()

    def _talk(
        self, conn: AbstractConnection, parser: Any, packed: bytes, count: int
    ) -> Coroutine[Any, Any, list[Any]]:
        if parser is None:
            return self._slow(conn, packed, count)
        return exchange(conn, parser, packed, count)

    async def _slow(self, conn: AbstractConnection, packed: bytes, count: int) -> list[Any]:
        """redis-py's own send and read, for connections the fast path does not cover."""
        await conn.send_packed_command(packed)
        replies: list[Any] = []
        for _ in range(count):
            try:
                replies.append(await conn.read_response())
            except rex.ResponseError as exc:  # an error reply: the stream is intact
                replies.append(exc)
        return replies

    async def _checkout(self, deadline: float | None, *, kept: bool) -> AbstractConnection:
        """A connection for one round trip: one of ours if idle (and *kept*), else the pool's.

        Up to *max_in_flight* connections are kept between round trips instead of going
        back to redis-py's pool each time; its bookkeeping cost as much as our own logic.
        """
        pool = self.redis.connection_pool
        while kept and self._idle:
            conn = self._idle.pop()
            if _usable(conn) and (not self._follows_primary or _current(pool, conn)):
                return conn
            # The server or the network closed it while it sat idle (redis-py's pool
            # checks for this on checkout; we must too). Writing to it would fail, on
            # Python 3.13 even with an AttributeError instead of a connection error.
            await conn.disconnect(nowait=True)
            await pool.release(conn)
        if deadline is None:
            return await pool.get_connection()  # type: ignore[no-untyped-call,no-any-return]
        # Opening a connection is part of the round trip's command_timeout (the round-trip timer
        # only covers the exchange); this path is rare, so a timeout context is fine here.
        remaining = deadline - asyncio.get_running_loop().time()
        return await self._bounded(pool.get_connection(), remaining)  # type: ignore[no-untyped-call]

    async def _drop_idle(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.disconnect(nowait=True)
            await self.redis.connection_pool.release(conn)

    async def _via_redis_py(self, commands: list[tuple[Arg, ...]]) -> list[Any]:
        pipe = self.redis.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return await pipe.execute(raise_on_error=False)

    async def _bounded(self, awaitable: Awaitable[T], limit: float | None = None) -> T:
        """*awaitable* within *limit* seconds (default: command_timeout), else TimeoutError."""
        if limit is None:
            limit = self.command_timeout
        if limit is None:
            return await awaitable
        if sys.version_info >= (3, 11):
            async with asyncio.timeout(limit):
                return await awaitable
        with anyio.fail_after(limit):  # pragma: no cover - Python 3.10
            return await awaitable
