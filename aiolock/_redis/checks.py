"""Checks of the client a user gives a LockManager, made at the call that received it."""

from __future__ import annotations

from redis.asyncio import Redis

__all__ = ["check_pool", "client_type_message"]


def check_pool(redis: Redis, max_in_flight: object) -> None:
    """Refuse a connection pool too small to serve the manager at all.

    The hub keeps one connection for its subscriptions for as long as a waiter listens:
    with a pool of one, every command waited for that connection (a BlockingConnectionPool
    blocked until its timeout: 240 acquisitions took 40 s instead of 0.03 s, 12 failing).
    A pool of two runs at full speed (the client then keeps one connection for commands).
    """
    capacity = getattr(redis.connection_pool, "max_connections", None)
    if isinstance(capacity, int) and capacity < 2:
        raise ValueError(
            f"the client's connection pool allows {capacity} connection(s); a LockManager "
            "needs at least 2: one for its pub/sub subscription (which wakes waiting tasks) "
            f"and at least one for commands (it uses up to max_in_flight={max_in_flight}, "
            "fewer with a smaller pool). Raise the pool's max_connections to 2 or more, or "
            "give the manager a client of its own"
        )


def client_type_message(redis: object) -> str:
    name = type(redis).__name__
    if "Cluster" in name:
        return (
            f"redis must be a redis.asyncio.Redis or redis.asyncio.cluster.RedisCluster "
            f"client, not {type(redis).__module__}.{name}; for a Redis Cluster pass "
            "redis.asyncio.cluster.RedisCluster(...), or use "
            "LockManager.from_url(url, cluster=True)"
        )
    if "Redis" in name and not type(redis).__module__.startswith("redis.asyncio"):
        return (
            f"redis must be an asyncio client (redis.asyncio.Redis), not the synchronous "
            f"{type(redis).__module__}.{name}; or use LockManager.from_url(url)"
        )
    return (
        f"redis must be a redis.asyncio.Redis client, not {name}; or use "
        "LockManager.from_url(url) to have the manager make one"
    )
