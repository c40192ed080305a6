"""The one door to Redis: runs scripts and commands, and turns redis-py errors into ours.

Every command aiolock sends goes through :class:`Client`, so error translation, the
optional per-command time limit and EVALSHA's NOSCRIPT fallback live in one place.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import sys
from collections import deque
from collections.abc import Awaitable, Coroutine, Sequence
from typing import Any, TypeVar

import anyio
from redis import exceptions as rex
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection

from aiolock._errors import (
    LockBackendError,
    LockConnectionError,
    LockError,
    LockKeyTypeError,
    LockPermissionError,
)
from aiolock._redis.replicas import ACKNOWLEDGE, Acknowledgement
from aiolock._redis.reply import as_int, as_text
from aiolock._redis.scripts import REQUIRED_COMMANDS, Script
from aiolock._redis.transport import RoundTripTimer, exchange, fast_parser, where

__all__ = ["Client", "as_int", "as_text", "translate"]

T = TypeVar("T")
Arg = str | int | float | bytes


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
    for command in commands:
        parts.append(b"*%d\r\n" % len(command))
        for arg in command:
            encoded = _BULK.get(arg)
            parts.append(encoded if encoded is not None else _bulk(arg))
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


#: The words of a pool-exhaustion error (a waiter's timeout says which outage it was).
POOL_EXHAUSTED = "the client's connection pool is exhausted"

#: Where Redis points into a script in an error ("script: <sha>, on @user_script:12.";
#: Valkey 9 leaves out the sha): noise for the caller, who did not write the script.
_SCRIPT_POSITION = re.compile(r"\s*script: (?:[0-9a-f]{40}, )?on @user_script:\d+\.?")


def translate(
    exc: rex.RedisError, what: str, key: str | None = None, *, changes: bool = True
) -> LockError:
    """Map a redis-py exception to the aiolock error a caller can act on."""
    text = _SCRIPT_POSITION.sub("", str(exc)).strip() or type(exc).__name__
    if isinstance(exc, rex.AuthenticationError) or text.startswith(("WRONGPASS", "NOAUTH")):
        return LockPermissionError(
            f"Redis rejected the client's credentials during {what}: {text}. "
            "Check the username and password in the Redis URL or client."
        )
    if (
        isinstance(exc, rex.NoPermissionError)
        or "NOPERM" in text
        or "can't run this command" in text  # an ACL refusal inside a script (Redis)
        or "ACL failure in script" in text  # the same refusal as Valkey words it
    ):
        needed = ", ".join(c.upper().replace("|", " ") for c in REQUIRED_COMMANDS)
        return LockPermissionError(
            f"Redis refused {what}: {text}. The ACL user needs these commands: {needed}; "
            "on keys (~prefix:*) and channels (&prefix:*) under the manager's prefix."
        )
    if is_permanent(exc):
        return LockBackendError(
            f"{what} failed: the TLS certificate of Redis was refused ({text}). Retrying "
            "cannot mend this: give the client the CA that signed the server's certificate "
            "(ssl_ca_certs=...) and connect by the host name the certificate names."
        )
    if isinstance(exc, rex.MaxConnectionsError) or text == "No connection available.":
        return LockConnectionError(
            f"{what} failed: {POOL_EXHAUSTED} ({text}). aiolock "
            "uses up to max_in_flight connections plus one for pub/sub; make the pool "
            "larger (max_connections) or share it with fewer users."
        )
    if isinstance(exc, (rex.ConnectionError, rex.TimeoutError)):
        return LockConnectionError(
            f"{what} failed: Redis could not be reached or did not answer ({text})."
            + (
                " The outcome on the server is unknown; aiolock undoes partial acquisitions "
                "and retries releases in the background."
                if changes
                else ""
            )
        )
    # (redis-py strips the READONLY code from the text of its ReadOnlyError)
    if isinstance(exc, rex.ReadOnlyError) or text.startswith("READONLY"):
        return LockBackendError(
            f"Redis refused {what}: the server is a read-only replica, not the primary "
            f"({text}). Give aiolock a client of the primary; with Sentinel, use "
            "LockManager.from_sentinel() or Sentinel.master_for(), which follow failovers"
        )
    if text.startswith("NOREPLICAS"):
        return LockBackendError(
            f"Redis refused {what}: the primary accepts no writes while fewer replicas than "
            f"its min-replicas-to-write are in sync ({text}). Check the replicas' link to "
            "the primary (INFO replication), or lower min-replicas-to-write"
        )
    if isinstance(exc, rex.MovedError):
        return LockBackendError(
            f"Redis answered {what} with MOVED ({text}): this server is a Redis Cluster "
            "node, and a plain redis.asyncio.Redis client talks to one node only. Pass a "
            "redis.asyncio.cluster.RedisCluster client to LockManager, or use "
            "LockManager.from_url(url, cluster=True)."
        )
    if "WRONGTYPE" in text and key is not None:
        return LockKeyTypeError(
            f"a Redis key of lock {key!r} holds a value of another type, so it cannot be "
            f"used as a lock; rename the lock or delete that key (Redis said: {text})"
        )
    return LockBackendError(f"Redis answered {what} with an error: {text}")


def is_permanent(exc: BaseException) -> bool:
    """A connection error that no retry mends: the server's TLS certificate was refused.

    redis-py raises its ConnectionError from the handshake's error (as ``__context__``),
    so the chain is searched.
    """
    seen = 0
    cause: BaseException | None = exc
    while cause is not None and seen < 8:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return True
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    return "CERTIFICATE_VERIFY_FAILED" in str(exc)


def key_type_error(key: str, kind: object) -> LockKeyTypeError:
    return LockKeyTypeError(
        f"Redis key {key!r} holds a {as_text(kind)}, not an aiolock lock (a hash), so it "
        "cannot be used as a lock; pick another lock name or prefix, or delete that key."
    )


def _chained(error: LockError, cause: BaseException) -> LockError:
    """*error* caused by *cause*, as ``raise error from cause`` would chain it.

    A command settled from a pipeline gets its error through a future, not a ``raise``:
    the cause must be set by hand, because the Redis Cluster router decides on it (a
    MOVED, ASK or TRYAGAIN reply, a connection error) exactly as for a command sent alone.
    """
    error.__cause__ = cause
    return error


class _Request:
    """A command waiting for a pipeline slot."""

    __slots__ = ("command", "future", "key", "script", "what")

    def __init__(
        self, command: tuple[Arg, ...], script: Script | None, what: str, key: str | None
    ) -> None:
        self.command = command
        self.script = script
        self.what = what
        self.key = key
        self.future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def error(self, exc: rex.RedisError) -> LockError:
        return _chained(translate(exc, self.what, self.key, changes=self.script is not None), exc)


class Client:
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

    #: The most commands sent in one pipeline. Small enough that Redis runs one pipeline
    #: while the client reads the replies of another: the tasks that a pipeline's replies
    #: wake send their next commands together, and in one pipeline of them all the client
    #: and Redis took turns instead of working at once. 64 tasks on distinct names ran
    #: 1.3x-1.6x the cycles per second with 16 as with 512 (W2 on one server over
    #: loopback; 256 tasks 1.5x; 16 tasks, whose pipelines are shorter anyway, the same).
    #: With 3 pipelines in flight that is 48 commands per round trip: on a link with a
    #: long round trip, raise the manager's ``max_in_flight``.
    MAX_BATCH = 16
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
        self.max_in_flight = max_in_flight
        #: a Sentinel primary's pool: connections may point at a replaced primary
        self._follows_primary = bool(getattr(redis.connection_pool, "is_master", False))
        self._in_flight = 0
        #: commands (or a lane's group, sent in one pipeline) waiting for a slot
        self._queue: deque[_Request | list[_Request]] = deque()
        #: ordered lanes (see run_in_order): key -> commands waiting for the lane's turn
        self._lanes: dict[str, deque[_Request]] = {}
        self._flushes: set[asyncio.Task[None]] = set()
        #: connections kept between round trips (at most max_in_flight are ever in use)
        self._idle: list[AbstractConnection] = []
        #: round trips, pipelines sent, and commands sent in them (for statistics)
        self.round_trips = 0
        self.pipelines = 0
        self.pipelined = 0
        #: round trips that failed on a connection error (and were retried once)
        self.connection_errors = 0

    def run(
        self, script: Script, keys: Sequence[str], args: Sequence[Arg]
    ) -> Coroutine[Any, Any, Any]:
        """EVALSHA *script*, loading it first if the server does not know it (awaitable).

        A plain function that returns the coroutine doing the work: one coroutine layer
        fewer on every script call, the hot path's main cost being such layers.
        """
        command = ("EVALSHA", script.sha, len(keys), *keys, *args)
        what = f"the {script.name} script"
        ack = ACKNOWLEDGE.get()
        if ack is not None:  # replicas=: WAIT must follow on the same connection
            return self._acknowledged(command, script, what, keys[0] if keys else None, ack)
        return self._execute(command, script, what, keys[0] if keys else None)

    async def run_in_order(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        """As :meth:`run`, but calls with the same first key reach Redis in call order.

        :meth:`run` lets commands overtake each other: up to *max_in_flight* pipelines
        are in flight on as many connections, and which one Redis reads first is
        chance. A fair lock's queue in Redis is the order its first attempts arrive in,
        so those go through an ordered *lane* per key: while a command of the lane is
        in flight, later ones wait in the lane, and when it is answered they go out
        together, in order, in one pipeline (of at most :attr:`MAX_BATCH`), and so on.
        A lone command pays nothing more than a dict lookup. Under ``replicas=`` (WAIT
        after each grant) commands take :meth:`run`'s path, unordered.
        """
        if ACKNOWLEDGE.get() is not None:
            return await self.run(script, keys, args)
        command = ("EVALSHA", script.sha, len(keys), *keys, *args)
        what = f"the {script.name} script"
        key = keys[0]
        lane = self._lanes.get(key)
        if lane is not None:  # the lane is busy: wait for its turn, behind earlier calls
            request = _Request(command, script, what, key)
            lane.append(request)
            return await request.future
        self._lanes[key] = deque()
        try:
            return await self._execute(command, script, what, key)
        finally:
            self._next_in_lane(key)

    def _next_in_lane(self, key: str) -> None:
        """The lane's command(s) in flight were answered: send the next group, in order."""
        lane = self._lanes.get(key)
        if lane is None:
            return  # the client closed
        group: list[_Request] = []
        while lane and len(group) < self.MAX_BATCH:
            request = lane.popleft()
            if not request.future.done():  # a cancelled caller's command is dropped
                group.append(request)
        if not group:
            del self._lanes[key]
            return
        left = len(group)

        def settled(_: object) -> None:
            nonlocal left
            left -= 1
            if left == 0:  # every reply of the group is in: the lane's next turn
                self._next_in_lane(key)

        for request in group:
            request.future.add_done_callback(settled)
        self._queue.append(group)
        self._kick()

    async def call(self, *args: Arg, key: str | None = None) -> Any:
        """Send one plain command."""
        return await self._execute(args, None, f"the {as_text(args[0])} command", key)

    async def aclose(self) -> None:
        """Wait for the pipelines in flight; fail what is still queued."""
        lanes, self._lanes = self._lanes, {}
        waiting = [r for lane in lanes.values() for r in lane]
        while self._queue:
            item = self._queue.popleft()
            waiting += item if isinstance(item, list) else (item,)
        for request in waiting:
            if not request.future.done():
                request.future.set_exception(
                    LockConnectionError(f"{request.what} was not sent: the manager closed")
                )
        if self._flushes:
            await asyncio.wait(self._flushes)
        idle, self._idle = self._idle, []
        for conn in idle:
            await self.redis.connection_pool.release(conn)

    async def _execute(
        self, command: tuple[Arg, ...], script: Script | None, what: str, key: str | None
    ) -> Any:
        if self._in_flight < self.max_in_flight and not self._queue:
            self._in_flight += 1
            try:
                return await self._direct(command, script, what, key)
            finally:
                self._in_flight -= 1
                self._kick()
        request = _Request(command, script, what, key)
        self._queue.append(request)
        self._kick()
        # If the caller is cancelled before the flush, the future is cancelled too and
        # the flush skips it: the command is never sent.
        return await request.future

    async def _direct(
        self, command: tuple[Arg, ...], script: Script | None, what: str, key: str | None
    ) -> Any:
        try:
            (reply,) = await self._exchange([command], [script])
        except rex.RedisError as exc:
            raise translate(exc, what, key, changes=script is not None) from exc
        except TimeoutError as exc:
            raise self._timed_out(what) from exc
        if isinstance(reply, rex.RedisError):
            raise translate(reply, what, key, changes=script is not None) from reply
        return reply

    async def _acknowledged(
        self,
        command: tuple[Arg, ...],
        script: Script,
        what: str,
        key: str | None,
        ack: Acknowledgement,
    ) -> Any:
        """*command* then WAIT, in one round trip (so on one connection), never coalesced.

        A NOSCRIPT reply loads the script and sends both again: WAIT must follow the
        script call that actually ran.
        """
        commands = [command, ack.policy.wait_command]
        self._in_flight += 1
        try:
            for _ in range(2):
                try:
                    reply, acked = await self._round_trip(commands)
                    if not isinstance(reply, rex.NoScriptError):
                        break
                    (loaded,) = await self._round_trip([("SCRIPT", "LOAD", script.source)])
                    if isinstance(loaded, rex.RedisError):
                        raise loaded
                except rex.RedisError as exc:
                    raise translate(exc, what, key) from exc
                except TimeoutError as exc:
                    raise self._timed_out(what) from exc
        finally:
            self._in_flight -= 1
            self._kick()
        if isinstance(reply, rex.RedisError):
            raise translate(reply, what, key) from reply
        ack.record(acked)
        return reply

    def _kick(self) -> None:
        """Send what is queued, as pipelines, while slots are free."""
        while self._queue and self._in_flight < self.max_in_flight:
            batch: list[_Request] = []
            while self._queue and len(batch) < self.MAX_BATCH:
                request = self._queue.popleft()
                if isinstance(request, list):  # a lane's group: all in this one pipeline
                    if batch and len(batch) + len(request) > self.MAX_BATCH:
                        self._queue.appendleft(request)  # in the next one
                        break
                    batch += (r for r in request if not r.future.done())
                elif not request.future.done():  # a cancelled caller's command is dropped
                    batch.append(request)
            if not batch:
                return
            self._in_flight += 1
            task = asyncio.get_running_loop().create_task(self._flush(batch))
            self._flushes.add(task)
            task.add_done_callback(self._flushes.discard)

    async def _flush(self, batch: list[_Request]) -> None:
        """Send *batch* as one pipeline and settle every caller's future."""
        try:
            replies = await self._exchange([r.command for r in batch], [r.script for r in batch])
            for request, reply in zip(batch, replies, strict=True):
                if request.future.done():
                    continue
                if isinstance(reply, rex.RedisError):
                    request.future.set_exception(request.error(reply))
                else:
                    request.future.set_result(reply)
        except BaseException as exc:
            for request in batch:
                if not request.future.done():
                    request.future.set_exception(self._batch_error(exc, request))
            if not isinstance(exc, Exception):
                raise
        finally:
            self._in_flight -= 1
            self._kick()

    async def _exchange(
        self, commands: list[tuple[Arg, ...]], scripts: Sequence[Script | None]
    ) -> list[Any]:
        """One round trip for *commands*; replies in order, error replies as values.

        A script the server does not know (restart, SCRIPT FLUSH) is loaded and its
        commands are sent again.
        """
        replies = await self._round_trip(commands)
        retry = [
            i
            for i, reply in enumerate(replies)
            if isinstance(reply, rex.NoScriptError) and scripts[i] is not None
        ]
        if retry:
            sources = {scripts[i].sha: scripts[i].source for i in retry}  # type: ignore[union-attr]
            loads: list[tuple[Arg, ...]] = [("SCRIPT", "LOAD", src) for src in sources.values()]
            for reply in await self._round_trip(loads):
                if isinstance(reply, rex.RedisError):
                    raise reply  # e.g. an ACL that forbids SCRIPT LOAD
            again = await self._round_trip([commands[i] for i in retry])
            for i, reply in zip(retry, again, strict=True):
                replies[i] = reply
        return replies

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
            deadline = asyncio.get_running_loop().time() + self.command_timeout
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
        loop = asyncio.get_running_loop()
        when, per_socket = deadline, False
        if parser is not None and conn.socket_timeout:
            socket_deadline = loop.time() + conn.socket_timeout
            if when is None or socket_deadline < when:
                when, per_socket = socket_deadline, True
        if when is None:
            return await self._talk(conn, parser, packed, count)
        timer = RoundTripTimer(loop, when, conn)
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

    def _batch_error(self, exc: BaseException, request: _Request) -> LockError:
        if isinstance(exc, rex.RedisError):
            return request.error(exc)
        if isinstance(exc, TimeoutError):
            return _chained(self._timed_out(request.what), exc)
        return _chained(LockConnectionError(f"{request.what} failed: {exc!r}"), exc)

    def _timed_out(self, what: str) -> LockConnectionError:
        return LockConnectionError(
            f"{what} got no answer from Redis within {self.command_timeout} s (command_timeout)"
        )

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
