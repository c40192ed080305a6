"""A child process of the hand-off tests: ``python -m tests._children.handoff JSON``.

Reads a hand-off token on stdin (one line), adopts it with a manager of ``lease`` s
(auto-renewed), prints ``ADOPTED <fencing token>``, then in mode ``"release"`` finishes
the critical section the parent began (it leaves the independent overlap checker:
``DECR <prefix>:check:inside``), releases and prints ``RELEASED``; in mode ``"hold"``
it holds until it is killed (bounded by ``max_seconds``).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from redis.asyncio import Redis

import aiolock


async def main(spec: dict[str, Any]) -> None:
    token = (await asyncio.to_thread(sys.stdin.readline)).strip()
    redis = Redis.from_url(spec["url"])
    try:
        async with aiolock.LockManager(redis, prefix=spec["prefix"], lease=spec["lease"]) as locks:
            lock = locks.lock(spec["name"])
            await lock.adopt(token)
            print("ADOPTED", lock.fencing_token, flush=True)
            if spec["mode"] == "hold":
                await asyncio.sleep(spec["max_seconds"])
                return
            await asyncio.sleep(spec["work"])  # the rest of the critical section
            await redis.decr(f"{spec['prefix']}:check:inside")
            await lock.release()
            print("RELEASED", flush=True)
    finally:
        await redis.aclose()


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
