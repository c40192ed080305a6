"""aiolock quickstart: exclusive sections across tasks, a timeout, try_acquire, fencing.

Run: python examples/quickstart.py   (uses $REDIS_URL, or starts a throwaway redis-server)
"""

from __future__ import annotations

import asyncio

import aiolock
from aiolock.testing import redis_url_from_env


async def charge(locks: aiolock.LockManager, order: str, worker: int, log: list[str]) -> None:
    # Only one task at a time, in any process sharing this Redis, runs this block.
    async with locks.lock(f"order:{order}") as lock:
        log.append(f"worker {worker} charges order {order} (fencing token {lock.fencing_token})")
        await asyncio.sleep(0.05)  # the critical section: an API call, a DB write, ...


async def main(url: str) -> None:
    async with aiolock.LockManager.from_url(url, prefix="quickstart", lease=10) as locks:
        log: list[str] = []
        await asyncio.gather(*(charge(locks, "42", worker, log) for worker in range(4)))
        print("\n".join(log))

        lock = locks.lock("order:42")
        async with lock:

            async def impatient() -> None:
                try:
                    await locks.lock("order:42", timeout=0.2).acquire()
                except aiolock.LockTimeoutError as exc:
                    print(f"impatient task gave up: {exc}")
                print("try_acquire while held ->", await lock.try_acquire())

            await asyncio.create_task(impatient())  # another task: another owner
            async with lock:  # the same task re-enters
                print("hold count when re-entered:", await lock.hold_count())
        print("try_acquire when free ->", await lock.try_acquire())
        await lock.release()
        print("statistics:", locks.statistics())


if __name__ == "__main__":
    with redis_url_from_env() as redis_url:
        asyncio.run(main(redis_url))
