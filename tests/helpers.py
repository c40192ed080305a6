"""Test helpers: a client that counts round trips, and a small waiting utility."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

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
    """How many commands (RESP arrays of bulk strings) one write carries."""
    data = packed if isinstance(packed, (bytes, bytearray)) else b"".join(packed)
    count = at = 0
    while at < len(data):
        assert data[at : at + 1] == b"*", data[at : at + 20]
        end = data.index(b"\r\n", at)
        args = int(data[at + 1 : end])
        at = end + 2
        for _ in range(args):
            end = data.index(b"\r\n", at)
            at = end + 2 + int(data[at + 1 : end]) + 2  # "$<len>\r\n<data>\r\n"
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
