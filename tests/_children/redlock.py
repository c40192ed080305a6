"""A child process of the Redlock tests: ``python -m tests._children.redlock JSON``.

Opens a Redlock manager over the masters ``urls``, prints ``READY`` and waits for a line
on stdin (the parent starts all children at once), then ``rounds`` times: acquires the
Redlock ``name``, records ``time.monotonic()`` on entry and exit of the critical section
(CLOCK_MONOTONIC is one clock for every process of the machine, so the parent can check
the intervals of all processes for overlaps without trusting the lock), holds for
``hold`` seconds, releases. Prints one JSON line ``{"intervals": [[start, end], ...],
"loop_seconds": ..., "failed_rounds": ...}``.

With ``hold_forever``: acquires the Redlock, prints ``HELD`` and sleeps until killed.
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


async def _run(spec: dict[str, Any]) -> dict[str, Any]:
    clients = [Redis.from_url(url) for url in spec["urls"]]
    intervals: list[list[float]] = []
    try:
        async with aiolock.LockManager.redlock(
            clients, prefix=spec["prefix"], lease=spec.get("lease", 5.0), node_timeout=0.1
        ) as locks:
            lock = locks.lock(spec["name"], timeout=spec["max_seconds"])
            if spec.get("hold_forever"):
                await lock.acquire()
                sys.stdout.write("HELD\n")
                sys.stdout.flush()
                await asyncio.sleep(spec["max_seconds"])  # until the parent kills it
                return {}
            # Start together: every child contends from its first round.
            sys.stdout.write("READY\n")
            sys.stdout.flush()
            await asyncio.to_thread(sys.stdin.readline)
            started = time.monotonic()
            for _ in range(spec["rounds"]):
                async with lock:
                    start = time.monotonic()
                    await asyncio.sleep(spec["hold"])
                    intervals.append([start, time.monotonic()])
            stats = locks.statistics()
            loop_seconds = time.monotonic() - started
    finally:
        for client in clients:
            await client.aclose()
    return {
        "intervals": intervals,
        "loop_seconds": loop_seconds,
        "failed_rounds": stats.failed_rounds,
    }


def main() -> None:
    spec = json.loads(sys.argv[1])
    result = asyncio.run(asyncio.wait_for(_run(spec), spec["max_seconds"]))
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
