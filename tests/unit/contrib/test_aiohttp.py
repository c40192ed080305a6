"""aiolock.contrib.aiohttp against a real redis-server, with aiohttp's own test server."""

from __future__ import annotations

import asyncio
import importlib
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from redis.asyncio import Redis

import aiolock
from aiolock.contrib.aiohttp import LOCK_MANAGER, lock_error_middleware, lock_manager_ctx
from aiolock.testing import RedisServer
from tests._support.helpers import closed_port


@asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    """Start the app (running its cleanup_ctx) on a loopback port, and a client for it."""
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        yield client


def order_app(source: Any, **options: Any) -> web.Application:
    """POST /orders/{order_id}/pay holds lock order:{order_id} (timeout from ?timeout=)."""
    app = web.Application(middlewares=[lock_error_middleware(**options)])
    app.cleanup_ctx.append(lock_manager_ctx(source))

    async def pay(request: web.Request) -> web.Response:
        locks = request.app[LOCK_MANAGER]
        timeout = float(request.query.get("timeout", "5"))
        name = f"order:{request.match_info['order_id']}"
        async with locks.lock(name, timeout=timeout) as lock:
            return web.json_response({"token": lock.fencing_token, "owned": await lock.owned()})

    app.router.add_post("/orders/{order_id}/pay", pay)
    return app


async def test_the_cleanup_ctx_opens_and_closes_one_manager(redis_url: str, prefix: str) -> None:
    app = order_app(lambda: aiolock.LockManager.from_url(redis_url, prefix=prefix))
    async with serve(app) as client:
        manager = app[LOCK_MANAGER]
        assert manager.is_open and manager.prefix == prefix
        response = await client.post("/orders/1/pay")
        assert response.status == 200
        body = await response.json()
        assert body["owned"] is True and isinstance(body["token"], int)
        assert not await manager.lock("order:1").locked()
    assert not manager.is_open


async def test_requests_for_one_order_take_turns(redis_url: str, prefix: str) -> None:
    app = web.Application()
    app.cleanup_ctx.append(lock_manager_ctx(redis_url, prefix=prefix))
    inside = {"n": 0, "most": 0}

    async def pay(request: web.Request) -> web.Response:
        async with request.app[LOCK_MANAGER].lock(f"order:{request.match_info['id']}"):
            inside["n"] += 1
            inside["most"] = max(inside["most"], inside["n"])
            await asyncio.sleep(0.01)
            inside["n"] -= 1
        return web.Response(text="paid")

    app.router.add_post("/orders/{id}/pay", pay)
    async with serve(app) as client:
        responses = await asyncio.gather(*(client.post("/orders/8/pay") for _ in range(12)))
        assert [r.status for r in responses] == [200] * 12
    assert inside["most"] == 1


async def test_the_middleware_maps_a_busy_lock_to_423_or_the_configured_status(
    redis_url: str, prefix: str, locks: aiolock.LockManager
) -> None:
    async with serve(order_app(_url(redis_url, prefix))) as client:
        async with locks.lock("order:2"):
            response = await client.post("/orders/2/pay", params={"timeout": "0.1"})
            assert response.status == 423
            assert "order:2" in (await response.json())["detail"]
        assert (await client.post("/orders/2/pay")).status == 200
        assert (await client.post("/nowhere")).status == 404  # other errors pass through
    app = order_app(_url(redis_url, prefix), timeout_status=409)
    async with serve(app) as client, locks.lock("order:2"):
        assert (await client.post("/orders/2/pay", params={"timeout": "0"})).status == 409


async def test_a_lost_lock_gives_409_before_the_response(
    redis_url: str, prefix: str, admin: Redis
) -> None:
    app = web.Application(middlewares=[lock_error_middleware()])
    app.cleanup_ctx.append(lock_manager_ctx(redis_url, prefix=prefix, lease=1.5))
    finished: list[str] = []

    async def pay(request: web.Request) -> web.Response:
        order = request.match_info["id"]
        async with request.app[LOCK_MANAGER].lock(f"order:{order}") as lock:
            async with aiolock.LockManager(admin, prefix=prefix) as other:
                await other.lock(lock.name).force_release()
            if request.query.get("wait"):
                await asyncio.sleep(30)  # cancelled when renewal finds the loss
            finished.append(order)
        return web.Response(text="paid")

    app.router.add_post("/orders/{id}/pay", pay)
    async with serve(app) as client:
        assert (await client.post("/orders/1/pay")).status == 409  # found at release
        started = time.monotonic()
        assert (await client.post("/orders/2/pay", params={"wait": "1"})).status == 409
        elapsed = time.monotonic() - started
        # renewal (every 0.5 s) finds the loss; 15 s: room for a loaded machine, far
        # below the endpoint's 30 s
        assert elapsed < 15, f"the loss cancelled the endpoint after {elapsed:.1f} s"
    assert finished == ["1"]


async def test_redis_unreachable_gives_503(prefix: str) -> None:
    with closed_port() as port:
        dead = f"redis://127.0.0.1:{port}/0"
        # (an app that starts before Redis: open() does not check the server)
        async with serve(order_app(_url(dead, prefix, check_on_open=False))) as client:
            response = await client.post("/orders/1/pay", params={"timeout": "0.3"})
            assert response.status == 503
            assert response.headers["Retry-After"].isdigit()  # a client may come back


async def test_every_request_waiting_during_an_outage_gives_503(prefix: str) -> None:
    """Issue 18 item 6: requests queued behind one free lock while Redis is down all get
    503, not 423 (only the head of the manager's queue talks to Redis)."""
    with RedisServer() as server:
        async with serve(order_app(_url(server.url, prefix))) as client:
            assert (await client.post("/orders/1/pay")).status == 200
            server.stop()
            responses = await asyncio.wait_for(
                asyncio.gather(
                    *(client.post("/orders/1/pay", params={"timeout": "2"}) for _ in range(10))
                ),
                30,
            )
            assert [r.status for r in responses] == [503] * 10


async def test_a_key_of_ones_own_and_a_manager_given(redis_url: str, prefix: str) -> None:
    key = web.AppKey("orders-locks", aiolock.LockManager)
    manager = aiolock.LockManager.from_url(redis_url, prefix=prefix)
    app = web.Application()
    app.cleanup_ctx.append(lock_manager_ctx(manager, key=key))
    async with serve(app):
        assert app[key] is manager and manager.is_open
        assert LOCK_MANAGER not in app
    assert not manager.is_open


def test_arguments_are_checked() -> None:
    with pytest.raises(TypeError, match="URL"):
        lock_manager_ctx(lambda: aiolock.LockManager.from_url("redis://127.0.0.1:1"), lease=3)
    with pytest.raises(ValueError, match="400-599"):
        lock_error_middleware(lost_status=302)


def _url(redis_url: str, prefix: str, *, check_on_open: bool = True) -> Any:
    """A manager factory for *redis_url* with the test's prefix."""
    return lambda: aiolock.LockManager.from_url(
        redis_url, prefix=prefix, check_on_open=check_on_open
    )


@pytest.mark.parametrize("framework", ["aiohttp", "fastapi"])
def test_a_missing_framework_names_the_extra(
    framework: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = f"aiolock.contrib.{framework}"
    monkeypatch.setitem(sys.modules, framework, None)  # import fails as if not installed
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(ImportError, match=rf"pip install 'aiolock\[{framework}\]'"):
        importlib.import_module(module)


def test_import_aiolock_imports_no_framework() -> None:
    code = (
        "import sys, aiolock; print(sorted({'aiohttp', 'fastapi', 'starlette'} & set(sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"
