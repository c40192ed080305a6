"""Unit tests of :mod:`aiolock._engine.runtime`.

Checks what a :class:`Runtime` bundles for the engine and the kinds: the client, the key
space and manager id, the lease, the fence lifetime as the scripts take it (``-1``,
``0`` or ms), the tombstone lifetime, the replica policy and the manager-wide ids, and
that a LockManager's runtime holds no reference back to the manager; that ``fence_ttl``
reaches the lock's scripts through it; and what ``task_in(loop)`` answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._engine.runtime import TOMBSTONE_TTL, Runtime, task_in
from aiolock._keys import KeySpace, ms, new_manager_id
from aiolock._redis.client import Client
from aiolock._redis.replicas import ReplicaPolicy


@pytest.fixture
async def client(redis: Redis) -> AsyncIterator[Client]:
    made = Client(redis)
    try:
        yield made
    finally:
        await made.aclose()


@pytest.mark.parametrize(
    ("fence_ttl", "fence_ms"),
    [(None, "-1"), (0, "0"), (0.0, "0"), (60.0, "60000"), (1.5, "1500"), (0.0002, "1")],
)
def test_fence_ttl_as_the_scripts_take_it(
    client: Client, prefix: str, fence_ttl: float | None, fence_ms: str
) -> None:
    runtime = Runtime(client, KeySpace(prefix, new_manager_id()), 30.0, fence_ttl)
    assert runtime.fence_ms == fence_ms


def test_a_runtime_bundles_what_the_engine_and_kinds_need(client: Client, prefix: str) -> None:
    keyspace = KeySpace(prefix, new_manager_id())
    policy = ReplicaPolicy(1, 0.5, "raise")
    runtime = Runtime(client, keyspace, 12.5, 60.0, policy)
    assert runtime.client is client
    assert runtime.keyspace is keyspace
    assert runtime.manager_id == keyspace.manager_id
    assert runtime.lease == 12.5
    assert runtime.replicas is policy
    assert runtime.tombstone_ms == ms(TOMBSTONE_TTL) == 10_000
    assert Runtime(client, keyspace, 30.0, None).replicas is None  # the default: no WAIT
    with pytest.raises(AttributeError):
        runtime.manager = object()  # type: ignore[attr-defined]  # slots: nothing else


def test_ids_are_unique_and_increasing_within_a_runtime(client: Client, prefix: str) -> None:
    runtime = Runtime(client, KeySpace(prefix, new_manager_id()), 30.0, 60.0)
    other = Runtime(client, KeySpace(prefix, new_manager_id()), 30.0, 60.0)
    assert runtime.next_id() == 1
    assert next(runtime.ids) == 2  # one counter, however it is read
    assert [runtime.next_id() for _ in range(3)] == [3, 4, 5]
    assert other.next_id() == 1  # each runtime (manager) counts on its own


async def test_a_managers_runtime_shares_its_parts_not_the_manager(
    locks: aiolock.LockManager, redis: Redis
) -> None:
    runtime = locks._runtime
    assert runtime.client is locks._client
    assert runtime.client.redis is redis and runtime.client.cluster is False
    assert runtime.keyspace.prefix == locks.prefix
    assert runtime.manager_id == locks.id
    assert runtime.lease == locks.lease
    assert runtime.replicas is None
    assert all(getattr(runtime, slot) is not locks for slot in Runtime.__slots__)
    # The numbers of attempts come from it: a new hold's field carries one.
    lock = locks.lock("numbered")
    async with lock:
        engine = locks._engine
        assert engine is not None
        hold = engine.registry.get(lock._resource, locks._owner())
        assert hold is not None
        number = int(hold.field.rsplit(":", 1)[1])
        assert 1 <= number < runtime.next_id()


@pytest.mark.parametrize(
    ("fence_ttl", "low", "high"),
    [
        (None, -1, -1),  # kept forever
        (60.0, 50_000, 60_000),  # kept fence_ttl
        (0, 1, 10_000),  # no fence state: kept as long as a tombstone only
    ],
)
async def test_the_fence_lifetime_reaches_the_release_script(
    redis: Redis, admin: Redis, prefix: str, fence_ttl: float | None, low: int, high: int
) -> None:
    async with aiolock.LockManager(redis, prefix=prefix, fence_ttl=fence_ttl) as locks:
        lock = locks.lock("fenced")
        async with lock:
            token = lock.fencing_token
        assert not await lock.locked()
        pttl = await admin.pttl(lock.key)  # the free state: last token and epoch
        assert low <= pttl <= high, pttl
        async with lock:
            assert lock.fencing_token is not None and token is not None
            assert lock.fencing_token > token  # the kept state keeps tokens increasing


async def test_task_in_answers_the_task_the_loop_runs() -> None:
    loop = asyncio.get_running_loop()
    assert task_in(loop) is asyncio.current_task()

    async def child() -> asyncio.Task[object] | None:
        return task_in(loop)

    spawned = asyncio.create_task(child())
    assert await spawned is spawned
    outside: list[asyncio.Task[object] | None] = []
    called = asyncio.Event()

    def callback() -> None:  # a plain callback of the loop: no task runs it
        outside.append(task_in(loop))
        called.set()

    loop.call_soon(callback)
    await called.wait()
    assert outside == [None]
