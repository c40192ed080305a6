"""A child process of the mixed-fleet tests: ``python -m tests._children.wire_fleet JSON``.

One process of a fleet that locks one name with several clients. ``role`` is one of

* ``aiolock-token`` / ``aiolock-timestamp``: aiolock with that wire format (``tasks``
  tasks, manager lease ``lease``, auto-renewed);
* ``redispy-sync`` / ``redispy-async``: redis-py's ``Lock`` (``timeout=lease``,
  ``sleep=0.05``), the sync and the asyncio client;
* ``legacy``: the SETNX/GETSET timestamp protocol of the legacy recipes, written here
  (sync redis-py, the client's clock, a plain GET-compare-DEL release).

Each holder runs ``rounds`` critical sections of ``hold`` seconds, ``pause`` seconds
apart on average; with ``crash`` (one task only), it then enters once more and hangs
there, holding, until the test SIGKILLs it; with ``until_stop`` (aiolock roles), its tasks
go on until the test sets the key ``<check>:stop``. The overlap checker is
independent of every lock: on entry a transaction INCRs ``<check>`` and records this
process in the hash ``<check>:inside``; a count other than 1 is an overlap, pushed on
``<check>:overlaps``. With ``yield_to_aiolock`` (n), a foreign holder's first n exits wait
until an aiolock task waits (the count ``<check>:waiting``), at most 0.5 s each. On exit
a transaction undoes both (the test does it for a process it killed inside). Every event
is printed as one JSON line ``{"e": "wait" | "enter" | "exit", "t": <time.monotonic()>,
...}`` (a system-wide clock on Linux), flushed at once, so the test can read the log of a
process it killed. The processes start together (after ``ready``, each waits for the key
``<check>:go``). Bounded by ``max_seconds``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import sys
import time
from typing import Any

import redis

# aiolock and redis.asyncio are imported by the roles that use them: the other children
# start faster (the fleet waits for its slowest child).

PID = str(os.getpid())
#: how many releases this process has held back for an aiolock waiter (see leave)
YIELDED = [0]


def log(event: str, **extra: Any) -> None:
    print(json.dumps({"e": event, "t": time.monotonic(), **extra}), flush=True)


def enter(check: redis.Redis, key: str, who: str) -> None:
    pipe = check.pipeline(transaction=True)
    pipe.incr(key)
    pipe.hset(f"{key}:inside", PID, who)
    count, _ = pipe.execute()
    if count != 1:
        check.rpush(f"{key}:overlaps", f"{who} entered with count {count}")
    log("enter", who=who)


def leave(check: redis.Redis, key: str, who: str, spec: dict[str, Any]) -> None:
    if YIELDED[0] < int(spec.get("yield_to_aiolock", 0)):
        # A foreign holder's first releases wait until an aiolock task waits
        # (``<check>:waiting``, kept by the aiolock roles), bounded well within its lease:
        # the releases the test's poll bound is about happen by design, not by the luck of
        # scheduling. Only the first few: the rest would all go to aiolock, and the
        # foreign clients, which poll, would starve.
        YIELDED[0] += 1
        deadline = time.monotonic() + 0.5
        while int(check.get(f"{key}:waiting") or 0) < 1 and time.monotonic() < deadline:
            time.sleep(0.002)
    log("exit", who=who)
    pipe = check.pipeline(transaction=True)
    pipe.hdel(f"{key}:inside", PID)
    pipe.decr(key)
    pipe.execute()


def pause(spec: dict[str, Any]) -> float:
    """The time between two sections: ``pause`` on average, jittered, so that the
    clients interleave."""
    return float(spec.get("pause", 0.0)) * 2 * random.random()


def hang() -> None:
    """A crashed holder: alive, holding, doing nothing (the test SIGKILLs it)."""
    time.sleep(60)
    sys.exit("not killed")


# -- the legacy SETNX/GETSET timestamp client ------------------------------------------------


def legacy_try(client: redis.Redis, name: str, timeout_ms: int) -> str | None:
    """One attempt of the legacy recipe; the value written if it took the lock."""
    now = int(time.time() * 1000)
    value = str(now + timeout_ms + 1)
    if client.setnx(name, value):
        return value
    current = client.get(name)
    if current is not None and int(current) < now:
        old = client.getset(name, value)
        if old is not None and old == current:  # it swapped out the stale value it saw
            return value
    return None


def legacy_release(client: redis.Redis, name: str, value: str) -> None:
    if client.get(name) == value.encode():
        client.delete(name)


# -- roles -----------------------------------------------------------------------------------


def run_sync(spec: dict[str, Any]) -> None:
    client = redis.Redis.from_url(spec["url"])
    check = redis.Redis.from_url(spec["url"])
    name, key, role = spec["name"], spec["check"], spec["role"]
    deadline = time.monotonic() + spec["max_seconds"]
    rounds = spec["rounds"]
    for i in range(rounds + (1 if spec.get("crash") else 0)):
        crash = bool(spec.get("crash")) and i == rounds  # the extra section of a crasher
        if time.monotonic() > deadline:
            break
        who = f"{role}:{PID}:{i}"
        log("wait", who=who)
        if role == "legacy":
            value = None
            while value is None and time.monotonic() < deadline:
                value = legacy_try(client, name, int(spec["lease"] * 1000))
                if value is None:
                    time.sleep(0.01)
            if value is None:
                break
            enter(check, key, who)
            if crash:
                hang()
            time.sleep(spec["hold"])
            leave(check, key, who, spec)
            legacy_release(client, name, value)
        else:
            lock = client.lock(name, timeout=spec["lease"], sleep=0.05)
            if not lock.acquire(blocking_timeout=max(deadline - time.monotonic(), 0.01)):
                break
            enter(check, key, who)
            if crash:
                hang()
            time.sleep(spec["hold"])
            leave(check, key, who, spec)
            lock.release()
        time.sleep(pause(spec))
    log("done")


async def run_async(spec: dict[str, Any]) -> None:
    from redis.asyncio import Redis

    check = redis.Redis.from_url(spec["url"])
    name, key, role = spec["name"], spec["check"], spec["role"]
    deadline = time.monotonic() + spec["max_seconds"]
    rounds = spec.get("rounds", 0)
    total = rounds + (1 if spec.get("crash") else 0)
    crash_at = rounds if spec.get("crash") else -1  # the extra section of a crasher
    client = Redis.from_url(spec["url"])

    async def stopped() -> bool:
        return bool(spec.get("until_stop")) and bool(await client.exists(f"{key}:stop"))

    async def section(who: str, crash: bool) -> None:
        # The checker's calls are blocking: the critical section is short, and a
        # blocked loop only makes this holder slower, never two holders overlap.
        enter(check, key, who)
        if crash:  # hung but alive: aiolock's watchdog still renews
            await asyncio.sleep(60)
            sys.exit("not killed")
        await asyncio.sleep(spec["hold"])
        leave(check, key, who, spec)

    if role == "redispy-async":
        for i in range(total):
            if time.monotonic() > deadline:
                break
            who = f"{role}:{PID}:{i}"
            log("wait", who=who)
            lock = client.lock(name, timeout=spec["lease"], sleep=0.05)
            if not await lock.acquire(blocking_timeout=max(deadline - time.monotonic(), 0.01)):
                break
            await section(who, i == crash_at)
            await lock.release()
            await asyncio.sleep(pause(spec))
    else:
        import aiolock

        wire = role.removeprefix("aiolock-")
        waiting = f"{key}:waiting"  # how many aiolock tasks wait (see leave)
        async with aiolock.LockManager(
            client, prefix=spec["prefix"], lease=spec["lease"], wire=wire
        ) as locks:

            async def worker(task: int) -> None:
                for i in itertools.count() if spec.get("until_stop") else range(total):
                    if time.monotonic() > deadline or await stopped():
                        return
                    who = f"{role}:{PID}:{task}:{i}"
                    log("wait", who=who)
                    await client.incr(waiting)
                    try:
                        lock = locks.lock(name, timeout=max(deadline - time.monotonic(), 0))
                        await lock.acquire()
                    except aiolock.LockTimeoutError:
                        return
                    finally:
                        await client.decr(waiting)
                    try:
                        await section(who, i == crash_at)
                    finally:
                        try:
                            await lock.release()
                        except aiolock.LockLostError:
                            # The 1 s lease ran out while the checker's blocking calls
                            # held the loop (a loaded machine): a loss, told as promised,
                            # not a failure of this child. Overlaps are the checker's.
                            log("lost", who=who)
                    await asyncio.sleep(pause(spec))

            await asyncio.gather(*(worker(t) for t in range(spec.get("tasks", 1))))
    await client.aclose()
    log("done")


def ready(spec: dict[str, Any]) -> None:
    """Start together: print ``ready``, then wait (bounded) for the test's go key."""
    check = redis.Redis.from_url(spec["url"])
    log("ready")
    deadline = time.monotonic() + 10
    while not check.exists(f"{spec['check']}:go") and time.monotonic() < deadline:
        time.sleep(0.005)


def main() -> None:
    spec = json.loads(sys.argv[1])
    ready(spec)
    if spec["role"] in ("legacy", "redispy-sync"):
        run_sync(spec)
    else:
        asyncio.run(run_async(spec))


if __name__ == "__main__":
    main()
