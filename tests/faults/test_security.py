"""Security: credentials, ACLs, owner ids kept out of logs, keys kept under the prefix.

(The ACL user without EVALSHA and the user limited to other keys are covered in
``test_aiolock_faults.py``; here: wrong and missing passwords, the message naming the
refused command, commands used inside the scripts, a user without SUBSCRIBE, a full run
as a least-privilege user, logs, and a SCAN of every key a varied run leaves behind.)
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

import aiolock
from aiolock._redis.scripts import REQUIRED_COMMANDS
from aiolock.testing import RedisServer
from tests._support.faults import bounded, eventually, unique_prefix
from tests._support.proxy import FaultProxy
from tests._support.servers import AclRedisServer, AclUser

PREFIX = "sec"


@pytest.fixture(scope="module")
def acl() -> Iterator[AclRedisServer]:
    """Users with aiolock's documented command list, minus one command each."""
    users = [
        AclUser.make("full", prefix=PREFIX, commands=REQUIRED_COMMANDS),
        AclUser.make("notime", prefix=PREFIX, commands=REQUIRED_COMMANDS, denied=["time"]),
        AclUser.make("nosub", prefix=PREFIX, commands=REQUIRED_COMMANDS, denied=["subscribe"]),
    ]
    with AclRedisServer(users) as server:
        yield server


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
async def admin(acl: AclRedisServer) -> AsyncIterator[Redis]:
    client = Redis.from_url(acl.admin_url)
    yield client
    await client.aclose()


async def _first_error(url: str, name: str) -> aiolock.LockError:
    client = Redis.from_url(url, retry=Retry(NoBackoff(), 0))
    try:
        # (open() would refuse a wrong password itself: this is about the acquire's error)
        async with aiolock.LockManager(client, prefix=PREFIX, check_on_open=False) as locks:
            with pytest.raises(aiolock.LockError) as caught:
                await bounded(locks.lock(name).acquire(timeout=2), 30, "the acquire")
    finally:
        await client.aclose()
    return caught.value


# -- (a) credentials ---------------------------------------------------------------------


async def test_a_wrong_password_is_a_permission_error(acl: AclRedisServer) -> None:
    user = acl.users["full"]
    wrong = "not-" + user.password
    error = await _first_error(
        f"redis://{user.name}:{wrong}@{acl.host}:{acl.port}/0", "wrong-password"
    )
    assert type(error) is aiolock.LockPermissionError
    message = str(error)
    assert "credentials" in message, message
    assert wrong not in message and user.password not in message, "a password in the message"


async def test_no_password_is_a_permission_error(acl: AclRedisServer) -> None:
    error = await _first_error(f"redis://{acl.host}:{acl.port}/0", "no-password")
    assert type(error) is aiolock.LockPermissionError
    assert "credentials" in str(error), str(error)


async def test_an_unknown_user_is_a_permission_error(acl: AclRedisServer) -> None:
    error = await _first_error(f"redis://nobody:whatever@{acl.host}:{acl.port}/0", "nobody")
    assert type(error) is aiolock.LockPermissionError
    assert "whatever" not in str(error)


# -- (b) ACL: refused commands -----------------------------------------------------------


async def test_a_user_without_evalsha_is_told_which_command_is_refused(
    acl_redis: AclRedisServer,
) -> None:
    client = Redis.from_url(acl_redis.url_for("noscript"), retry=Retry(NoBackoff(), 0))
    try:
        async with aiolock.LockManager(client, prefix="aiolock") as locks:
            with pytest.raises(aiolock.LockPermissionError) as caught:
                await bounded(locks.lock("sec-evalsha").acquire(timeout=2), 30, "acquire")
    finally:
        await client.aclose()
    message = str(caught.value)
    # Redis's own refusal names the command; the advice lists what aiolock needs.
    assert "'evalsha'" in message.lower(), message
    assert "EVALSHA" in message, message


async def test_a_command_refused_inside_a_script_is_a_permission_error(
    acl: AclRedisServer,
) -> None:
    """TIME is called by the acquire script: Redis 7.0 refuses it without naming it, so
    the message lists what aiolock needs, TIME included."""
    error = await _first_error(acl.url_for("notime"), "no-time")
    assert type(error) is aiolock.LockPermissionError, repr(error)
    assert "TIME" in str(error), str(error)


async def test_a_permission_error_carries_no_lua_error_text(acl: AclRedisServer) -> None:
    error = await _first_error(acl.url_for("notime"), "no-time-text")
    assert "@user_script" not in str(error), str(error)


async def test_a_waiter_without_subscribe_gets_a_permission_error(
    acl: AclRedisServer, admin: Redis
) -> None:
    prefix = PREFIX
    holder_client = Redis.from_url(acl.url_for("full"))
    client = Redis.from_url(acl.url_for("nosub"))
    try:
        async with (
            aiolock.LockManager(holder_client, prefix=prefix) as holders,
            aiolock.LockManager(client, prefix=prefix) as locks,
        ):
            held = holders.lock("no-sub")
            await held.acquire()
            try:
                with pytest.raises(aiolock.LockPermissionError):
                    await bounded(locks.lock("no-sub").acquire(timeout=3), 30, "the wait")
            finally:
                await held.release()
    finally:
        await holder_client.aclose()
        await client.aclose()


# -- (c) owner ids stay out of the logs --------------------------------------------------


async def test_manager_ids_never_appear_in_log_records(
    own_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Warnings of every kind (lost leases, a force-release seen by the watchdog, pub/sub
    reconnects, failed renewals, cleanups given up) and debug records: none carries a
    manager's 32-hex-digit id, which owner fields and release ids are made of."""
    caplog.set_level(logging.DEBUG, logger="aiolock")
    url = own_server.url
    prefix = unique_prefix("logs")
    admin = Redis.from_url(url)
    errors: list[BaseException] = []
    async with FaultProxy(own_server.host, own_server.port) as proxy:
        proxied = Redis.from_url(proxy.url, retry=Retry(NoBackoff(), 0))
        clients = [Redis.from_url(url) for _ in range(2)]
        try:
            async with (
                # 1.5 s, renewed: "forced" must still be held when force_release runs
                aiolock.LockManager(clients[0], prefix=prefix, lease=1.5) as one,
                aiolock.LockManager(clients[1], prefix=prefix, lease=30) as two,
                aiolock.LockManager(proxied, prefix=prefix, lease=1.0, command_timeout=0.3) as far,
            ):
                ids = [m._keyspace.manager_id for m in (one, two, far)]
                # a fixed lease running out inside async with
                with pytest.raises(aiolock.LockLostError) as lost:
                    async with one.lock("fixed", lease=0.1):
                        await asyncio.sleep(30)  # the loss, not the body's end, ends it
                errors.append(lost.value)
                # a force-release by another manager, found by the watchdog
                with pytest.raises(aiolock.LockLostError) as forced:
                    async with one.lock("forced"):
                        assert await two.lock("forced").force_release()
                        await asyncio.sleep(30)
                errors.append(forced.value)
                # pub/sub reconnects while a task waits
                await two.lock("wait").acquire()
                waiter = asyncio.create_task(one.lock("wait").acquire(timeout=30))
                await eventually(lambda: one.statistics().hub.subscriptions == 1, what="sub")
                for _ in range(2):
                    await admin.client_kill_filter(_type="pubsub")
                    await asyncio.sleep(0.3)
                await two.lock("wait").release()
                await bounded(waiter, 30, "the waiter")
                # renewal failing, the hold lost by its deadline, its release given up
                async with far.lock("warm-up", timeout=5):
                    pass
                with pytest.raises(aiolock.LockLostError) as cut:
                    async with far.lock("far"):
                        proxy.blackhole()
                        await asyncio.sleep(30)
                errors.append(cut.value)
                with pytest.raises(aiolock.LockConnectionError) as unreachable:
                    await far.lock("far2").acquire(timeout=0)
                errors.append(unreachable.value)

                def gave_up() -> bool:  # the background retries outlived the lease
                    return any("gave up" in r.getMessage() for r in caplog.records)

                await eventually(gave_up, timeout=20, what="a cleanup given up")
                proxy.restore()
                await eventually(lambda: far.statistics().pending_cleanups == 0, what="cleanup")
        finally:
            await proxied.aclose()
            for client in clients:
                await client.aclose()
            await admin.aclose()
    records = [r for r in caplog.records if r.name.startswith("aiolock")]
    texts = [r.getMessage() for r in records]
    texts += [caplog.text]  # formatted records, tracebacks included
    texts += [str(e) for e in errors]
    for manager_id in ids:
        leaks = [t for t in texts if manager_id in t]
        assert leaks == [], f"manager id {manager_id} in: {leaks[:3]}"
    assert not any(re.search(r"\b[0-9a-f]{32}\b", t) for t in texts), "a 32-hex id leaked"
    joined = "\n".join(texts)
    for expected in ("lost:", "pub/sub connection lost", "renewal", "gave up"):
        assert expected in joined, f"no {expected!r} record: the scenario did not happen"


# -- (d) every key under the manager's prefix --------------------------------------------


async def _varied_run(
    locks: aiolock.LockManager, other: aiolock.LockManager, admin: Redis | None = None
) -> set[str]:
    """Acquisitions of many kinds; returns the pub/sub channels *admin* saw while tasks
    waited."""
    names = ["plain", "a:b", "{braced}", "}{", "ü🔒", "other:{x}", "x" * 300]
    for name in names:
        lock = locks.lock(name, timeout=5)
        async with lock, lock:  # entered, then re-entered
            pass
        async with other.lock(name, timeout=5, lease=10):
            pass
    await locks.lock("forced").acquire()
    assert await other.lock("forced").force_release()
    with pytest.raises(aiolock.LockLostError):
        await locks.lock("forced").release()
    # waiters in both managers, channels observed while they wait
    await locks.lock("queue").acquire()

    async def wait(manager: aiolock.LockManager) -> None:
        async with manager.lock("queue", timeout=30):
            pass

    waiters = [asyncio.create_task(wait(m)) for m in (other, other, locks)]
    await eventually(lambda: other.statistics().hub.subscriptions == 1, what="subscription")
    channels: set[str] = set()
    if admin is not None:
        channels = {
            c.decode() if isinstance(c, bytes) else c for c in await admin.pubsub_channels()
        }
    await locks.lock("queue").release()
    await bounded(asyncio.gather(*waiters), 30, "the waiter")

    # cancelled acquisitions (some reach Redis, some are voided)
    async def grab() -> None:
        async with locks.lock("cancelled", timeout=5):
            await asyncio.sleep(0.001)

    for i in range(30):
        task = asyncio.create_task(grab())
        await asyncio.sleep(0.0005 * (i % 4))
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return channels


async def test_every_key_and_channel_stays_under_the_prefix(own_server: RedisServer) -> None:
    url = own_server.url
    first, second = unique_prefix("keys-a"), unique_prefix("keys-b")
    clients = [Redis.from_url(url) for _ in range(4)]
    channels: set[str] = set()
    async with FaultProxy(own_server.host, own_server.port) as proxy:
        proxied = Redis.from_url(proxy.url, retry=Retry(NoBackoff(), 0))
        try:
            for prefix, (a, b) in ((first, clients[:2]), (second, clients[2:])):
                async with (
                    aiolock.LockManager(a, prefix=prefix) as locks,
                    aiolock.LockManager(b, prefix=prefix) as other,
                ):
                    channels |= await _varied_run(locks, other, clients[0])
            # an attempt lost on its way leaves a void marker once its undo gets through
            async with aiolock.LockManager(proxied, prefix=first, command_timeout=0.3) as far:
                async with far.lock("warm-up", timeout=5):
                    pass
                proxy.blackhole("upstream")
                with pytest.raises(aiolock.LockConnectionError):
                    await far.lock("voided").acquire(timeout=0)
                proxy.restore()

                async def voided() -> bool:
                    return bool(await clients[0].keys(f"{first}:lock:{{voided}}:void:*"))

                await eventually(voided, what="the void marker")
            keys = [k.decode() async for k in clients[0].scan_iter(match="*", count=1000)]
        finally:
            await proxied.aclose()
            for client in clients:
                await client.aclose()
    assert keys, "the run left no key at all"
    outside = [k for k in keys if not k.startswith((f"{first}:", f"{second}:"))]
    assert outside == [], outside
    assert any(k.startswith(f"{first}:") for k in keys)
    assert any(k.startswith(f"{second}:") for k in keys)
    assert any(":void:" in k for k in keys), keys  # the run did cover the markers
    assert channels, "no channel seen while a task waited"
    assert all(c.startswith((f"{first}:", f"{second}:")) for c in channels), channels


async def test_a_least_privilege_user_can_do_everything(acl: AclRedisServer) -> None:
    """The same varied run as the user with only the documented commands, keys ``~sec:*``
    and channels ``&sec:*``: Redis itself enforces that nothing strays from the prefix."""
    clients = [Redis.from_url(acl.url_for("full")) for _ in range(2)]
    try:
        async with (
            aiolock.LockManager(clients[0], prefix=PREFIX) as locks,
            aiolock.LockManager(clients[1], prefix=PREFIX) as other,
        ):
            await _varied_run(locks, other)
    finally:
        for client in clients:
            await client.aclose()
