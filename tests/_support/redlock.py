"""Redlock tests' masters: throwaway redis-server processes, and a manager over them.

A module's tests share its servers (``started(n)`` in a module-scoped fixture), each
test under its own key prefix. A "master down" is a server stopped with SIGSTOP
(:func:`paused`): its TCP port still accepts and it answers nothing, the harder case for
a client. Every process is stopped by its pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from redis.asyncio import Redis

from aiolock import LockManager, RedlockManager
from aiolock.testing import RedisServer

__all__ = ["paused", "redlock", "started", "values"]


@contextlib.contextmanager
def started(count: int) -> Iterator[list[RedisServer]]:
    """*count* servers on free loopback ports, stopped (by pid) at the end."""
    servers: list[RedisServer] = []
    try:
        for _ in range(count):
            servers.append(RedisServer().start())
        yield servers
    finally:
        for server in servers:
            server.stop()


@contextlib.asynccontextmanager
async def redlock(
    servers: Sequence[RedisServer], prefix: str, **options: Any
) -> AsyncIterator[RedlockManager]:
    """An open RedlockManager over *servers* (node_timeout 0.1 s unless given)."""
    clients = [Redis.from_url(server.url) for server in servers]
    options.setdefault("node_timeout", 0.1)
    try:
        async with LockManager.redlock(clients, prefix=prefix, **options) as manager:
            yield manager
    finally:
        for client in clients:
            await client.aclose()


@contextlib.contextmanager
def paused(*servers: RedisServer) -> Iterator[None]:
    """SIGSTOP the servers (they accept connections but answer nothing), then SIGCONT."""
    pids = [server.pid for server in servers]
    assert all(pids)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)  # type: ignore[arg-type]
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)  # type: ignore[arg-type]


async def values(servers: Sequence[RedisServer], key: str) -> list[Any]:
    """The key on each master, read with clients of the test's own."""
    found: list[Any] = []
    for server in servers:
        client = Redis.from_url(server.url)
        try:
            found.append(await client.get(key))
        finally:
            await client.aclose()
    return found
