"""The lock family in one scenario: a small print shop.

- a fair lock hands the printer to jobs in the order they asked for it;
- a read-write lock lets many readers see the price list while one writer updates it;
- a semaphore keeps at most 3 calls to a payment API in flight;
- a multi-lock moves money between two accounts, all or nothing, without deadlock.

Run: python examples/family.py (against $REDIS_URL, or a throwaway redis-server).
"""

from __future__ import annotations

import asyncio
import uuid

from redis.asyncio import Redis

import aiolock
from aiolock.testing import redis_url_from_env


async def printer(locks: aiolock.LockManager) -> list[int]:
    served: list[int] = []
    async with locks.fair_lock("printer"):  # hold it while the jobs line up behind us

        async def job(n: int) -> None:
            async with locks.fair_lock("printer", timeout=10):
                served.append(n)

        jobs = []
        for n in range(5):
            jobs.append(asyncio.create_task(job(n)))
            await asyncio.sleep(0.05)  # job n asks before job n + 1
    await asyncio.gather(*jobs)
    return served


async def price_list(locks: aiolock.LockManager) -> tuple[int, int]:
    rw = locks.rw_lock("price-list")
    readers_at_once = 0
    inside = 0

    async def reader() -> None:
        nonlocal inside, readers_at_once
        async with rw.read():
            inside += 1
            readers_at_once = max(readers_at_once, inside)
            await asyncio.sleep(0.05)
            inside -= 1

    async def writer() -> int:
        async with rw.write(timeout=10):
            return inside  # readers inside while the writer writes: always 0

    readers = [asyncio.create_task(reader()) for _ in range(4)]
    during_write = await writer()
    await asyncio.gather(*readers)
    return readers_at_once, during_write


async def payments(locks: aiolock.LockManager) -> int:
    sem = locks.semaphore("payment-api", limit=3)
    in_flight = 0
    most = 0

    async def pay() -> None:
        nonlocal in_flight, most
        async with sem:
            in_flight += 1
            most = max(most, in_flight)
            await asyncio.sleep(0.02)
            in_flight -= 1

    await asyncio.gather(*(pay() for _ in range(12)))
    return most


async def transfers(locks: aiolock.LockManager, redis: Redis, run: str) -> int:
    a, b = f"{run}:acct:1", f"{run}:acct:2"
    await redis.set(a, 100)
    await redis.set(b, 100)

    async def move(src: str, dst: str, amount: int) -> None:
        # Listed in opposite orders by the two directions: the multi-lock sorts them.
        async with locks.multi_lock([src, dst], timeout=10):
            balance = int(await redis.get(src) or 0)
            await asyncio.sleep(0.001)
            await redis.set(src, balance - amount)
            await redis.incrby(dst, amount)

    await asyncio.gather(*(move(a, b, 1) if n % 2 else move(b, a, 1) for n in range(40)))
    total = int(await redis.get(a) or 0) + int(await redis.get(b) or 0)
    await redis.delete(a, b)
    return total


async def main(url: str) -> None:
    run = f"shop-{uuid.uuid4().hex[:8]}"
    async with Redis.from_url(url) as redis, aiolock.LockManager(redis, prefix=run) as locks:
        served = await printer(locks)
        print(f"printer served jobs in order: {served}")
        readers, inside = await price_list(locks)
        print(f"price list: up to {readers} readers at once, {inside} inside during the write")
        most = await payments(locks)
        print(f"payment API: at most {most} calls in flight (limit 3)")
        total = await transfers(locks, redis, run)
        print(f"transfers: the two accounts still hold {total} in total")
    if served != sorted(served) or inside != 0 or most > 3 or total != 200:
        raise SystemExit("a lock did not keep its promise")


if __name__ == "__main__":
    with redis_url_from_env() as redis_url:
        asyncio.run(main(redis_url))
