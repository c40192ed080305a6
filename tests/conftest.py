"""Shared fixtures (private redis-server processes, open LockManagers) and the scheduling of
parallel workers.

The suite starts its own ``redis-server`` on a free loopback port (see
:mod:`aiolock.testing`) and stops it by pid: under pytest-xdist each worker starts its own.
Set ``AIOLOCK_TEST_REDIS_URL`` to run the suite against a server of your choosing instead;
tests never flush a database, each uses its own key prefix.

Workers take whole files (a file's module fixtures, a Redis Cluster or five Redlock
masters, start once), except the tests marked ``serial``: those load the machine
(benchmarks, multi-process stress, storms, fuzzing), so they form one group that one
worker runs one after another, never two at once (``--dist loadgroup``, set in
pyproject.toml). CONTRIBUTING.md lists the tiers.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import redis as redis_sync
from redis.asyncio import Redis

import aiolock
from aiolock.testing import RedisServer


#: the xdist group of the tests that load the machine (see the module docstring)
SERIAL_GROUP = "serial"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("serial") is not None:
            group = SERIAL_GROUP
        else:
            group = item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    explicit = os.environ.get("AIOLOCK_TEST_REDIS_URL")
    if explicit:
        yield explicit
        return
    with RedisServer() as server:
        yield server.url


@pytest.fixture
def prefix() -> str:
    """A key prefix of this test's own: no two tests share keys, and none flushes."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def admin(redis_url: str) -> AsyncIterator[Redis]:
    """A second client of its own, for looking at (or changing) Redis behind a manager."""
    client = Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def locks(redis: Redis, prefix: str) -> AsyncIterator[aiolock.LockManager]:
    async with aiolock.LockManager(redis, prefix=prefix) as manager:
        yield manager


@pytest.fixture
def sync_redis(redis_url: str) -> redis_sync.Redis:
    """A synchronous redis-py client of the suite's server (the foreign clients' side)."""
    return redis_sync.Redis.from_url(redis_url)
