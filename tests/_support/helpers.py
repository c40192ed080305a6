"""Test helpers: a client that counts round trips, small waiting utilities, and a port
where nothing listens."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import hiredis
from redis.asyncio import Connection, ConnectionPool, Redis
from redis.asyncio.cluster import RedisCluster


class RoundTrips:
    """Counts the writes of every connection of one client: one write = one round trip.

    ``batches`` has the number of commands of each write, in order. A write of only the
    manager's contention summary (``SET <prefix>:mgr:{<id>}:top``, once a second while its
    figures change: aiolock._engine.contention) is not counted: it is no lock operation's,
    and its own cadence has a test of its own; ``summaries`` counts those.
    """

    def __init__(self) -> None:
        self.sends = 0
        self.batches: list[int] = []
        self.summaries = 0

    def connection_class(self) -> type[Connection]:
        counter = self

        class CountingConnection(Connection):
            async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
                if _only_summaries(command):
                    counter.summaries += 1
                else:
                    counter.sends += 1
                    counter.batches.append(commands_in(command))
                await super().send_packed_command(command, check_health)

        return CountingConnection


def _commands(packed: Any) -> list[Any]:
    reader = hiredis.Reader()
    reader.feed(bytes(packed) if isinstance(packed, (bytes, bytearray)) else b"".join(packed))
    found = []
    while (command := reader.gets()) is not False:
        found.append(command)
    return found


def _only_summaries(packed: Any) -> bool:
    """Whether a write carries nothing but contention summaries (see RoundTrips)."""
    commands = _commands(packed)
    return bool(commands) and all(
        isinstance(c, list)
        and len(c) >= 2
        and bytes(c[0]).upper() == b"SET"
        and b":mgr:{" in bytes(c[1])
        and bytes(c[1]).endswith(b"}:top")
        for c in commands
    )


def commands_in(packed: Any) -> int:
    """How many commands one write carries (a command is a RESP array, which the same
    hiredis reader that parses replies parses too)."""
    reader = hiredis.Reader()
    reader.feed(bytes(packed) if isinstance(packed, (bytes, bytearray)) else b"".join(packed))
    count = 0
    while reader.gets() is not False:
        count += 1
    return count


def counting_client(url: str, **kwargs: Any) -> tuple[Redis, RoundTrips]:
    trips = RoundTrips()
    pool = ConnectionPool.from_url(url, connection_class=trips.connection_class(), **kwargs)
    return Redis(connection_pool=pool), trips


#: How long a test waits for something that takes milliseconds when all is well: only a
#: real hang reaches it, not a machine loaded by two suites and a CPU hog (issue 25).
PATIENCE = 10.0


async def eventually(
    predicate: Callable[[], bool | Awaitable[bool]],
    *,
    timeout: float = PATIENCE,
    what: str = "condition",
) -> None:
    """Poll a condition (a plain or an async predicate) until it holds; fail after
    *timeout* seconds, saying what was waited for and how long."""
    started = time.monotonic()
    while True:
        held = predicate()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.01)


T = TypeVar("T")


async def within(awaitable: Awaitable[T], *, what: str, timeout: float = PATIENCE) -> T:
    """Await *awaitable*; fail after *timeout* seconds, saying what was waited for and how
    long (a bare ``wait_for`` fails with an empty ``TimeoutError``)."""
    try:
        return await asyncio.wait_for(awaitable, timeout)
    except asyncio.TimeoutError:
        raise AssertionError(f"timed out after {timeout} s waiting for {what}") from None


def unchanged_for(
    read: Callable[[], object], seconds: float = 0.3
) -> Callable[[], Awaitable[bool]]:
    """A predicate for :func:`eventually`: *read*'s value stayed the same for *seconds*
    (the background work a test waits out, e.g. a retry after subscribing, is over)."""

    async def steady() -> bool:
        before = read()
        await asyncio.sleep(seconds)
        return read() == before

    return steady


@contextlib.contextmanager
def closed_port(host: str = "127.0.0.1") -> Iterator[int]:
    """A loopback port where nothing listens, for as long as the block runs.

    ``free_port()`` gives a port that was free a moment ago: CI runs several suites at
    once, and one of them may start a server on it before a test connects (issue 25).
    Here the port stays bound to a socket that never calls ``listen()``: a connection to
    it is refused (ECONNREFUSED), and no other process can bind it (no SO_REUSEADDR).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        yield int(sock.getsockname()[1])


async def lock_held(redis: Redis | RedisCluster, key: str) -> bool:
    """Whether the lock state at *key* (aiolock's own wire format) is held: since issue 21
    it is one string that stays after the last release (``|<epoch>|<last token>``, free)
    for the fence and resent releases; a key of another type counts as held."""
    if not await redis.exists(key):
        return False
    if await redis.type(key) not in (b"string", "string"):
        return True
    value: Any = await redis.get(key)
    return value is not None and not value.startswith(b"|")


async def hold_once(lock: Any) -> None:
    """Take *lock* (any handle usable with ``async with``) and let it go at once: a task's
    whole use of a lock, for tests that wait on such a task."""
    async with lock:
        pass
