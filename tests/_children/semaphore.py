"""A child process of the semaphore tests: ``python -m tests._children.semaphore JSON``.

Opens a manager (lease ``lease``, auto-renewed), runs ``tasks`` tasks that each make up
to ``rounds`` acquisitions of 1..``max_permits`` permits of the semaphore ``name``
(limit ``limit``), and checks the limit with a checker independent of the semaphore:
inside each section the task adds its permits to this process's counter
``<prefix>:check:<index>`` and, in the same script, sums the counters of every process;
a sum above the limit is recorded in ``<prefix>:check:violations``. Prints ``READY``
once it has entered a section, ``DONE <json>`` at the end. Bounded by ``max_seconds``.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from typing import Any

from redis.asyncio import Redis

import aiolock

#: KEYS: this process's counter, the violations counter, then every process's counter.
#: ARGV: permits (negative on exit), limit, a description of the holder.
ENTER = """
local now = redis.call('incrby', KEYS[1], ARGV[1])
if tonumber(ARGV[1]) < 0 then return now end
local total = 0
for i = 3, #KEYS do total = total + tonumber(redis.call('get', KEYS[i]) or 0) end
if total > tonumber(ARGV[2]) then
  redis.call('incr', KEYS[2])
  redis.call('rpush', KEYS[2] .. ':log', ARGV[3] .. ' total=' .. total)
end
return total
"""


def counter(prefix: str, index: int) -> str:
    return f"{prefix}:check:{index}"


async def run(spec: dict[str, Any]) -> dict[str, int]:
    prefix, index = spec["prefix"], spec["index"]
    checks = Redis.from_url(spec["url"])
    enter = checks.register_script(ENTER)
    keys = [counter(prefix, index), f"{prefix}:check:violations"]
    keys += [counter(prefix, i) for i in range(spec["processes"])]
    done = {"acquired": 0, "timeouts": 0}
    deadline = time.monotonic() + spec["max_seconds"]
    ready = asyncio.Event()
    rng = random.Random(spec["seed"])
    manager = aiolock.LockManager.from_url(spec["url"], prefix=prefix, lease=spec["lease"])

    async def worker(n: int) -> None:
        sem = manager.semaphore(spec["name"], spec["limit"])
        for _ in range(spec["rounds"]):
            if time.monotonic() > deadline:
                return
            want = rng.randint(1, spec["max_permits"])
            try:
                permit = await sem.acquire(want, timeout=spec["timeout"])
            except aiolock.LockTimeoutError:
                done["timeouts"] += 1
                continue
            try:
                await enter(keys=keys, args=[want, spec["limit"], f"p{index}t{n}"])
                ready.set()
                await asyncio.sleep(rng.uniform(0.0, spec["hold"]))
                await enter(keys=keys, args=[-want, spec["limit"], ""])
            finally:
                await permit.release()
            done["acquired"] += 1

    async with manager:
        tasks = [asyncio.create_task(worker(n)) for n in range(spec["tasks"])]

        async def say_ready() -> None:
            await ready.wait()
            print("READY", flush=True)

        announcer = asyncio.create_task(say_ready())
        await asyncio.gather(*tasks)
        announcer.cancel()
    await checks.aclose()
    return done


def main() -> None:
    spec = json.loads(sys.argv[1])
    result = asyncio.run(asyncio.wait_for(run(spec), spec["max_seconds"] + 30))
    print("DONE " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
