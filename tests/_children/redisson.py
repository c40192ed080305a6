"""A worker of the mixed aiolock / Redisson-model fleet (tests/unit/_formats/redisson/test_kind.py).

Run as ``python tests/_children/redisson.py '<json>'`` with the repository root on
``PYTHONPATH``. The JSON says: ``url``, ``role`` (``"aiolock"`` or ``"redisson"``),
``names``, ``tasks``, ``acquisitions`` (per task), ``lease`` (seconds), ``timeout``
(seconds per acquire), ``max_seconds``, ``log`` (the event list key), ``prefix``,
``wire`` (default ``"redisson"``; ``"aiolock"`` makes a negative control, whose aiolock
workers do not exclude the Redisson ones) and ``victim``: a victim takes ``names[0]``
once, logs its entry, prints ``INSIDE`` and sleeps inside the critical section until the
test SIGKILLs it.

Every entry into and exit from a critical section is logged by a script on the server
(RPUSH to one list), so the list is the server's own order of events: the test checks
it for overlaps without trusting either lock client. Prints one JSON line of counts.
Bounded: each task makes at most its acquisitions and stops at ``max_seconds``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from typing import Any

from redis.asyncio import Redis

import aiolock
from tests._support.redisson_protocol import RedissonModel

#: KEYS[1] event list; ARGV = event, lock name, who. One list: the server's order.
LOG_EVENT = "redis.call('rpush', KEYS[1], ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. ARGV[3])"


async def main(spec: dict[str, Any]) -> dict[str, int]:
    redis = Redis.from_url(spec["url"])
    log = redis.register_script(LOG_EVENT)
    counts = {"acquired": 0, "timeouts": 0}
    deadline = time.monotonic() + spec["max_seconds"]
    pid = os.getpid()
    lease = spec["lease"]
    model = RedissonModel(redis, watchdog_ms=round(lease * 1000))
    manager = aiolock.LockManager(
        redis, prefix=spec["prefix"], wire=spec.get("wire", "redisson"), lease=lease
    )

    async def section(name: str, who: str, hold: float) -> None:
        await log(keys=[spec["log"]], args=["enter", name, who])
        if spec["victim"]:
            print("INSIDE", flush=True)
            await asyncio.sleep(spec["max_seconds"])  # until SIGKILL
        await asyncio.sleep(hold)
        await log(keys=[spec["log"]], args=["exit", name, who])

    async def worker(thread: int) -> None:
        who = f"{spec['role']}:{pid}:{thread}"
        rng = random.Random(pid * 100 + thread)
        for _ in range(spec["acquisitions"]):
            if time.monotonic() > deadline:
                return
            name = spec["names"][0] if spec["victim"] else rng.choice(spec["names"])
            hold = rng.uniform(0, 0.003)
            if spec["role"] == "aiolock":
                try:
                    async with manager.lock(name, timeout=spec["timeout"]):
                        counts["acquired"] += 1
                        await section(name, who, hold)
                except aiolock.LockTimeoutError:
                    counts["timeouts"] += 1
            else:
                if not await model.lock(name, thread, wait=spec["timeout"]):
                    counts["timeouts"] += 1
                    continue
                counts["acquired"] += 1
                try:
                    await section(name, who, hold)
                finally:
                    await model.unlock(name, thread)

    async with manager:
        await asyncio.gather(*(worker(t) for t in range(1, spec["tasks"] + 1)))
    await model.aclose()
    await redis.aclose()
    return counts


if __name__ == "__main__":
    result = asyncio.run(main(json.loads(sys.argv[1])))
    print(json.dumps(result), flush=True)
