"""The FastAPI service the service benchmark serves: ``uvicorn benchmarks.peers.service_app:app``.

Environment: ``SERVICE_LOCK`` (``aiolock`` or ``redis-py``) picks the lock, ``REDIS_URL``
the server. ``POST /orders/{order_id}/pay`` holds lock ``order:{order_id}`` around a short
critical section that also checks itself, through Redis keys every worker process shares:

* ``bench:inside:{order_id}`` counts the requests inside the section for that order; a
  request that finds another already there (INCR > 1) counts an overlap in
  ``bench:overlaps``. Under a working lock it stays 0. The checker uses a Redis client
  of its own (a blocking pool), so that it neither fails with nor adds to the load on
  the client under test.
* ``bench:balance:{order_id}`` is bumped with a GET then a SET (a read-modify-write that
  loses updates when two requests interleave): at the end it must equal the number of
  successful requests for that order.

The two variants are written as each library's documentation shows them: aiolock through
its FastAPI dependency (``aiolock.contrib.fastapi``), redis-py with ``client.lock(...)``
and its defaults (polling every 0.1 s while it waits). Errors map to the same statuses:
busy past the timeout 423, lost 409, Redis unavailable 503.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import redis.asyncio
import redis.exceptions
from fastapi import Depends, FastAPI, HTTPException, Request
from redis.asyncio import Redis as redis_asyncio_client

import aiolock
from aiolock.contrib.fastapi import get_lock_manager, lock_dependency, lock_lifespan

LIBRARIES = ("aiolock", "redis-py")
LOCK_TIMEOUT = 10.0  # seconds a request waits for its order's lock (and redis-py's lease)
SECTION_SLEEP = 0.002  # the "work" inside the critical section
OVERLAPS_KEY = "bench:overlaps"
CHECKER_CONNECTIONS = 50  # per worker, for the overlap checker alone
PREFIX = "bench:aiolock"  # aiolock's key prefix; redis-py's lock keys are order:<id>


# At module level: FastAPI resolves the endpoint's (string) annotations in the module's
# globals, where a local of the factory would not be found.
OrderLock = Annotated[
    aiolock.Lock,
    Depends(lock_dependency("order:{order_id}", timeout=LOCK_TIMEOUT), scope="function"),
]


@asynccontextmanager
async def checker_client(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    """The client of the overlap checker: its own pool, apart from the library's.

    Not the client under test: when redis-py's default pool (100 connections) runs out,
    its calls fail with MaxConnectionsError, and a DECR of ``bench:inside:{id}`` failing
    that way after its INCR succeeded would leave the count one too high for good,
    reporting every later request on that order as an overlap. A blocking pool waits for
    a free connection instead of failing (20 s at most).
    """
    pool = redis.asyncio.BlockingConnectionPool.from_url(
        redis_url, max_connections=CHECKER_CONNECTIONS, timeout=20
    )
    client = redis.asyncio.Redis(connection_pool=pool)
    try:
        yield client
    finally:
        await client.aclose()
        await pool.aclose()


async def critical_section(
    client: redis.asyncio.Redis, checker: redis.asyncio.Redis, order_id: str
) -> int:
    """The work done under the lock, with *client*; returns the new balance.

    *checker* counts who is inside (see the module's docstring).
    """
    inside = f"bench:inside:{order_id}"
    count = await checker.incr(inside)
    try:
        if count > 1:
            await checker.incr(OVERLAPS_KEY)
        balance_key = f"bench:balance:{order_id}"
        balance = int(await client.get(balance_key) or 0) + 1
        await client.set(balance_key, balance)
        await asyncio.sleep(SECTION_SLEEP)
        return balance
    finally:
        await checker.decr(inside)


def _aiolock_app(redis_url: str) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        # lock_lifespan inside a lifespan of the app's own, as docs/recipes/fastapi.md shows.
        async with (
            lock_lifespan(redis_url, prefix=PREFIX)(app) as state,
            checker_client(redis_url) as checker,
        ):
            yield {**state, "checker": checker}

    app = FastAPI(lifespan=lifespan)

    @app.post("/orders/{order_id}/pay")
    async def pay(
        order_id: str,
        lock: OrderLock,
        locks: Annotated[aiolock.LockManager, Depends(get_lock_manager)],
        request: Request,
    ) -> dict[str, Any]:
        redis = locks.redis
        assert isinstance(redis, redis_asyncio_client), "the service runs on one Redis server"
        balance = await critical_section(redis, request.state.checker, order_id)
        return {"order": order_id, "balance": balance, "token": lock.fencing_token}

    @app.get("/health")
    async def health(
        locks: Annotated[aiolock.LockManager, Depends(get_lock_manager)],
    ) -> dict[str, Any]:
        await locks.ping()
        return {"lock": "aiolock", "pid": os.getpid()}

    return app


def _redis_py_app(redis_url: str) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        client = redis.asyncio.Redis.from_url(redis_url)  # defaults, as most apps make it
        try:
            async with checker_client(redis_url) as checker:
                yield {"redis": client, "checker": checker}
        finally:
            await client.aclose()

    app = FastAPI(lifespan=lifespan)

    @app.post("/orders/{order_id}/pay")
    async def pay(order_id: str, request: Request) -> dict[str, Any]:
        client: redis.asyncio.Redis = request.state.redis
        lock = client.lock(f"order:{order_id}", timeout=LOCK_TIMEOUT, blocking_timeout=LOCK_TIMEOUT)
        try:
            async with lock:
                balance = await critical_section(client, request.state.checker, order_id)
        except redis.exceptions.LockNotOwnedError as exc:  # released after its lease ran out
            raise HTTPException(409, detail=f"lock order:{order_id} was lost") from exc
        except redis.exceptions.LockError as exc:  # not acquired within blocking_timeout
            raise HTTPException(423, detail=f"lock order:{order_id} is busy") from exc
        except redis.exceptions.RedisError as exc:
            detail = f"the lock service is unavailable: {type(exc).__name__}: {exc}"
            raise HTTPException(503, detail=detail) from exc
        return {"order": order_id, "balance": balance}

    @app.get("/health")
    async def health(request: Request) -> dict[str, Any]:
        await request.state.redis.ping()
        return {"lock": "redis-py", "pid": os.getpid()}

    return app


def create_app() -> FastAPI:
    """The app for ``$SERVICE_LOCK`` and ``$REDIS_URL``."""
    library = os.environ.get("SERVICE_LOCK", "aiolock")
    if library not in LIBRARIES:
        raise RuntimeError(f"SERVICE_LOCK must be one of {', '.join(LIBRARIES)}, got {library!r}")
    redis_url = os.environ.get("REDIS_URL", "")
    if not redis_url:
        raise RuntimeError("set REDIS_URL to the Redis server the benchmark started")
    return _aiolock_app(redis_url) if library == "aiolock" else _redis_py_app(redis_url)


def __getattr__(name: str) -> Any:
    # ``app`` is made when uvicorn asks for it, from the environment, so the benchmark
    # driver can import this module's constants without one.
    if name == "app":
        return create_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
