"""The ACL and TLS servers work with a plain redis.asyncio client."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.exceptions
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from tests._support.proxy import FaultProxy
from tests._support.servers import AclRedisServer, AclUser, TlsRedisServer, redis_tls_support

SCRIPT = "return redis.call('PING')"


@pytest.fixture
async def client_factory() -> AsyncIterator[Callable[..., Redis]]:
    made: list[Redis] = []

    def make(url: str, **kwargs: Any) -> Redis:
        client = Redis.from_url(url, retry=Retry(NoBackoff(), 0), **kwargs)
        made.append(client)
        return client

    yield make
    for client in made:
        await client.aclose()


# -- ACL -------------------------------------------------------------------------------


def test_acl_rules_shape() -> None:
    user = AclUser.make("u", prefix="app", commands=("get", "evalsha", "eval"), denied=["EVAL"])
    rules = user.rules()
    assert rules[:2] == ["reset", "on"]
    assert "~app:*" in rules
    assert "&app:*" in rules
    assert "+evalsha" in rules
    assert "+eval" not in rules
    with pytest.raises(ValueError, match="unspaced"):
        AclUser.make("u", prefix="a b").rules()


async def test_acl_users_ping_and_admin_sees_them(
    acl_redis: AclRedisServer, client_factory: Callable[..., Redis]
) -> None:
    admin = client_factory(acl_redis.admin_url)
    users = await admin.acl_users()
    names = {u.decode() if isinstance(u, bytes) else str(u) for u in users}
    assert names >= {"default", "locker", "noscript", "otherkeys"}
    for name in ("locker", "noscript", "otherkeys"):
        assert await client_factory(acl_redis.url_for(name)).ping()


async def test_acl_anonymous_and_wrong_password_refused(
    acl_redis: AclRedisServer, client_factory: Callable[..., Redis]
) -> None:
    anonymous = client_factory(f"redis://{acl_redis.host}:{acl_redis.port}/0")
    with pytest.raises(redis.exceptions.AuthenticationError):
        await anonymous.ping()
    wrong = client_factory(f"redis://locker:wrong@{acl_redis.host}:{acl_redis.port}/0")
    with pytest.raises(redis.exceptions.AuthenticationError):
        await wrong.ping()


async def test_acl_locker_may_run_scripts_on_its_prefix(
    acl_redis: AclRedisServer, client_factory: Callable[..., Redis]
) -> None:
    locker = client_factory(acl_redis.url_for("locker"))
    sha = await locker.script_load(SCRIPT)
    assert await locker.evalsha(sha, 1, "aiolock:{x}") == b"PONG"
    assert await locker.hset("aiolock:{x}", "f", 1) == 1
    assert await locker.delete("aiolock:{x}") == 1
    assert await locker.publish("aiolock:{x}:released", "m") == 0
    with pytest.raises(redis.exceptions.NoPermissionError):
        await locker.hget("elsewhere:{x}", "f")
    with pytest.raises(redis.exceptions.NoPermissionError):
        await locker.publish("elsewhere:{x}:released", "m")
    with pytest.raises(redis.exceptions.NoPermissionError):
        await locker.flushall()


async def test_acl_noscript_user_gets_nopermission_for_evalsha(
    acl_redis: AclRedisServer, client_factory: Callable[..., Redis]
) -> None:
    sha = await client_factory(acl_redis.url_for("locker")).script_load(SCRIPT)
    noscript = client_factory(acl_redis.url_for("noscript"))
    assert await noscript.exists("aiolock:{x}") == 0  # other commands still work
    with pytest.raises(redis.exceptions.NoPermissionError):
        await noscript.evalsha(sha, 1, "aiolock:{x}")
    with pytest.raises(redis.exceptions.NoPermissionError):
        await noscript.eval(SCRIPT, 1, "aiolock:{x}")


async def test_acl_otherkeys_user_cannot_touch_the_prefix(
    acl_redis: AclRedisServer, client_factory: Callable[..., Redis]
) -> None:
    other = client_factory(acl_redis.url_for("otherkeys"))
    sha = await other.script_load(SCRIPT)
    assert await other.evalsha(sha, 1, "other-aiolock:{x}") == b"PONG"
    with pytest.raises(redis.exceptions.NoPermissionError):
        await other.evalsha(sha, 1, "aiolock:{x}")


# -- TLS -------------------------------------------------------------------------------


def test_tls_probe_reports() -> None:
    supported, why = redis_tls_support()
    assert why  # evidence either way; the tls_redis fixture skips when unsupported
    print(f"redis-server TLS support: {supported} ({why})")


async def test_tls_ping_with_ca(
    tls_redis: TlsRedisServer, client_factory: Callable[..., Redis]
) -> None:
    assert tls_redis.url.startswith("rediss://127.0.0.1:")
    client = client_factory(tls_redis.url, ssl_ca_certs=tls_redis.ca_path)
    assert await client.ping()
    config = await client.config_get("*port")
    assert config["port"] == "0"  # no plain-text listener at all
    assert config["tls-port"] == str(tls_redis.port)


async def test_tls_untrusted_client_fails(
    tls_redis: TlsRedisServer, client_factory: Callable[..., Redis]
) -> None:
    client = client_factory(tls_redis.url, socket_connect_timeout=2.0)  # system CAs only
    with pytest.raises(redis.exceptions.ConnectionError):
        await client.ping()
    plain = client_factory(f"redis://127.0.0.1:{tls_redis.port}/0", socket_timeout=2.0)
    with pytest.raises((redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
        await plain.ping()


async def test_tls_through_fault_proxy(
    tls_redis: TlsRedisServer, client_factory: Callable[..., Redis]
) -> None:
    async with FaultProxy(tls_redis.host, tls_redis.port, scheme="rediss") as proxy:
        client = client_factory(proxy.url, ssl_ca_certs=tls_redis.ca_path, socket_timeout=0.5)
        assert await client.ping()
        proxy.blackhole()
        with pytest.raises(redis.exceptions.TimeoutError):
            await client.ping()
        proxy.restore()
        assert await client.ping()


def test_tls_ssl_context_verifies_hostname(tls_redis: TlsRedisServer) -> None:
    ctx = tls_redis.client_ssl_context()
    assert ctx.check_hostname
    assert ctx.verify_mode == ssl.CERT_REQUIRED
