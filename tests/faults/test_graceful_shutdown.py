"""Issue 23, item 1: a graceful shutdown must leave no lock held behind it.

Web servers stop gracefully by cancelling the handler tasks and then closing the app's
manager, without waiting for the handlers to finish. A cancelled holder's release used to
hand its lock to a local waiter that was being cancelled too; the hand-over landed after
the manager had closed, the release passing it on was queued and then failed by the
closing client ("not sent: the manager closed"), and the key stayed for a whole lease.
With Redis one millisecond away (FaultProxy latency) that left 5 of 10 names held on
every run.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

import aiolock
from aiolock._engine.waiter import Waiter
from aiolock.testing import RedisServer
from tests._support.faults import eventually
from tests._support.helpers import lock_held
from tests._support.proxy import FaultProxy

NAMES = 10
PER_NAME = 3  # one holder and two waiters per name
LEASE = 60.0  # a leaked key would outlive every bound of these tests


@pytest.fixture
async def direct(fault_redis_server: RedisServer) -> AsyncIterator[Redis]:
    """A client that goes around the proxy, to look at what the manager left."""
    client = Redis.from_url(fault_redis_server.url)
    yield client
    await client.aclose()


async def _held_locks(admin: Redis, prefix: str) -> list[bytes]:
    """The lock keys (``P:lock:{name}``) under *prefix* that are held: not the void
    markers, nor a free state (issue 21: ``|<epoch>|<last token>``, kept after a release)."""
    return [
        key
        async for key in admin.scan_iter(f"{prefix}:lock:*", count=1000)
        if key.endswith(b"}") and await lock_held(admin, key.decode())
    ]


@pytest.mark.parametrize("hand_over_to_cancelled", [False, True])
async def test_cancelled_holders_and_waiters_then_an_immediate_close_leave_no_lock(
    fault_proxy: FaultProxy,
    direct: Redis,
    monkeypatch: pytest.MonkeyPatch,
    hand_over_to_cancelled: bool,
) -> None:
    """Plain asyncio: N tasks hold or wait on 10 names; all are cancelled and, one loop
    step later (a server's lifespan does not run in the same step), the manager closes
    without waiting for them. Every lock must be free when aclose() returns.

    Two mechanisms see to it: a releasing task does not hand its lock to a waiter being
    cancelled, and closing waits for the releases in progress. *hand_over_to_cancelled*
    turns the first off (a waiter cancelled just after it was chosen looks the same), so
    that the second is tested on its own."""
    if hand_over_to_cancelled:
        monkeypatch.setattr(Waiter, "cancelling", property(lambda self: False), raising=False)
    fault_proxy.set_latency(0.001)
    for run in range(3):
        prefix = f"t-{uuid.uuid4().hex[:12]}"
        client = Redis.from_url(fault_proxy.url)
        try:
            manager = aiolock.LockManager(client, prefix=prefix, lease=LEASE)
            await manager.open()
            tasks = await _hold_and_wait(manager)
            for task in tasks:
                task.cancel()
            await asyncio.sleep(0)  # the tasks start releasing before the close
            await manager.aclose()
            left = await _held_locks(direct, prefix)
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            await client.aclose()
        assert left == [], f"run {run}: {len(left)} of {NAMES} locks left held: {left}"


async def _hold_and_wait(manager: aiolock.LockManager) -> list[asyncio.Task[None]]:
    """Start PER_NAME tasks per name, each holding its name until cancelled; return them
    once every name is held and every other task waits."""

    async def hold(i: int) -> None:
        async with manager.lock(f"n{i % NAMES}"):
            await asyncio.sleep(3600)

    tasks = [asyncio.create_task(hold(i)) for i in range(NAMES * PER_NAME)]
    waiting = NAMES * (PER_NAME - 1)
    await eventually(
        lambda: manager.statistics().held == NAMES and manager.statistics().hub.waiters == waiting,
        timeout=20,
        what=f"{NAMES} holders and {waiting} waiters",
    )
    return tasks


async def test_closing_sends_a_release_queued_for_a_background_retry(
    fault_proxy: FaultProxy, direct: Redis
) -> None:
    """A release that could not reach Redis is parked and queued for a background retry.
    Redis comes back and the manager closes at once: closing tries the queued release
    once more (it used to stop the retrier first, and the lock stayed for its lease)."""
    prefix = f"t-{uuid.uuid4().hex[:12]}"
    client = Redis.from_url(fault_proxy.url, retry=Retry(NoBackoff(), 0))
    try:
        manager = aiolock.LockManager(client, prefix=prefix, lease=LEASE, command_timeout=0.3)
        await manager.open()
        try:
            async with manager.lock("warm-up"):  # connect and load the scripts first
                pass
            lock = manager.lock("queued")
            await lock.acquire()
            fault_proxy.blackhole()
            with pytest.raises(aiolock.LockConnectionError):
                await lock.release()
            assert manager.statistics().pending_cleanups == 1
            fault_proxy.restore()
        finally:
            await manager.aclose()
        left = await _held_locks(direct, prefix)
    finally:
        fault_proxy.restore()
        await client.aclose()
    assert left == [], f"locks left held after the close: {left}"


# -- aiohttp ------------------------------------------------------------------------------


async def test_aiohttp_graceful_shutdown_leaves_no_lock(
    fault_proxy: FaultProxy, direct: Redis
) -> None:
    """A real aiohttp app (AppRunner + TCPSite, lock_manager_ctx) with holders and waiters
    on 10 names is stopped with ``runner.cleanup()``: aiohttp waits ``shutdown_timeout``,
    cancels the handlers, then runs the cleanup_ctx that closes the manager."""
    fault_proxy.set_latency(0.001)
    left, _ = await _serve_and_stop(fault_proxy.url, direct)
    assert left == [], f"{len(left)} of {NAMES} locks left held after the shutdown: {left}"


async def test_aiohttp_graceful_shutdown_answers_waiting_requests_with_503(
    fault_proxy: FaultProxy, direct: Redis
) -> None:
    """The documented status: requests waiting for a lock when the server stops get 503
    (lock_manager_ctx stops the manager acquiring in on_shutdown, before aiohttp cancels
    the handlers); they used to be cancelled, their connections dropped. The holders,
    cancelled after shutdown_timeout, have their connections closed (aiohttp's doing)."""
    left, statuses = await _serve_and_stop(fault_proxy.url, direct)
    waiting = NAMES * (PER_NAME - 1)
    assert statuses.count(503) == waiting, statuses
    assert len(statuses) == NAMES * PER_NAME and left == []


async def _serve_and_stop(redis_url: str, direct: Redis) -> tuple[list[bytes], list[int | str]]:
    """Serve an app whose requests hold a lock until cancelled (PER_NAME per name), stop
    it gracefully once every name is held; the locks left held and each request's status
    (or the exception its client saw)."""
    pytest.importorskip("aiohttp")
    from aiohttp import ClientSession, ClientTimeout, web

    from aiolock.contrib.aiohttp import LOCK_MANAGER, lock_error_middleware, lock_manager_ctx

    prefix = f"t-{uuid.uuid4().hex[:12]}"
    app = web.Application(middlewares=[lock_error_middleware()])
    app.cleanup_ctx.append(lock_manager_ctx(redis_url, prefix=prefix, lease=LEASE))

    async def hold(request: web.Request) -> web.Response:
        async with request.app[LOCK_MANAGER].lock(request.match_info["name"]):
            await asyncio.sleep(3600)
        return web.Response(text="done")

    app.router.add_post("/hold/{name}", hold)
    runner = web.AppRunner(app, shutdown_timeout=0.2, handler_cancellation=True)
    await runner.setup()
    # Port 0, then the port the site got: a port picked beforehand could be taken by
    # another suite running at the same time (issue 25).
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = int(runner.addresses[0][1])
    manager = app[LOCK_MANAGER]
    statuses: list[int | str] = []

    async def call(session: ClientSession, name: str) -> None:
        try:
            async with session.post(f"http://127.0.0.1:{port}/hold/{name}") as response:
                statuses.append(response.status)
        except Exception as exc:  # a connection the stopping server dropped
            statuses.append(type(exc).__name__)

    async with ClientSession(timeout=ClientTimeout(total=30)) as session:
        calls = [
            asyncio.create_task(call(session, f"n{i % NAMES}")) for i in range(NAMES * PER_NAME)
        ]
        try:
            await eventually(
                lambda: (
                    manager.statistics().held == NAMES
                    and manager.statistics().hub.waiters == NAMES * (PER_NAME - 1)
                ),
                timeout=20,
                what="every name held, the other requests waiting",
            )
        finally:
            await runner.cleanup()
        left = await _held_locks(direct, prefix)
        await asyncio.wait_for(asyncio.gather(*calls), 30)
    assert not manager.is_open
    return left, statuses
