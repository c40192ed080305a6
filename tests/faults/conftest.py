"""Make the fault fixtures of :mod:`tests._support.fault_plugin` available in this tier."""

from __future__ import annotations

from tests._support.fault_plugin import acl_redis, fault_proxy, fault_redis_server, tls_redis

__all__ = ["acl_redis", "fault_proxy", "fault_redis_server", "tls_redis"]
