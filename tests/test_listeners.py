"""Who listens for a plain lock (issue 20, item 1): managers register as listeners.

A plain lock's waiters wait on its release channel, which Redis can count (NUMSUB) but
not name; a manager whose waiter found the lock busy registers its id in
``<lock>:listeners`` while it stays subscribed, and ``aiolock show`` lists them with who
they are. An uncontended acquire writes nothing more.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._engine import listeners

from .helpers import eventually
from .test_cli import run_cli
from .test_identity import record_of


async def test_show_lists_the_managers_waiting_for_a_plain_lock(
    redis: Redis, redis_url: str, prefix: str
) -> None:
    async with (
        aiolock.LockManager(redis, prefix=prefix, name="holder") as holder,
        aiolock.LockManager(redis, prefix=prefix, name="billing-worker") as first,
        aiolock.LockManager(redis, prefix=prefix, name="reports") as second,
    ):
        for manager in (holder, first, second):
            await record_of(redis, manager)
        key = f"{prefix}:lock:{{orders}}:listeners"
        async with holder.lock("orders"):
            waiting = [
                asyncio.create_task(first.lock("orders").acquire()),
                asyncio.create_task(first.lock("orders").acquire()),  # one entry per manager
                asyncio.create_task(second.lock("orders").acquire()),
            ]
            try:

                async def registered() -> bool:
                    return await redis.zcard(key) == 2

                await eventually(registered, what="both waiting managers registered")
                shown = await run_cli(redis_url, prefix, "--json", "show", "orders")
                table = await run_cli(redis_url, prefix, "show", "orders")
            finally:
                for task in waiting:
                    task.cancel()
                await asyncio.gather(*waiting, return_exceptions=True)

            async def withdrawn() -> bool:
                return not await redis.exists(key)

            # the waiters gave up: the registrations go at the next round (TTL / 3), not
            # when they expire (TTL)
            await eventually(withdrawn, timeout=listeners.TTL, what="registrations withdrawn")
    assert shown.code == 0, shown.err
    (lock,) = json.loads(shown.out)["objects"]
    assert lock["listeners"] == 2  # PUBSUB NUMSUB: one subscription per manager
    by_id = {who["manager"]: who for who in lock["listening"]}
    assert set(by_id) == {first.id, second.id}
    assert by_id[first.id]["name"] == "billing-worker"
    assert by_id[second.id]["name"] == "reports"
    assert by_id[first.id]["host"] == socket.gethostname()
    assert by_id[first.id]["pid"] == os.getpid()
    assert table.code == 0, table.err
    assert f"{first.id}: billing-worker@{socket.gethostname()} pid {os.getpid()}" in table.out
    assert f"{second.id}: reports@" in table.out


async def test_an_uncontended_acquire_registers_nothing(
    locks: aiolock.LockManager, redis: Redis, prefix: str
) -> None:
    lock = locks.lock("quiet")
    for _ in range(20):
        async with lock:
            assert not await redis.exists(f"{prefix}:lock:{{quiet}}:listeners")
    assert len(locks._open_engine()._listeners) == 0


async def test_a_registration_outlives_its_ttl_while_the_waiter_waits(
    redis: Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(listeners, "TTL", 0.6)  # refreshed every 0.2 s
    async with (
        aiolock.LockManager(redis, prefix=prefix) as holder,
        aiolock.LockManager(redis, prefix=prefix) as waiter,
    ):
        key = f"{prefix}:lock:{{long}}:listeners"
        async with holder.lock("long"):
            task = asyncio.create_task(waiter.lock("long").acquire())
            try:

                async def registered() -> bool:
                    return await redis.zscore(key, waiter.id) is not None

                await eventually(registered, what="the waiter registered")
                loop = asyncio.get_running_loop()
                until = loop.time() + 1.8  # three TTLs: only refreshes keep it
                while loop.time() < until:
                    assert await redis.zscore(key, waiter.id) is not None
                    await asyncio.sleep(0.05)
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
