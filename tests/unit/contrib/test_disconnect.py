"""Clients that disconnect, under real servers in this process (issue 23, item 4).

uvicorn (FastAPI) never cancels an endpoint whose client left, and aiohttp's
``web.run_app`` does not either (``handler_cancellation`` is off): a request waiting for
a lock took it later and ran its body for nobody. The integrations watch the client.
Each test counts who ran under the lock: the next holder is the next *live* client.
"""

# No "from __future__ import annotations": FastAPI reads the endpoints' annotations.

import asyncio
from collections.abc import Awaitable, Callable
from typing import Annotated

import httpx
import pytest
from aiohttp import web
from fastapi import Depends, FastAPI, Request, Response

import aiolock
from aiolock.contrib.aiohttp import LOCK_MANAGER, client_lock, lock_manager_ctx
from aiolock.contrib.fastapi import lock_dependency, lock_lifespan
from tests._support.web_servers import aiohttp_serving, leaving_client, until, uvicorn_serving


def fastapi_app(
    redis_url: str,
    prefix: str,
    ran: list[str],
    gate: asyncio.Event,
    *,
    cancel: bool = False,
    middleware: bool = False,
) -> FastAPI:
    """GET /jobs/{who} holds lock 'job'; 'first' waits at *gate* while holding it."""
    app = FastAPI(lifespan=lock_lifespan(redis_url, prefix=prefix, lease=30))
    if middleware:  # a BaseHTTPMiddleware wraps the receive channel the watch listens on

        @app.middleware("http")
        async def passthrough(
            request: Request, call_next: Callable[[Request], Awaitable[Response]]
        ) -> Response:
            return await call_next(request)

    held = Depends(lock_dependency("job", cancel_on_disconnect=cancel), scope="function")

    @app.get("/jobs/{who}")
    async def job(who: str, lock: Annotated[aiolock.Lock, held]) -> dict[str, str]:
        ran.append(who)
        if who.startswith("first"):
            await gate.wait()
        ran.append(f"{who} done")
        return {"who": who}

    return app


def waiters(app: FastAPI) -> int:
    manager: aiolock.LockManager = app.state.aiolock
    return manager.statistics().hub.waiters


@pytest.mark.parametrize("middleware", [False, True], ids=["plain", "http middleware"])
async def test_uvicorn_a_waiter_whose_client_left_never_takes_the_lock(
    redis_url: str, prefix: str, middleware: bool
) -> None:
    ran: list[str] = []
    gate = asyncio.Event()
    app = fastapi_app(redis_url, prefix, ran, gate, middleware=middleware)
    async with uvicorn_serving(app) as base, httpx.AsyncClient(base_url=base) as client:
        first = asyncio.create_task(client.get("/jobs/first"))
        await until(lambda: ran == ["first"], "the first request holds the lock")
        async with leaving_client(base, "/jobs/gone"):
            await until(lambda: waiters(app) == 1, "the second request waits")
        await until(lambda: waiters(app) == 0, "the request whose client left stops waiting")
        following = asyncio.create_task(client.get("/jobs/next"))
        await until(lambda: waiters(app) == 1, "the third request waits")
        gate.set()
        assert (await first).status_code == 200
        assert (await following).status_code == 200
    assert ran == ["first", "first done", "next", "next done"]


async def test_uvicorn_cancel_on_disconnect_frees_the_lock_of_a_holder_whose_client_left(
    redis_url: str, prefix: str
) -> None:
    ran: list[str] = []
    gate = asyncio.Event()  # never set: only the disconnect ends the first request
    app = fastapi_app(redis_url, prefix, ran, gate, cancel=True)
    async with uvicorn_serving(app) as base, httpx.AsyncClient(base_url=base) as client:
        async with leaving_client(base, "/jobs/first-gone"):
            await until(lambda: ran == ["first-gone"], "the first request holds the lock")
        response = await asyncio.wait_for(client.get("/jobs/next"), 10)
        assert response.status_code == 200
    assert ran == ["first-gone", "next", "next done"]


def aiohttp_app(
    redis_url: str, prefix: str, ran: list[str], gate: asyncio.Event, *, cancel: bool = False
) -> web.Application:
    async def job(request: web.Request) -> web.Response:
        who = request.match_info["who"]
        locks = request.app[LOCK_MANAGER]
        async with client_lock(request, locks.lock("job"), cancel_on_disconnect=cancel):
            ran.append(who)
            if who.startswith("first"):
                await gate.wait()
            ran.append(f"{who} done")
        return web.json_response({"who": who})

    app = web.Application()
    app.cleanup_ctx.append(lock_manager_ctx(redis_url, prefix=prefix, lease=30))
    app.router.add_get("/jobs/{who}", job)
    return app


def aiohttp_waiters(app: web.Application) -> int:
    return app[LOCK_MANAGER].statistics().hub.waiters


async def test_aiohttp_run_app_a_waiter_whose_client_left_never_takes_the_lock(
    redis_url: str, prefix: str
) -> None:
    ran: list[str] = []
    gate = asyncio.Event()
    app = aiohttp_app(redis_url, prefix, ran, gate)
    async with aiohttp_serving(app) as base, httpx.AsyncClient(base_url=base) as client:
        first = asyncio.create_task(client.get("/jobs/first"))
        await until(lambda: ran == ["first"], "the first request holds the lock")
        async with leaving_client(base, "/jobs/gone"):
            await until(lambda: aiohttp_waiters(app) == 1, "the second request waits")
        await until(lambda: aiohttp_waiters(app) == 0, "the request whose client left stops")
        following = asyncio.create_task(client.get("/jobs/next"))
        await until(lambda: aiohttp_waiters(app) == 1, "the third request waits")
        gate.set()
        assert (await first).status_code == 200
        assert (await following).status_code == 200
    assert ran == ["first", "first done", "next", "next done"]


async def test_aiohttp_cancel_on_disconnect_frees_the_lock_of_a_holder_whose_client_left(
    redis_url: str, prefix: str
) -> None:
    ran: list[str] = []
    gate = asyncio.Event()
    app = aiohttp_app(redis_url, prefix, ran, gate, cancel=True)
    async with aiohttp_serving(app) as base, httpx.AsyncClient(base_url=base) as client:
        async with leaving_client(base, "/jobs/first-gone"):
            await until(lambda: ran == ["first-gone"], "the first request holds the lock")
        response = await asyncio.wait_for(client.get("/jobs/next"), 10)
        assert response.status_code == 200
    assert ran == ["first-gone", "next", "next done"]
