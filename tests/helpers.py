"""Test helpers: a client that counts round trips, and a small waiting utility."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import hiredis
from redis.asyncio import Connection, ConnectionPool, Redis


class RoundTrips:
    """Counts the writes of every connection of one client: one write = one round trip.

    ``batches`` has the number of commands of each write, in order.
    """

    def __init__(self) -> None:
        self.sends = 0
        self.batches: list[int] = []

    def connection_class(self) -> type[Connection]:
        counter = self

        class CountingConnection(Connection):
            async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
                counter.sends += 1
                counter.batches.append(commands_in(command))
                await super().send_packed_command(command, check_health)

        return CountingConnection


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


async def eventually(
    predicate: Callable[[], bool], *, timeout: float = 5.0, what: str = "condition"
) -> None:
    """Poll an in-process condition until it holds; fail after *timeout* seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.01)
