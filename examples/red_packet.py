"""The red-packet scenario: many users grab shares of a packet, each at most one share.

A packet is a Redis list of amounts. Each user grabs under a per-user lock, so that the
same user clicking twice (two concurrent requests) still gets at most one share; the
winners are recorded in a hash. Run: python examples/red_packet.py
"""

from __future__ import annotations

import asyncio
import random
import uuid

from redis.asyncio import Redis

import aiolock
from aiolock.testing import redis_url_from_env

SHARES = 10
USERS = 25
CLICKS_PER_USER = 3  # impatient users click several times at once


async def grab(locks: aiolock.LockManager, redis: Redis, packet: str, user: str) -> str:
    async with locks.lock(f"grab:{packet}:{user}"):
        if await redis.hexists(f"{packet}:winners", user):
            return "already has a share"
        amount: str | None = await redis.lpop(f"{packet}:amounts")  # type: ignore[assignment]
        if amount is None:
            return "too late, the packet is empty"
        await redis.hset(f"{packet}:winners", user, amount)
        return f"got {int(amount)} cents"


async def main(url: str) -> None:
    packet = f"packet:{uuid.uuid4().hex[:8]}"
    rng = random.Random(7)
    amounts = [rng.randint(1, 500) for _ in range(SHARES)]
    async with Redis.from_url(url, decode_responses=True) as redis:
        await redis.rpush(f"{packet}:amounts", *amounts)
        async with aiolock.LockManager(redis, prefix="redpacket") as locks:
            users = [f"user{n:02d}" for n in range(USERS)]
            clicks = [user for user in users for _ in range(CLICKS_PER_USER)]
            rng.shuffle(clicks)
            results = await asyncio.gather(*(grab(locks, redis, packet, u) for u in clicks))
        winners: dict[str, str] = await redis.hgetall(f"{packet}:winners")  # type: ignore[assignment]
        outcome: dict[str, set[str]] = {}
        for user, result in zip(clicks, results, strict=True):
            outcome.setdefault(user, set()).add(result)
        for user in users:
            print(f"{user}: {winners.get(user, '-'):>4}  ({'; '.join(sorted(outcome[user]))})")
        total = sum(int(v) for v in winners.values())
        print(f"{len(winners)} users got a share, {total} of {sum(amounts)} cents handed out")
        if len(winners) != SHARES or total != sum(amounts):
            raise SystemExit("a share was lost or handed out twice")
        await redis.delete(f"{packet}:amounts", f"{packet}:winners")


if __name__ == "__main__":
    with redis_url_from_env() as redis_url:
        asyncio.run(main(redis_url))
