"""A child process of the fair lock tests: ``python -m tests._children.fair MODE JSON``.

Modes (each bounded by ``max_seconds``; events are printed one per line, flushed):

``wait``
    Open a manager (its fair lock kind's claim lifetime set to ``claim_ttl``), print
    ``READY``, acquire the fair lock ``name``; once granted, append ``"<label> <token>"``
    to the Redis list ``order`` (so Redis itself records the grant order, under the
    lock), print ``GOT <token>``, hold for ``hold`` seconds, release, print ``DONE``.
``hold``
    Acquire the fair lock ``name`` with the manager lease ``lease`` (auto-renewed), print
    ``HELD <token>``, then sleep until killed (or ``max_seconds``).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from redis.asyncio import Redis

import aiolock
from aiolock._kinds.fair.kind import FairLockKind


def _say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


async def _run(mode: str, spec: dict[str, Any]) -> None:
    redis = Redis.from_url(spec["url"])
    manager = aiolock.LockManager(redis, prefix=spec["prefix"], lease=spec.get("lease", 30.0))
    manager._kind(FairLockKind).claim_ttl = spec.get("claim_ttl", 10.0)
    try:
        async with manager:
            lock = manager.fair_lock(spec["name"], timeout=spec["max_seconds"])
            if mode == "hold":
                await lock.acquire()
                _say(f"HELD {lock.fencing_token}")
                await asyncio.sleep(spec["max_seconds"])
                return
            _say("READY")
            async with lock:
                await redis.rpush(spec["order"], f"{spec['label']} {lock.fencing_token}")
                _say(f"GOT {lock.fencing_token}")
                await asyncio.sleep(spec.get("hold", 0.0))
            _say("DONE")
    finally:
        await redis.aclose()


def main() -> None:
    mode, spec = sys.argv[1], json.loads(sys.argv[2])
    asyncio.run(asyncio.wait_for(_run(mode, spec), spec["max_seconds"] + 10))


if __name__ == "__main__":
    main()
