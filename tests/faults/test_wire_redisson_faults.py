"""The ``redisson`` wire format while aiolock's connections are dropped (FaultProxy).

aiolock reaches Redis through a proxy that drops every connection (commands, pub/sub)
again and again; a Redisson-protocol model (tests/redisson_protocol.py) talks to Redis
directly. Acquires, undos and releases that fail in flight must neither let the two
clients overlap nor leave a hold behind that keeps the model out until a lease ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from redis.asyncio import Redis

import aiolock
from aiolock.testing import RedisServer
from tests.redisson_protocol import RedissonModel

from ._support import bounded, eventually, unique_prefix
from .proxy import FaultProxy


@contextlib.asynccontextmanager
async def _direct(server: RedisServer) -> AsyncIterator[Redis]:
    client = Redis.from_url(server.url)
    try:
        yield client
    finally:
        await client.aclose()


async def test_dropped_connections_never_let_aiolock_and_redisson_overlap(
    fault_proxy: FaultProxy, fault_redis_server: RedisServer
) -> None:
    name = unique_prefix("rs")
    inside = overlaps = 0
    counts = {"aiolock": 0, "redisson": 0, "errors": 0}
    stop_at = time.monotonic() + 3.0

    async def critical(who: str) -> None:
        nonlocal inside, overlaps
        inside += 1
        overlaps += inside > 1
        counts[who] += 1
        await asyncio.sleep(0.002)
        inside -= 1

    async with _direct(fault_redis_server) as direct:
        model = RedissonModel(direct, watchdog_ms=3000)
        via_proxy = Redis.from_url(fault_proxy.url)
        manager = aiolock.LockManager(via_proxy, prefix=name, wire="redisson", lease=3.0)
        try:
            async with manager:

                async def aiolock_task() -> None:
                    while time.monotonic() < stop_at:
                        try:
                            async with manager.lock(name, timeout=5):
                                await critical("aiolock")
                        except aiolock.LockError:
                            counts["errors"] += 1  # a dropped connection, reported
                            await asyncio.sleep(0.01)

                async def model_task(thread: int) -> None:
                    while time.monotonic() < stop_at:
                        if await model.lock(name, thread, wait=5):
                            try:
                                await critical("redisson")
                            finally:
                                await model.unlock(name, thread)
                        # Redisson's RLock is not fair: a thread that locks again at
                        # once nearly always wins (docs/wire-redisson.md); pausing lets
                        # both clients make progress, which the test needs, not safety.
                        await asyncio.sleep(0.005)

                async def chaos() -> None:
                    while time.monotonic() < stop_at:
                        await asyncio.sleep(0.07)
                        fault_proxy.drop_all()

                tasks = [aiolock_task() for _ in range(3)] + [model_task(t) for t in (1, 2)]
                await bounded(asyncio.gather(*tasks, chaos()), 30.0, "the mixed fleet")
                # Whatever failed in flight was undone or released (in the background if
                # need be): the lock ends free, not held until a lease runs out.
                await eventually(
                    lambda: manager.statistics().pending_cleanups == 0, what="cleanups"
                )
            assert await direct.exists(name) == 0
        finally:
            await model.aclose()
            await via_proxy.aclose()
    assert overlaps == 0
    assert counts["aiolock"] >= 10 and counts["redisson"] >= 10, counts
    assert fault_proxy.stats.connections_dropped >= 10  # the faults did happen
