"""A child process of the contention tests: ``python -m tests._children.contend URL PREFIX
NAME SECONDS``.

Opens a manager named ``NAME``; 6 tasks take, for ``SECONDS``, the lock ``hot`` 7 times in
10 and ``warm`` or ``cold`` the rest, each hold 3 ms. Prints ``READY <pid>`` once the
manager is open, ``DONE <acquisitions>`` at the end.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys

import aiolock

#: names by share of the picks: hot 70 %, warm 20 %, cold 10 %
NAMES = ["hot"] * 7 + ["warm"] * 2 + ["cold"]


async def main(url: str, prefix: str, name: str, seconds: float) -> None:
    async with aiolock.LockManager.from_url(url, prefix=prefix, name=name, lease=10) as locks:
        print(f"READY {os.getpid()}", flush=True)
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        rng = random.Random(name)
        done = 0

        async def task() -> None:
            nonlocal done
            while loop.time() < end:
                async with locks.lock(rng.choice(NAMES), timeout=30):
                    await asyncio.sleep(0.003)
                done += 1

        await asyncio.gather(*(task() for _ in range(6)))
        print(f"DONE {done}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])))
