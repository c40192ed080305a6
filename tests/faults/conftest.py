"""Make the fault fixtures of :mod:`.plugin` available to the tests in this package."""

from __future__ import annotations

from .plugin import acl_redis, fault_proxy, fault_redis_server, tls_redis

__all__ = ["acl_redis", "fault_proxy", "fault_redis_server", "tls_redis"]
