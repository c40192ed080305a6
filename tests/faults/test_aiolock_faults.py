"""aiolock under faults the FaultProxy and the ACL/TLS servers inject.

Two tests are regression tests for defects the stress checker (``--faults``) found: a
task re-entering a hold whose release had failed (the background retry then deleted the
lock under it), and ``command_timeout`` using ``asyncio.timeout`` as a sync context.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock.testing import RedisServer
from tests._support.faults import eventually
from tests._support.proxy import FaultProxy
from tests._support.servers import AclRedisServer, TlsRedisServer


def _prefix() -> str:
    return f"aiolock:f-{uuid.uuid4().hex[:8]}"


async def _release_fails_then_reacquire(
    server: RedisServer,
) -> tuple[int | None, int | None, bool, bool]:
    """Acquire; make the release fail with a connection error; re-acquire in the same
    task. Returns (first token, second token, key exists right after re-acquire, key
    exists 3 s later while still inside)."""
    direct = Redis.from_url(server.url)
    prefix = _prefix()
    try:
        async with FaultProxy(server.host, server.port) as proxy:
            client = Redis.from_url(proxy.url)
            async with aiolock.LockManager(client, prefix=prefix, lease=5.0) as locks:
                lock = locks.lock("x")
                await lock.acquire(timeout=5)
                first = lock.fencing_token
                proxy.refuse(True)  # no new connection gets through ...
                proxy.drop_all()  # ... and the current ones are reset
                with pytest.raises(aiolock.LockConnectionError):
                    await lock.release()
                proxy.refuse(False)
                async with locks.lock("x", timeout=5) as again:
                    second = again.fencing_token
                    exists_now = bool(await direct.exists(f"{prefix}:lock:{{x}}"))
                    # the background release retry runs (waited for, not slept on)
                    await eventually(
                        lambda: locks.statistics().pending_cleanups == 0,
                        what="the background release retry",
                    )
                    exists_later = bool(await direct.exists(f"{prefix}:lock:{{x}}"))
            await client.aclose()
    finally:
        await direct.aclose()
    return first, second, exists_now, exists_later


async def test_reacquire_after_failed_release_is_a_new_hold(
    fault_redis_server: RedisServer,
) -> None:
    first, second, exists_now, exists_later = await _release_fails_then_reacquire(
        fault_redis_server
    )
    assert isinstance(first, int)
    assert isinstance(second, int)
    assert second > first, "a new acquisition must get a larger fencing token"
    assert exists_now
    assert exists_later, "the lock vanished from Redis while its holder was inside"


async def test_command_timeout_works(fault_redis_server: RedisServer) -> None:
    client = Redis.from_url(fault_redis_server.url)
    try:
        async with (
            aiolock.LockManager(client, prefix=_prefix(), command_timeout=1.0) as locks,
            locks.lock("x", timeout=5) as lock,
        ):
            assert isinstance(lock.fencing_token, int)
    finally:
        await client.aclose()


async def test_blackholed_acquire_fails_with_connection_error(
    fault_redis_server: RedisServer,
) -> None:
    """A server that stops answering surfaces as LockConnectionError (socket_timeout)."""
    async with FaultProxy(fault_redis_server.host, fault_redis_server.port) as proxy:
        client = Redis.from_url(proxy.url, socket_timeout=0.5, socket_connect_timeout=0.5)
        try:
            async with aiolock.LockManager(client, prefix=_prefix()) as locks:
                proxy.blackhole()
                with pytest.raises(aiolock.LockConnectionError):
                    await asyncio.wait_for(locks.lock("x").acquire(timeout=1), 30)
                proxy.restore()
                async with locks.lock("y", timeout=10) as lock:
                    assert isinstance(lock.fencing_token, int)
        finally:
            await client.aclose()


async def test_acl_locker_user_can_lock(acl_redis: AclRedisServer) -> None:
    client = Redis.from_url(acl_redis.url_for("locker"))
    try:
        async with aiolock.LockManager(client, prefix="aiolock") as locks:
            async with locks.lock("acl", timeout=5) as lock:
                first = lock.fencing_token
            async with locks.lock("acl", timeout=5) as lock:
                assert isinstance(first, int)
                assert lock.fencing_token is not None
                assert lock.fencing_token > first
    finally:
        await client.aclose()


async def test_acl_noscript_user_gets_permission_error(acl_redis: AclRedisServer) -> None:
    client = Redis.from_url(acl_redis.url_for("noscript"))
    try:
        async with aiolock.LockManager(client, prefix="aiolock") as locks:
            with pytest.raises(aiolock.LockPermissionError):
                await locks.lock("acl-denied").acquire(timeout=2)
    finally:
        await client.aclose()


async def test_acl_wrong_key_pattern_gets_permission_error(acl_redis: AclRedisServer) -> None:
    client = Redis.from_url(acl_redis.url_for("otherkeys"))
    try:
        async with aiolock.LockManager(client, prefix="aiolock") as locks:
            with pytest.raises(aiolock.LockPermissionError):
                await locks.lock("acl-keys").acquire(timeout=2)
    finally:
        await client.aclose()


async def test_tls_lock(tls_redis: TlsRedisServer) -> None:
    client = Redis.from_url(tls_redis.url, ssl_ca_certs=tls_redis.ca_path)
    try:
        async with (
            aiolock.LockManager(client, prefix=_prefix()) as locks,
            locks.lock("tls", timeout=5) as lock,
        ):
            assert isinstance(lock.fencing_token, int)
    finally:
        await client.aclose()
