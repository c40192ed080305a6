"""Shared fixtures (private redis-server processes, open LockManagers) and the scheduling of
parallel workers.

The suite starts its own ``redis-server`` on a free loopback port (see
:mod:`aiolock.testing`) and stops it by pid: under pytest-xdist each worker starts its own.
Set ``AIOLOCK_TEST_REDIS_URL`` to run the suite against a server of your choosing instead;
tests never flush a database, each uses its own key prefix.

Workers (``-n 4`` in pyproject.toml) take whole files, so a file's module fixtures (a
Redis Cluster, five Redlock masters) start once, except the tests of ``SERIAL_PATHS``:
those load the machine, so they form one unit that one worker runs one after another,
never two at once. CONTRIBUTING.md lists the tiers.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis as redis_sync
from redis.asyncio import Redis

import aiolock
from aiolock.testing import RedisServer

#: The tests that load the machine: benchmarks, multi-process stress, cancellation storms
#: and fuzzing. They are marked ``serial`` (``-m serial`` selects them) and form one work
#: unit of the parallel run, so one worker runs them one after another, never two at once.
SERIAL_PATHS = (
    "tests/bench/",
    "tests/stress/",
    "tests/faults/test_cancel_storm.py",
    "tests/faults/test_fuzz.py",
)
SERIAL_GROUP = "serial"


def _is_serial(nodeid: str) -> bool:
    return nodeid.startswith(SERIAL_PATHS)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _is_serial(item.nodeid):
            item.add_marker(pytest.mark.serial)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Whole files per worker, the serial tests as one unit handed out first.

    Built on xdist's file scheduling (``--dist loadscope``); the ``xdist_group`` marker
    cannot do this with pytest 9, whose node ids xdist 3.8 can no longer rename.
    """
    from xdist.scheduler import LoadScopeScheduling

    class TierScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist is untyped
        def _split_scope(self, nodeid: str) -> str:
            return SERIAL_GROUP if _is_serial(nodeid) else nodeid.split("::", 1)[0]

        def _assign_work_unit(self, node: Any) -> None:
            # the serial unit is the longest chain of the run: it starts first
            if SERIAL_GROUP in self.workqueue:
                self.workqueue.move_to_end(SERIAL_GROUP, last=False)
            super()._assign_work_unit(node)

    return TierScheduling(config, log)


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
