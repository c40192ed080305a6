"""pytest fixtures for the fault tools.

Active for tests under ``tests/faults/`` (via its ``conftest.py``). To use them in
another tier, import them into that tier's ``conftest.py`` the same way.

Fixtures:

* ``fault_redis_server`` (session): a private :class:`RedisServer` for proxy tests.
* ``fault_proxy`` (function): a started :class:`FaultProxy` in front of it.
* ``acl_redis`` (session): a started :class:`AclRedisServer` from :func:`acl_server`
  (prefix ``aiolock``; users ``locker``, ``noscript``, ``otherkeys``).
* ``tls_redis`` (session): a started :class:`TlsRedisServer`; skipped when the
  ``redis-server`` build has no TLS, unless ``AIOLOCK_REQUIRE_TLS=1`` (then it fails).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import pytest

from aiolock.testing import RedisServer
from tests._support.proxy import FaultProxy
from tests._support.servers import (
    AclRedisServer,
    TlsRedisServer,
    acl_server,
    redis_tls_support,
    tls_server,
)

__all__ = ["acl_redis", "fault_proxy", "fault_redis_server", "tls_redis"]


@pytest.fixture(scope="session")
def fault_redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
async def fault_proxy(fault_redis_server: RedisServer) -> AsyncIterator[FaultProxy]:
    async with FaultProxy(fault_redis_server.host, fault_redis_server.port) as proxy:
        yield proxy


@pytest.fixture(scope="session")
def acl_redis() -> Iterator[AclRedisServer]:
    with acl_server("aiolock") as server:
        yield server


@pytest.fixture(scope="session")
def tls_redis() -> Iterator[TlsRedisServer]:
    supported, why = redis_tls_support()
    if not supported:
        if os.environ.get("AIOLOCK_REQUIRE_TLS") == "1":
            pytest.fail(why)
        pytest.skip(why)
    with tls_server() as server:
        yield server
