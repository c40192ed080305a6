"""A child process of the fair lock storm test: ``python -m tests._children.fair_storm JSON``.

Opens one manager (lease ``lease``, fair claim lifetime ``claim_ttl``), prints
``READY``, waits for a line on stdin (so that every process starts together), then runs
``tasks`` tasks, each making up to ``rounds`` acquisitions of the fair lock ``name``
with a random timeout (some ``None``), and a canceller that cancels random tasks at
random moments (waiting, picking up, inside the body, releasing) and starts new ones in
their place. Inside each critical section an independent checker in Redis (not the
lock) verifies exclusion: ``INCR <check>:inside`` must read 1 and the ``DECR`` on exit 0;
and a fenced store accepts the section's token only if it is larger than every token
accepted before. Prints ``REPORT <json>`` at the end. Bounded by ``max_seconds``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import random
import sys
import time
from collections.abc import Awaitable
from typing import Any

from redis.asyncio import Redis

import aiolock
from aiolock._kinds.fair.kind import FairLockKind

#: KEYS[1] = store; ARGV[1] = token. 1 if the token beats every token accepted so far.
FENCED = """
local last = tonumber(redis.call('get', KEYS[1]) or '0')
if tonumber(ARGV[1]) <= last then return 0 end
redis.call('set', KEYS[1], ARGV[1])
return 1
"""


#: the counts every report has (0 if nothing happened)
COUNTS = ("entered", "overlaps", "fenced", "timeouts", "cancelled", "lost")


async def uncancelled(command: Awaitable[int]) -> int:
    """Await *command* to the end even if the task is cancelled meanwhile (then re-raise)."""
    future = asyncio.ensure_future(command)
    cancelled = False
    while not future.done():
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return future.result()


def _say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


async def _run(spec: dict[str, Any]) -> dict[str, Any]:
    rng = random.Random(spec["seed"])
    check = Redis.from_url(spec["url"])  # the checker's own connection
    fenced = check.register_script(FENCED)
    inside_key, store_key = f"{spec['check']}:inside", f"{spec['check']}:store"
    tally: collections.Counter[str] = collections.Counter()
    errors: list[str] = []
    manager = aiolock.LockManager.from_url(spec["url"], prefix=spec["prefix"], lease=spec["lease"])
    manager._kind(FairLockKind).claim_ttl = spec["claim_ttl"]
    deadline = time.monotonic() + spec["max_seconds"]
    _say("READY")
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    async with manager:

        async def section(lock: aiolock.Lock) -> None:
            async with lock:
                try:
                    # (uncancelled: the INCR always completes, so the DECR below is due.)
                    if await uncancelled(check.incr(inside_key)) != 1:
                        tally["overlaps"] += 1
                    if not await fenced(keys=[store_key], args=[lock.fencing_token or 0]):
                        tally["fenced"] += 1
                    tally["entered"] += 1
                    await asyncio.sleep(rng.random() * spec["hold"])
                finally:
                    # A body cancelled anywhere still leaves the checker's count right,
                    # before the lock is released (else every later section would read
                    # an overlap that never happened).
                    if await uncancelled(check.decr(inside_key)) != 0:
                        tally["overlaps"] += 1

        async def worker(seed: float) -> None:
            own = random.Random(seed)
            for _ in range(spec["rounds"]):
                if time.monotonic() > deadline:
                    return
                timeout = own.choice([None, 0, 0.005, 0.02, 0.1, 0.5, 2.0])
                try:
                    await section(manager.fair_lock(spec["name"], timeout=timeout))
                except aiolock.LockTimeoutError:
                    tally["timeouts"] += 1
                except aiolock.LockLostError:
                    tally["lost"] += 1

        tasks = {asyncio.create_task(worker(rng.random())) for _ in range(spec["tasks"])}
        cancels = spec["cancels"]
        while tasks and time.monotonic() < deadline:
            done, tasks = await asyncio.wait(tasks, timeout=rng.random() * 0.1)
            for task in done:
                if task.cancelled():
                    tally["cancelled"] += 1
                elif task.exception() is not None:
                    errors.append(repr(task.exception()))
            if cancels and tasks:
                cancels -= 1
                victim = rng.choice(sorted(tasks, key=id))
                victim.cancel()
                tasks.add(asyncio.create_task(worker(rng.random())))
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        stats = manager.statistics()
        tally["held_after"] = stats.held
        tally["claims_after"] = stats.claims
    await check.aclose()
    return {"errors": errors, **{k: tally[k] for k in COUNTS}, **tally}


def main() -> None:
    spec = json.loads(sys.argv[1])
    tally = asyncio.run(asyncio.wait_for(_run(spec), spec["max_seconds"] + 20))
    _say("REPORT " + json.dumps(tally))


if __name__ == "__main__":
    main()
