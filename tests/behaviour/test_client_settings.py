"""Client settings (decode_responses, RESP2/RESP3) and keys that are not ours."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

import aiolock

SETTINGS = [
    pytest.param({"decode_responses": False, "protocol": 2}, id="bytes-resp2"),
    pytest.param({"decode_responses": True, "protocol": 2}, id="str-resp2"),
    pytest.param({"decode_responses": False, "protocol": 3}, id="bytes-resp3"),
    pytest.param({"decode_responses": True, "protocol": 3}, id="str-resp3"),
]


@pytest.fixture(params=SETTINGS)
async def any_locks(
    request: pytest.FixtureRequest, redis_url: str, prefix: str
) -> AsyncIterator[aiolock.LockManager]:
    async with aiolock.LockManager.from_url(redis_url, prefix=prefix, **request.param) as locks:
        yield locks


async def test_every_client_setting_works(any_locks: aiolock.LockManager, redis: Redis) -> None:
    lock = any_locks.lock("wire")
    async with lock:
        assert await lock.owned()
        assert await lock.hold_count() == 1
        assert isinstance(lock.fencing_token, int)
        ttl = await lock.ttl()
        assert ttl is not None and 0 < ttl <= 30
    assert await lock.ttl() is None
    order: list[int] = []

    async def worker(i: int) -> None:
        for _ in range(5):
            async with any_locks.lock("wire"):
                order.append(i)
                await asyncio.sleep(0.001)

    await asyncio.gather(*(worker(i) for i in range(4)))
    assert sorted(order) == sorted(list(range(4)) * 5)
    await redis.set(f"{any_locks.prefix}:lock:{{typed}}", "not a lock")
    with pytest.raises(aiolock.LockKeyTypeError, match="holds a string"):
        await any_locks.lock("typed").acquire()


async def test_a_key_of_another_type_is_named_in_the_error(
    locks: aiolock.LockManager, redis: Redis
) -> None:
    lock = locks.lock("occupied")
    await redis.rpush(lock.key, "someone else's list")
    with pytest.raises(aiolock.LockKeyTypeError, match=r"\{occupied\}.*holds a list"):
        await lock.acquire(timeout=1)
    with pytest.raises(aiolock.LockKeyTypeError, match="occupied"):
        await lock.force_release()
    with pytest.raises(aiolock.LockKeyTypeError, match="occupied"):
        await lock.hold_count()
    assert await lock.locked()  # EXISTS works on any type
    assert await redis.lrange(lock.key, 0, -1) == [b"someone else's list"]  # untouched
    assert locks.statistics().held == 0


async def test_a_fence_key_of_another_type_is_named(
    locks: aiolock.LockManager, redis: Redis
) -> None:
    # the fair lock's: the lock keeps its fence in its own state since issue 21
    lock = locks.fair_lock("meta")
    await redis.hset(f"{lock.key}:fence", "x", "1")
    with pytest.raises(aiolock.LockKeyTypeError, match=r"\{meta\}:fence"):
        await lock.acquire()
    assert not await lock.locked()  # nothing half-written


async def test_a_lock_replaced_by_another_type_while_held(
    locks: aiolock.LockManager, redis: Redis
) -> None:
    lock = locks.lock("replaced", lease=5)
    await lock.acquire()
    await redis.delete(lock.key)
    await redis.set(lock.key, "squatter")
    with pytest.raises(aiolock.LockKeyTypeError, match="replaced"):
        await lock.release()
    assert await redis.get(lock.key) == b"squatter"
    assert locks.statistics().held == 0


@pytest.mark.parametrize("name", ["a{b}c", "}{", "{", "colons:and:more", "ünïcødé ✓", "x" * 4000])
async def test_unusual_names_are_kept_apart(locks: aiolock.LockManager, name: str) -> None:
    lock = locks.lock(name)
    async with lock:
        assert await lock.owned()
        assert not await locks.lock(name + "}").locked()
        assert not await locks.lock(name + ":meta").locked()
    assert not await lock.locked()


async def test_a_kept_connection_closed_by_the_server_is_replaced(
    locks: aiolock.LockManager, redis: Redis
) -> None:
    lock = locks.lock("kept")
    async with lock:  # the manager now keeps a connection between round trips
        pass
    killed = await redis.client_kill_filter(_type="normal", skipme=True)
    assert int(killed) >= 1
    # The server closed them before it answered; one more round trip on the connection it
    # spared lets the loop read their end of stream (no sleep that a loaded machine outruns).
    assert await redis.ping()
    for _ in range(3):
        async with lock:  # no connection error, no AttributeError from a dead transport
            assert await lock.owned()
