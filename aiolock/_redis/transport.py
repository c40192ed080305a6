"""Round trips on a redis-py connection without redis-py's per-read time limit.

redis-py bounds every reply it reads with ``asyncio.timeout(socket_timeout)`` and every
write with ``asyncio.wait_for`` (a task per write). ``Redis()`` sets ``socket_timeout=5``
by default, so that machinery ran once per reply and cost about 28 % of aiolock's client
CPU. Here a round trip writes the packed commands on the connection's stream and feeds
what arrives to the connection's own ``hiredis.Reader``, the one redis-py's parser reads
with. Because it is the same reader:

* error replies come out as the same redis-py exception instances (redis-py's
  ``parse_error`` is the reader's ``replyError``), so ``translate`` sees what it always saw;
* decoding follows the client's ``decode_responses``/encoding, RESP2 or RESP3;
* redis-py's own reads on the connection (health checks, the pool's "has data?" check on
  checkout) see a consistent buffer.

The time limit is a :class:`RoundTripTimer`: one deadline per round trip that aborts the
transport when it passes, instead of a timeout context per read (the round trips of a client
share one loop timer: :class:`RoundTripTimers`).

Connections the fast path does not understand (no hiredis, a parser or connection class
that reads differently, e.g. Sentinel's, which turns READONLY into a failover) return
``None`` from :func:`fast_parser`, and the caller falls back to ``read_response``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis import exceptions as rex
from redis.asyncio.connection import AbstractConnection

try:  # private to redis-py: if it moves, the fast path is simply off
    from redis._parsers.hiredis import NOT_ENOUGH_DATA, _AsyncHiredisParser
except ImportError:  # pragma: no cover - redis-py without these names
    _AsyncHiredisParser = None  # type: ignore[assignment,misc]
    NOT_ENOUGH_DATA = object()

__all__ = ["RoundTripTimer", "RoundTripTimers", "exchange", "fast_parser", "where", "write"]

#: bytes asked of the stream per read (redis-py's default socket_read_size)
READ_SIZE = 65536
#: where redis-py defines the connection methods whose behaviour the fast path reproduces;
#: a method defined elsewhere (a subclass, Sentinel, a test or benchmark counter) is used as is
_REDIS_PY = "redis.asyncio.connection"


#: Reply types that are neither an error, a push message, a list nor the end of the data:
#: a reply of exactly one of them is simply kept, before any other check (most replies
#: of aiolock's scripts are a bare integer)
_PLAIN = frozenset((int, bytes, str))


def fast_parser(conn: AbstractConnection) -> Any | None:
    """The hiredis parser of *conn* if its replies can be read directly, else ``None``."""
    parser = getattr(conn, "_parser", None)
    if (
        _AsyncHiredisParser is None
        or type(parser) is not _AsyncHiredisParser
        or getattr(type(conn).read_response, "__module__", None) != _REDIS_PY
        or not getattr(parser, "_connected", False)
        or getattr(parser, "_reader", None) is None
        or getattr(parser, "_stream", None) is None
    ):
        return None
    return parser


async def write(conn: AbstractConnection, packed: bytes) -> None:
    """Send *packed* on *conn*, without redis-py's ``wait_for`` around the write.

    A ``send_packed_command`` that is not redis-py's own (a subclass or a patch counting
    round trips, as the test helpers and the benchmark harness do) is called instead, so
    what it observes stays true.
    """
    if getattr(type(conn).send_packed_command, "__module__", None) != _REDIS_PY:
        await conn.send_packed_command(packed)
        return
    if not conn.is_connected:
        await conn.connect()  # type: ignore[no-untyped-call]
    if conn.health_check_interval:  # redis-py's PING when the connection sat idle long enough
        await conn.check_health()  # type: ignore[no-untyped-call]
    writer = conn._writer
    # Writing to a closing transport raised AttributeError on Python 3.13 instead of a
    # connection error: say it is one, so the round trip is retried on a fresh connection.
    if writer is None or writer.transport.is_closing():
        raise rex.ConnectionError(f"Connection to {where(conn)} is closed.")
    try:
        writer.write(packed)
        await writer.drain()
    except OSError as exc:
        raise rex.ConnectionError(f"Error while writing to {where(conn)}: {exc!r}") from exc


async def exchange(conn: AbstractConnection, parser: Any, packed: bytes, count: int) -> list[Any]:
    """Write *packed* (*count* commands) and read their *count* replies.

    Error replies are returned as exception values, as ``read_response`` would have raised
    them; a broken connection raises :class:`redis.exceptions.ConnectionError`.
    """
    await write(conn, packed)
    reader, stream = parser._reader, parser._stream
    # RESP3 push messages (maintenance notifications, invalidations) go to redis-py's
    # handlers, as its parser does; they are not replies.
    push = getattr(parser, "_hiredis_PushNotificationType", None)
    replies: list[Any] = []
    gets, append = reader.gets, replies.append
    while len(replies) < count:
        reply = gets()
        if type(reply) in _PLAIN:  # the common replies, none of the cases below
            append(reply)
        elif reply is NOT_ENOUGH_DATA:
            try:
                data = await stream.read(READ_SIZE)
            except OSError as exc:
                raise rex.ConnectionError(
                    f"Error while reading from {where(conn)}: {exc!r}"
                ) from exc
            if not data:
                raise rex.ConnectionError(f"Connection to {where(conn)} closed by server.")
            reader.feed(data)
        elif isinstance(reply, rex.ConnectionError):
            raise reply  # e.g. "max number of clients reached": as read_response does
        elif push is not None and isinstance(reply, push):
            await parser.handle_push_response(reply)
        elif type(reply) is list and reply and isinstance(reply[0], rex.ConnectionError):
            raise reply[0]
        else:
            append(reply)
    if conn.health_check_interval:  # what read_response records after a read
        conn.next_health_check = asyncio.get_running_loop().time() + conn.health_check_interval
    return replies


def where(conn: AbstractConnection) -> str:
    """The server address redis-py names in its errors."""
    try:
        return conn._host_error()
    except Exception:  # pragma: no cover - a connection class without it
        return "Redis"


class RoundTripTimer:
    """Aborts a connection's transport at *when* (loop time), unless cancelled first.

    Aborting makes the pending read or write fail at once with a connection error; the
    caller then checks :attr:`expired` to report a timeout instead. The connection is
    dropped either way (a reply may still be on its way), which a per-read timeout did too.

    The round trips of one client share one loop timer (*timers*, :class:`RoundTripTimers`):
    a timer of the loop's own per round trip cost about a dozen Python calls of asyncio's
    (its handle, the heap's comparisons, its cancellation), now a set's add and discard.
    """

    __slots__ = ("_conn", "_timers", "expired", "when")

    def __init__(self, timers: RoundTripTimers, when: float, conn: AbstractConnection):
        self.expired = False
        self.when = when
        self._conn = conn
        self._timers = timers
        timers.pending.add(self)
        if timers.armed is None or when < timers.armed_at:
            timers.arm(when)

    def expire(self) -> None:
        self.expired = True
        self._timers.pending.discard(self)
        writer = self._conn._writer
        if writer is not None:
            writer.transport.abort()

    def cancel(self) -> None:
        self._timers.pending.discard(self)


class RoundTripTimers:
    """One loop timer for the :class:`RoundTripTimer` of every round trip of a client.

    It is armed at the earliest deadline of those pending, or an earlier one that has
    since been cancelled (a round trip answered in time is not looked for in the loop's
    heap): when it fires, it expires the round trips whose deadline has come and arms
    itself at the earliest deadline left, so each expires at its own deadline as with a
    timer of its own. With round trips answered in time, it fires about once per time
    limit instead of being armed and cancelled once per round trip.
    """

    __slots__ = ("armed", "armed_at", "loop", "pending")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending: set[RoundTripTimer] = set()
        self.armed: asyncio.TimerHandle | None = None
        self.armed_at = 0.0

    def arm(self, when: float) -> None:
        if self.armed is not None:
            self.armed.cancel()
        self.armed = self.loop.call_at(when, self._fire)
        self.armed_at = when

    def _fire(self) -> None:
        self.armed = None
        now = self.loop.time()
        earliest: float | None = None
        for timer in list(self.pending):
            if timer.when <= now:
                timer.expire()
            elif earliest is None or timer.when < earliest:
                earliest = timer.when
        if earliest is not None:
            self.arm(earliest)
