"""Locks and streaming responses under a real uvicorn in this process (issue 23, item 2).

A ``StreamingResponse`` whose body holds a lock across its ``yield``, behind an
``@app.middleware("http")``, with the client leaving mid-stream: anyio raised
"Attempted to exit a cancel scope that isn't the current task's current cancel scope"
(a 500 logged by uvicorn), because the guard's cancel scope stayed on the task while
the body was suspended.
"""

# No "from __future__ import annotations": FastAPI reads the endpoints' annotations.

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest
from fastapi import FastAPI, Request, Response
from fastapi.responses import StreamingResponse
from redis.asyncio import Redis

import aiolock
from aiolock.contrib.fastapi import get_lock_manager, lock_lifespan, locked_streaming_response

from .helpers import lock_held
from .web_servers import uvicorn_serving

CHUNK = b"x" * 65536  # large: the body soon waits for the client to read (back-pressure)


def streaming_app(redis_url: str, prefix: str, entered: asyncio.Event) -> FastAPI:
    app = FastAPI(lifespan=lock_lifespan(redis_url, prefix=prefix, lease=30))

    @app.middleware("http")
    async def passthrough(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        return await call_next(request)

    @app.get("/export")
    async def export(request: Request) -> StreamingResponse:
        locks = get_lock_manager(request)

        async def body() -> AsyncIterator[bytes]:
            async with locks.lock("export"):
                entered.set()
                for _ in range(10_000):
                    yield CHUNK

        return StreamingResponse(body())

    return app


async def read_one_chunk_and_leave(url: str) -> None:
    async with httpx.AsyncClient() as client, client.stream("GET", url) as response:
        assert response.status_code == 200
        async for _ in response.aiter_bytes():
            break  # and the connection closes mid-stream


async def test_a_client_leaving_a_locked_stream_behind_a_middleware_frees_the_lock_cleanly(
    redis_url: str, prefix: str, admin: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    entered = asyncio.Event()
    app = streaming_app(redis_url, prefix, entered)
    key = f"{prefix}:lock:{{export}}"
    with caplog.at_level(logging.WARNING):
        async with uvicorn_serving(app) as base:
            for _ in range(3):
                entered.clear()
                await read_one_chunk_and_leave(f"{base}/export")
                assert entered.is_set()
                started = time.monotonic()
                while await lock_held(admin, key):  # freed while the server runs (lease 30 s)
                    assert time.monotonic() - started < 10, "the lock stayed held"
                    await asyncio.sleep(0.01)
    logged = "\n".join(
        record.getMessage() + (repr(record.exc_info[1]) if record.exc_info else "")
        for record in caplog.records
    )
    assert "cancel scope" not in logged
    assert "Exception in ASGI application" not in logged
    assert "did not enter it" not in logged
    assert "task of its own" not in logged  # the warning names the open block instead


def helper_app(redis_url: str, prefix: str, sent: list[int]) -> FastAPI:
    """GET /export streams under lock 'export' through locked_streaming_response."""
    app = FastAPI(lifespan=lock_lifespan(redis_url, prefix=prefix, lease=30))

    @app.middleware("http")
    async def passthrough(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        return await call_next(request)

    @app.get("/export")
    async def export(request: Request, chunks: int = 10_000) -> StreamingResponse:
        async def body() -> AsyncIterator[bytes]:
            for number in range(chunks):
                sent.append(number)
                yield CHUNK

        locks = get_lock_manager(request)
        return await locked_streaming_response(
            locks.lock("export", timeout=0.2), body(), media_type="application/octet-stream"
        )

    return app


async def test_locked_streaming_response_holds_the_lock_for_the_stream_and_frees_it_on_leaving(
    redis_url: str, prefix: str, admin: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    sent: list[int] = []
    app = helper_app(redis_url, prefix, sent)
    key = f"{prefix}:lock:{{export}}"
    with caplog.at_level(logging.WARNING):
        async with uvicorn_serving(app) as base, httpx.AsyncClient(base_url=base) as client:
            async with client.stream("GET", "/export") as streaming:
                assert streaming.status_code == 200
                chunks = streaming.aiter_bytes()  # kept: closing it would close the connection
                await chunks.__anext__()
                assert await admin.exists(key)  # held while the stream runs
                busy = await client.get("/export", params={"chunks": 1})
                assert busy.status_code == 423  # refused before anything was sent
                await streaming.aclose()  # the client leaves mid-stream
            started = time.monotonic()
            while await lock_held(admin, key):  # the client left: freed while the server runs
                assert time.monotonic() - started < 10, "the lock stayed held"
                await asyncio.sleep(0.01)
            whole = await client.get("/export", params={"chunks": 3})
            assert whole.status_code == 200 and len(whole.content) == 3 * len(CHUNK)
            assert not await lock_held(admin, key)
            manager: aiolock.LockManager = app.state.aiolock
            assert manager.statistics().released_on_task_exit == 0
    assert len(sent) < 10_000  # the stream stopped when its client left
    assert [r.getMessage() for r in caplog.records if r.name == "aiolock"] == []
