"""One adapter per lock library, all with the same async interface.

An adapter is created, then ``await setup(url, lease, concurrency)``; ``acquire(name,
timeout)`` returns an opaque handle (or raises :class:`AcquireTimeout`) and
``release(handle)`` gives it back; ``renew(handles)`` does one manual renewal pass for
libraries without automatic renewal; ``teardown()`` closes everything.

Every adapter uses the library's defaults except where noted in ``NOTES`` (which the
report prints). Libraries are imported lazily with :func:`importlib.import_module`, so
this module imports (and type-checks) without the ``bench`` extra installed.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, TypeVar
from urllib.parse import urlsplit

import redis
import redis.asyncio

#: Every redis-py client the harness builds gets this pool size (redis-py 8's default
#: is 100, which W4's 500 waiters would overflow with "Too many connections").
MAX_CONNECTIONS = 1024
#: Concurrency of a manual renewal pass (W5) for libraries without auto-renewal.
RENEW_CONCURRENCY = 64

T = TypeVar("T")


class AcquireTimeout(Exception):
    """The lock was not acquired within the adapter's timeout."""


class LockAdapter(ABC):
    """The common interface; see the module docstring."""

    #: Name used on the command line and in reports.
    name: ClassVar[str]
    #: PyPI distribution providing the library (for the version in the report).
    dist: ClassVar[str]
    #: Whether held locks are renewed automatically (W5).
    auto_renews: ClassVar[bool] = False
    #: How the adapter maps the common interface onto the library.
    note: ClassVar[str] = ""

    @abstractmethod
    async def setup(self, url: str, lease: float, concurrency: int = 64) -> None:
        """Create clients; *concurrency* is the most tasks that will use the adapter."""

    @abstractmethod
    async def acquire(self, name: str, timeout: float) -> object: ...

    @abstractmethod
    async def release(self, handle: object) -> None: ...

    async def renew(self, handles: Sequence[object]) -> None:
        """One manual renewal pass over *handles* (libraries without auto-renewal)."""
        raise NotImplementedError(f"{self.name} has no manual renewal")

    @abstractmethod
    async def teardown(self) -> None:
        """Close clients."""

    @classmethod
    def version(cls) -> str:
        try:
            return importlib.metadata.version(cls.dist)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"


async def _bounded_gather(
    items: Sequence[T], fn: Callable[[T], Awaitable[object]], limit: int
) -> None:
    sem = asyncio.Semaphore(limit)

    async def one(item: T) -> None:
        async with sem:
            await fn(item)

    await asyncio.gather(*(one(i) for i in items))


def _client(url: str) -> redis.asyncio.Redis:
    return redis.asyncio.Redis.from_url(url, max_connections=MAX_CONNECTIONS)


def default_client(url: str) -> redis.asyncio.Redis:
    """``redis.asyncio.Redis(host=..., port=..., db=...)`` and nothing else: redis-py's
    defaults (pool of 100, ``socket_timeout=None``, ...), as a user would build it."""
    parts = urlsplit(url)
    db = int(parts.path.strip("/") or 0)
    return redis.asyncio.Redis(host=parts.hostname or "127.0.0.1", port=parts.port or 6379, db=db)


# -- aiolock ---------------------------------------------------------------------------


class AiolockAdapter(LockAdapter):
    name = "aiolock"
    dist = "aiolock"
    auto_renews = True
    note = (
        "`LockManager(Redis(host=..., port=...), prefix='aiolock', lease=...)` on a client "
        "with redis-py's defaults in every workload (no `max_connections` or timeout "
        "tuning: aiolock uses at most a handful of connections); acquire is "
        "`lock.try_acquire(timeout=...)`, release is `lock.release()`; the owner is the "
        "acquiring task."
    )

    async def setup(self, url: str, lease: float, concurrency: int = 64) -> None:
        module: Any = importlib.import_module("aiolock")
        # redis-py defaults, as users build it: W2 (64 tasks) must not rely on tuning.
        self._redis = default_client(url)
        self._manager: Any = module.LockManager(self._redis, prefix="aiolock", lease=lease)
        await self._manager.__aenter__()

    async def acquire(self, name: str, timeout: float) -> object:
        lock: Any = self._manager.lock(name)
        if not await lock.try_acquire(timeout=timeout):
            raise AcquireTimeout(name)
        return lock

    async def release(self, handle: object) -> None:
        lock: Any = handle
        await lock.release()

    async def teardown(self) -> None:
        try:
            await self._manager.__aexit__(None, None, None)
        finally:
            await self._redis.aclose()

    @classmethod
    def version(cls) -> str:
        v = super().version()
        if v == "not installed":
            module: Any = importlib.import_module("aiolock")
            return str(getattr(module, "__version__", "source tree"))
        return v


class AiolockBaselineAdapter(AiolockAdapter):
    """The same adapter on another revision of aiolock (``--baseline REV``): the
    orchestrator runs its workers with that revision's ``aiolock/`` package, extracted
    by ``git archive``, first on ``sys.path``."""

    name = "aiolock-pre21"
    note = (
        "aiolock as it was before issue 21 (main at the `--baseline` revision, its "
        "`aiolock/` package extracted with `git archive`; the worker checks it imported that "
        "copy), driven exactly as aiolock; W1, W2 and W2mp only."
    )


# -- redis-py --------------------------------------------------------------------------


class RedisPyAdapter(LockAdapter):
    name = "redis-py"
    dist = "redis"
    note = (
        "`Redis.lock(name, timeout=lease, blocking_timeout=...)` from `redis.asyncio`; "
        "library default polling (`sleep=0.1` s between SET NX attempts); no auto-renewal, "
        "W5 renews with `Lock.reacquire()` (64 concurrent)."
    )

    async def setup(self, url: str, lease: float, concurrency: int = 64) -> None:
        self._redis = _client(url)
        self._lease = lease

    async def acquire(self, name: str, timeout: float) -> object:
        lock = self._redis.lock(name, timeout=self._lease, blocking_timeout=timeout)
        if not await lock.acquire():
            raise AcquireTimeout(name)
        return lock

    async def release(self, handle: object) -> None:
        lock: Any = handle
        await lock.release()

    async def renew(self, handles: Sequence[object]) -> None:
        async def one(h: object) -> None:
            lock: Any = h
            await lock.reacquire()

        await _bounded_gather(handles, one, RENEW_CONCURRENCY)

    async def teardown(self) -> None:
        await self._redis.aclose()


# -- python-redis-lock (synchronous) ---------------------------------------------------


class PythonRedisLockAdapter(LockAdapter):
    name = "python-redis-lock"
    dist = "python-redis-lock"
    note = (
        "Synchronous `redis_lock.Lock(redis.Redis, name, expire=lease)`: every acquire and "
        "release runs in a thread (`loop.run_in_executor` on a pool with one thread per "
        "benchmark task, since a waiter blocks its thread in BLPOP). Its `auto_renewal` "
        "starts one thread per lock, so W5 renews with a manual `Lock.extend()` pass."
    )

    async def setup(self, url: str, lease: float, concurrency: int = 64) -> None:
        self._mod: Any = importlib.import_module("redis_lock")
        self._redis = redis.Redis.from_url(url, max_connections=MAX_CONNECTIONS)
        self._lease = max(1, round(lease))
        self._pool = ThreadPoolExecutor(max_workers=max(4, concurrency + 2))

    async def _run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    async def acquire(self, name: str, timeout: float) -> object:
        lock: Any = self._mod.Lock(self._redis, name, expire=self._lease)
        # The library refuses a timeout longer than the lease, and takes whole seconds.
        wait = max(1, min(int(timeout), self._lease))
        deadline = time.monotonic() + timeout
        while True:
            if await self._run(lambda: bool(lock.acquire(blocking=True, timeout=wait))):
                return lock
            if time.monotonic() >= deadline:
                raise AcquireTimeout(name)

    async def release(self, handle: object) -> None:
        lock: Any = handle
        await self._run(lock.release)

    async def renew(self, handles: Sequence[object]) -> None:
        def extend_all() -> None:
            for h in handles:
                lock: Any = h
                lock.extend()

        await self._run(extend_all)

    async def teardown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._redis.close()


# -- pottery ---------------------------------------------------------------------------


class PotteryAdapter(LockAdapter):
    name = "pottery"
    dist = "pottery"
    note = (
        "`pottery.AIORedlock(key=name, masters={redis.asyncio client}, "
        "auto_release_time=lease)`, `acquire(blocking=True, timeout=...)`: the library "
        "polls with a random 0-0.2 s sleep; no auto-renewal, W5 renews with `extend()` "
        "(64 concurrent)."
    )

    async def setup(self, url: str, lease: float, concurrency: int = 64) -> None:
        self._mod: Any = importlib.import_module("pottery")
        self._redis = _client(url)
        self._lease = lease

    async def acquire(self, name: str, timeout: float) -> object:
        lock: Any = self._mod.AIORedlock(
            key=name, masters={self._redis}, auto_release_time=self._lease
        )
        if not await lock.acquire(blocking=True, timeout=timeout):
            raise AcquireTimeout(name)
        return lock

    async def release(self, handle: object) -> None:
        lock: Any = handle
        await lock.release()

    async def renew(self, handles: Sequence[object]) -> None:
        async def one(h: object) -> None:
            lock: Any = h
            await lock.extend()

        await _bounded_gather(handles, one, RENEW_CONCURRENCY)

    async def teardown(self) -> None:
        await self._redis.aclose()


# -- aioredlock (aioredis 1.x) ---------------------------------------------------------


class AioredlockAdapter(LockAdapter):
    name = "aioredlock"
    dist = "aioredlock"
    auto_renews = True
    note = (
        "`aioredlock.Aioredlock([{host, port}], internal_lock_timeout=lease)` on its own "
        "aioredis 1.3 pool (default maxsize 100); `lock(name)` auto-extends every "
        "0.6 x lease. `lock()` gives up after `retry_count=3` tries (0.1-0.3 s apart) "
        "with LockError, so the adapter calls it again until its timeout."
    )

    async def setup(self, url: str, lease: float, concurrency: int = 64) -> None:
        mod: Any = importlib.import_module("aioredlock")
        self._error: type[Exception] = mod.LockError
        parts = urlsplit(url)
        self._manager: Any = mod.Aioredlock(
            [{"host": parts.hostname or "127.0.0.1", "port": parts.port or 0}],
            internal_lock_timeout=lease,
        )

    async def acquire(self, name: str, timeout: float) -> object:
        deadline = time.monotonic() + timeout
        while True:
            try:
                # A fresh identifier per call: after a failed lock() aioredlock deletes the
                # key for that identifier in the background, which would free our own
                # lock if we retried with the same identifier.
                return await self._manager.lock(name)
            except self._error:
                if time.monotonic() >= deadline:
                    raise AcquireTimeout(name) from None

    async def release(self, handle: object) -> None:
        await self._manager.unlock(handle)

    async def teardown(self) -> None:
        await self._manager.destroy()


ADAPTERS: dict[str, type[LockAdapter]] = {
    cls.name: cls
    for cls in (
        AiolockAdapter,
        AiolockBaselineAdapter,
        RedisPyAdapter,
        PythonRedisLockAdapter,
        PotteryAdapter,
        AioredlockAdapter,
    )
}
#: The library ``--baseline`` adds: aiolock at an older revision.
BASELINE = AiolockBaselineAdapter.name
#: The other libraries (the baseline is aiolock itself, not a peer).
PEERS = [n for n in ADAPTERS if n not in ("aiolock", BASELINE)]
