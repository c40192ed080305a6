"""A child process of the Redlock tests: ``python -m tests._redlock_child JSON``.

Opens a Redlock manager over the masters ``urls``, then ``rounds`` times: acquires the
Redlock ``name``, records ``time.monotonic()`` on entry and exit of the critical section
(CLOCK_MONOTONIC is one clock for every process of the machine, so the parent can check
the intervals of all processes for overlaps without trusting the lock), holds for
``hold`` seconds, releases. Prints one JSON line ``{"intervals": [[start, end], ...]}``.
Bounded by ``max_seconds``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from redis.asyncio import Redis

import aiolock


async def _run(spec: dict[str, Any]) -> list[list[float]]:
    clients = [Redis.from_url(url) for url in spec["urls"]]
    intervals: list[list[float]] = []
    try:
        async with aiolock.LockManager.redlock(
            clients, prefix=spec["prefix"], lease=spec.get("lease", 5.0), node_timeout=0.2
        ) as locks:
            lock = locks.lock(spec["name"], timeout=spec["max_seconds"])
            for _ in range(spec["rounds"]):
                async with lock:
                    start = time.monotonic()
                    await asyncio.sleep(spec["hold"])
                    intervals.append([start, time.monotonic()])
    finally:
        for client in clients:
            await client.aclose()
    return intervals


def main() -> None:
    spec = json.loads(sys.argv[1])
    intervals = asyncio.run(asyncio.wait_for(_run(spec), spec["max_seconds"]))
    sys.stdout.write(json.dumps({"intervals": intervals}) + "\n")


if __name__ == "__main__":
    main()
