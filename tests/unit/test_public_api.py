"""The public surface is pinned: names, error tree, and argument validation."""

from __future__ import annotations

import math
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock


def test_public_names_are_pinned() -> None:
    assert sorted(aiolock.__all__) == aiolock.__all__
    assert set(aiolock.__all__) == {
        "FairLock",
        "HubStatistics",
        "LeaderElection",
        "LeaderTerm",
        "Lock",
        "LockBackendError",
        "LockConnectionError",
        "IncompatibleLayoutError",
        "LockError",
        "LockHandoffError",
        "LockKeyTypeError",
        "LockLostError",
        "LockManager",
        "LockNotOwnedError",
        "LockPermissionError",
        "LockTimeoutError",
        "ManagerNotOpenError",
        "ManagerStatistics",
        "MultiLock",
        "NameStatistics",
        "Observer",
        "Permit",
        "Semaphore",
        "ReadWriteLock",
        "WireFormatError",
        "ReplicaAckError",
        "RedlockLock",
        "RedlockManager",
        "RedlockStatistics",
        "__version__",
    }
    for name in aiolock.__all__:
        assert getattr(aiolock, name) is not None


def test_error_tree() -> None:
    assert issubclass(aiolock.LockTimeoutError, aiolock.LockError)
    assert issubclass(aiolock.LockTimeoutError, TimeoutError)
    assert issubclass(aiolock.LockNotOwnedError, aiolock.LockError)
    assert issubclass(aiolock.LockLostError, aiolock.LockNotOwnedError)
    assert issubclass(aiolock.LockHandoffError, aiolock.LockNotOwnedError)
    assert issubclass(aiolock.LockKeyTypeError, aiolock.LockError)
    assert issubclass(aiolock.IncompatibleLayoutError, aiolock.LockError)
    assert issubclass(aiolock.ManagerNotOpenError, RuntimeError)
    assert issubclass(aiolock.ManagerNotOpenError, aiolock.LockError)
    assert issubclass(aiolock.LockConnectionError, aiolock.LockBackendError)
    assert issubclass(aiolock.LockPermissionError, aiolock.LockBackendError)
    assert issubclass(aiolock.LockBackendError, aiolock.LockError)


BAD_NAMES: list[tuple[Any, type[Exception], str]] = [
    ("", ValueError, "empty"),
    (None, TypeError, "str"),
    (b"order:1", TypeError, "bytes"),
    (42, TypeError, "int"),
    ("\ud800", ValueError, "UTF-8"),
    ("x" * 5000, ValueError, "at most 4096"),
]


@pytest.mark.parametrize(("name", "error", "message"), BAD_NAMES)
async def test_bad_names_fail_at_the_call(
    locks: aiolock.LockManager, name: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        locks.lock(name)


BAD_SECONDS: list[tuple[Any, type[Exception]]] = [
    (0, ValueError),
    (-1, ValueError),
    (math.nan, ValueError),
    (math.inf, ValueError),
    (True, TypeError),
    ("10", TypeError),
]


@pytest.mark.parametrize(("lease", "error"), BAD_SECONDS)
async def test_bad_leases_fail_at_the_call(
    locks: aiolock.LockManager, lease: Any, error: type[Exception]
) -> None:
    with pytest.raises(error, match="lease"):
        locks.lock("a", lease=lease)
    lock = locks.lock("a")
    with pytest.raises(error, match="lease"):
        await lock.acquire(lease=lease)
    with pytest.raises(error, match="lease"):
        await lock.extend(lease)
    assert not await lock.locked()  # nothing was sent, nothing is held


@pytest.mark.parametrize(
    ("timeout", "error"),
    [
        (-0.1, ValueError),
        (math.nan, ValueError),
        (-math.inf, ValueError),
        (math.inf, ValueError),
        ("1", TypeError),
        (False, TypeError),
    ],
)
async def test_bad_timeouts_fail_at_the_call(
    locks: aiolock.LockManager, timeout: Any, error: type[Exception]
) -> None:
    with pytest.raises(error, match="timeout"):
        locks.lock("a", timeout=timeout)
    with pytest.raises(error, match="timeout"):
        await locks.lock("a").acquire(timeout=timeout)
    with pytest.raises(error, match="timeout"):
        await locks.lock("a").try_acquire(timeout=timeout)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"prefix": ""}, ValueError, "prefix"),
        ({"prefix": "a{b}"}, ValueError, "prefix"),
        ({"prefix": 3}, TypeError, "prefix"),
        ({"lease": 0}, ValueError, "lease"),
        ({"lease": math.nan}, ValueError, "lease"),
        ({"command_timeout": -1}, ValueError, "command_timeout"),
    ],
)
async def test_bad_manager_options(
    redis: Redis, options: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        aiolock.LockManager(redis, **options)


def test_manager_needs_an_async_redis_client() -> None:
    with pytest.raises(TypeError, match=r"redis\.asyncio\.Redis"):
        aiolock.LockManager("redis://localhost")  # type: ignore[arg-type]


async def test_a_manager_that_is_not_open_says_how_to_open_it(redis: Redis, prefix: str) -> None:
    manager = aiolock.LockManager(redis, prefix=prefix)
    lock = manager.lock("a")  # handles need no I/O
    with pytest.raises(aiolock.ManagerNotOpenError, match="async with LockManager"):
        await lock.acquire()
    with pytest.raises(RuntimeError, match="not open"):
        await lock.locked()
    async with manager:
        assert manager.is_open
        await lock.acquire()
    with pytest.raises(aiolock.ManagerNotOpenError, match="closed"):
        await lock.acquire()
    with pytest.raises(aiolock.ManagerNotOpenError, match="opened once"):
        await manager.__aenter__()


async def test_from_url_owns_its_client(redis_url: str, prefix: str) -> None:
    manager = aiolock.LockManager.from_url(redis_url, prefix=prefix, lease=5, socket_timeout=5)
    assert manager.lease == 5
    assert manager.prefix == prefix
    async with manager as locks, locks.lock("a") as lock:
        assert await lock.owned()
    assert not manager.is_open


async def test_repr_and_properties(locks: aiolock.LockManager) -> None:
    lock = locks.lock("order:42", timeout=3)
    assert lock.name == "order:42"
    assert lock.key == f"{locks.prefix}:lock:{{order:42}}"
    assert "order:42" in repr(lock)
    assert "open" in repr(locks)
    assert lock.fencing_token is None
