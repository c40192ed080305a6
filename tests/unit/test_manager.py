"""open()/aclose() as the lifecycle without ``async with``, and ping() as a health check."""

from __future__ import annotations

import asyncio
import inspect
import socket

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._factories import MANAGER_OPTIONS
from aiolock.testing import RedisServer


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_open_and_aclose_in_different_tasks(redis_url: str, prefix: str) -> None:
    manager = aiolock.LockManager.from_url(redis_url, prefix=prefix)
    assert await asyncio.create_task(manager.open()) is manager  # a startup hook's task
    assert manager.is_open
    async with manager.lock("x") as lock:
        assert lock.fencing_token is not None
    await asyncio.create_task(manager.aclose())  # a shutdown hook's task
    assert not manager.is_open
    with pytest.raises(aiolock.ManagerNotOpenError, match="opened once"):
        await manager.open()


async def test_ping_measures_a_round_trip(locks: aiolock.LockManager) -> None:
    seconds = await locks.ping()
    assert 0 < seconds < 5


async def test_ping_says_the_manager_is_not_open(redis_url: str) -> None:
    manager = aiolock.LockManager.from_url(redis_url)
    with pytest.raises(aiolock.ManagerNotOpenError, match="not open"):
        await manager.ping()
    await manager.open()
    await manager.aclose()
    with pytest.raises(aiolock.ManagerNotOpenError, match="closed"):
        await manager.ping()


async def test_ping_says_redis_cannot_be_reached() -> None:
    url = f"redis://127.0.0.1:{_closed_port()}/0"
    async with aiolock.LockManager.from_url(url, command_timeout=2, check_on_open=False) as manager:
        with pytest.raises(aiolock.LockConnectionError, match=r"127\.0\.0\.1"):
            await manager.ping()


async def test_ping_says_the_credentials_are_wrong() -> None:
    with RedisServer(extra_args=["--requirepass", "s3cret"], password="s3cret") as server:
        url = server.url.replace("redis://", "redis://:wrong@")
        async with aiolock.LockManager.from_url(url, check_on_open=False) as manager:
            with pytest.raises(aiolock.LockPermissionError):
                await manager.ping()


async def test_stop_acquiring_fails_waiters_and_new_acquires_while_holders_finish(
    redis: Redis, prefix: str
) -> None:
    """Issue 23: a graceful stop (aiohttp's on_shutdown) makes waiting tasks and new
    acquisitions fail with ManagerNotOpenError (a 503 in the web helpers) while a holder
    keeps its lock, and its release still works, until the manager closes."""
    manager = aiolock.LockManager(redis, prefix=prefix)
    assert not manager.is_acquiring  # not open yet
    async with manager as locks:
        assert locks.is_acquiring
        held = locks.lock("stopping")
        await held.acquire()
        waiter = asyncio.create_task(locks.lock("stopping").acquire())
        for _ in range(500):  # bounded: the waiter queues within a few loop steps
            if locks.statistics().hub.waiters == 1:
                break
            await asyncio.sleep(0.01)
        locks.stop_acquiring()
        assert not locks.is_acquiring and locks.is_open  # stopped, still open for holders
        with pytest.raises(aiolock.ManagerNotOpenError):
            await asyncio.wait_for(waiter, 10)
        for timeout in (0, 5):
            with pytest.raises(aiolock.ManagerNotOpenError, match="hands out no more locks"):
                await locks.lock("another").acquire(timeout=timeout)
        assert locks.is_open and await held.owned()
        await held.release()
        assert not await held.locked()
    assert not manager.is_acquiring  # closed


async def test_a_crash_of_the_background_tasks_fails_the_manager(
    redis: Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The lifecycle shared with RedlockManager (aiolock/_lifecycle.py): a crashed
    background task is logged and fails the manager, which refuses locks; closing it
    reports the crash."""

    async def crash() -> None:
        raise RuntimeError("boom")

    manager = aiolock.LockManager(redis, prefix=prefix)
    await manager.open()
    assert manager._engine is not None and manager._supervisor is not None
    manager._engine.cleanup.run = crash  # type: ignore[method-assign]  # (not started yet)
    await asyncio.wait((manager._supervisor,), timeout=10)
    assert not manager.is_open
    assert "the LockManager is unusable" in caplog.text
    with pytest.raises(aiolock.ManagerNotOpenError, match="failed"):
        await manager.lock("x").acquire(timeout=0)
    with pytest.raises(aiolock.LockError, match="background tasks had failed"):
        await manager.aclose()
    await manager.aclose()  # closed once
    with pytest.raises(aiolock.ManagerNotOpenError, match="closed"):
        await manager.ping()


def test_from_url_knows_every_option_of_the_manager() -> None:
    """from_url() and from_sentinel() split their keywords by MANAGER_OPTIONS: an option
    missing there went to redis-py, which refused it (max_hold did, when it was new)."""
    parameters = set(inspect.signature(aiolock.LockManager.__init__).parameters)
    assert parameters - {"self", "redis"} == MANAGER_OPTIONS
