"""Child processes of the read-write lock tests: ``python -m tests._children.rw MODE JSON``.

Every mode is bounded by ``max_seconds`` and prints one event per line, flushed; times
are ``time.monotonic()`` (one clock for every process of the machine).

``read``
    ``tasks`` tasks each acquire the read side of ``name`` (print ``WAITING`` once all
    wait, ``GOT <i> <time>`` per grant, ``ALL <time>`` once all hold), then hold until a
    line arrives on stdin (or ``max_seconds``), release, and print ``DONE``.
``write_wait``
    Acquire the write side (claim_ttl ``claim_ttl``); print ``CLAIMED`` once the waiter's
    claim is registered, ``GOT`` if it gets the lock; hold until killed.
``stream``
    ``tasks`` tasks take the read side in a loop, each holding ``hold_ms`` ms, until a
    line arrives on stdin (or ``max_seconds``); print ``STARTED`` after the first grant
    and ``COUNT <n>`` at the end.
``mix``
    The overlap checker: ``tasks`` tasks make ``ops`` acquisitions each, writes with
    probability ``write_ratio``; inside, a Lua script on a counters hash checks that no
    writer is inside with anyone else. Prints ``REPORT <json>``.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from typing import Any

import aiolock
from aiolock._kinds.rw.kind import WriteLockKind

#: KEYS[1] counters hash; ARGV[1] 'r' or 'w'; ARGV[2] +1 (enter) or -1 (leave).
#: Returns 1 if the entry is exclusive as it must be, 0 on an overlap.
CHECK = """
local field = ARGV[1] == 'r' and 'readers' or 'writers'
local n = redis.call('hincrby', KEYS[1], field, ARGV[2])
if ARGV[2] == '-1' then return 1 end
local readers = tonumber(redis.call('hget', KEYS[1], 'readers') or 0)
local writers = tonumber(redis.call('hget', KEYS[1], 'writers') or 0)
if readers > tonumber(redis.call('hget', KEYS[1], 'max_readers') or 0) then
  redis.call('hset', KEYS[1], 'max_readers', readers)
end
if writers > 1 or (writers == 1 and readers > 0) then
  redis.call('hincrby', KEYS[1], 'overlaps', 1)
  return 0
end
return 1
"""


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def manager(spec: dict[str, Any]) -> aiolock.LockManager:
    made = aiolock.LockManager.from_url(
        spec["url"], prefix=spec["prefix"], lease=spec.get("lease", 30.0)
    )
    if "claim_ttl" in spec:
        made._kind(WriteLockKind).claim_ttl = spec["claim_ttl"]
    return made


async def stdin_line() -> None:
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.buffer.readline)


async def read(spec: dict[str, Any]) -> None:
    async with manager(spec) as locks:
        rw = locks.rw_lock(spec["name"])
        tasks = spec["tasks"]
        got = 0
        all_held = asyncio.Event()
        release = asyncio.Event()

        async def reader(i: int) -> None:
            nonlocal got
            async with rw.read(timeout=spec["max_seconds"]):
                got += 1
                say(f"GOT {i} {time.monotonic()}")
                if got == tasks:
                    all_held.set()
                await release.wait()

        running = [asyncio.create_task(reader(i)) for i in range(tasks)]
        for _ in range(500):  # print WAITING once they all queue (if they must)
            stats = locks.statistics()
            if got or (stats.hub.waiters == tasks and stats.hub.subscriptions == 1):
                break
            await asyncio.sleep(0.01)
        if not got:
            say("WAITING")
        await all_held.wait()
        say(f"ALL {time.monotonic()}")
        await stdin_line()
        release.set()
        await asyncio.gather(*running)
    say("DONE")


async def write_wait(spec: dict[str, Any]) -> None:
    async with manager(spec) as locks:
        waiter = asyncio.create_task(locks.rw_lock(spec["name"]).write().acquire())
        for _ in range(3000):  # poll the statistics: a claim has no event
            if locks.statistics().claims or waiter.done():
                break
            await asyncio.sleep(0.01)
        say("CLAIMED")
        await waiter
        say("GOT")
        await asyncio.sleep(spec["max_seconds"])


async def stream(spec: dict[str, Any]) -> None:
    async with manager(spec) as locks:
        rw = locks.rw_lock(spec["name"])
        count = 0
        stop = asyncio.Event()

        async def reader(i: int) -> None:
            nonlocal count
            await asyncio.sleep(i * spec["hold_ms"] / 1000 / spec["tasks"])  # staggered
            while not stop.is_set():
                async with rw.read(timeout=spec["max_seconds"]):
                    count += 1
                    if count == 1:
                        say("STARTED")
                    await asyncio.sleep(spec["hold_ms"] / 1000)

        running = [asyncio.create_task(reader(i)) for i in range(spec["tasks"])]
        await stdin_line()
        stop.set()
        await asyncio.gather(*running)
        say(f"COUNT {count}")


async def mix(spec: dict[str, Any]) -> None:
    rng = random.Random(spec["seed"])
    report = {"reads": 0, "writes": 0, "overlaps": 0, "errors": []}
    async with manager(spec) as locks:
        check = locks.redis.register_script(CHECK)
        counters = spec["counters"]
        rw = locks.rw_lock(spec["name"], timeout=30)

        async def worker() -> None:
            for _ in range(spec["ops"]):
                side = "w" if rng.random() < spec["write_ratio"] else "r"
                try:
                    async with rw.write() if side == "w" else rw.read():
                        if not await check(keys=[counters], args=[side, 1]):
                            report["overlaps"] += 1  # type: ignore[operator]
                        await asyncio.sleep(rng.random() * 0.003)
                        await check(keys=[counters], args=[side, -1])
                    report["reads" if side == "r" else "writes"] += 1  # type: ignore[operator]
                except aiolock.LockError as exc:
                    report["errors"].append(repr(exc))  # type: ignore[attr-defined]

        await asyncio.gather(*(worker() for _ in range(spec["tasks"])))
    say("REPORT " + json.dumps(report))


def main() -> None:
    mode, spec = sys.argv[1], json.loads(sys.argv[2])
    run = {"read": read, "write_wait": write_wait, "stream": stream, "mix": mix}[mode]
    asyncio.run(asyncio.wait_for(run(spec), spec["max_seconds"] + 30))


if __name__ == "__main__":
    main()
