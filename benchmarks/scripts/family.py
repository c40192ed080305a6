"""Script time per uncontended cycle of the lock family: part of ``benchmarks.scripts.cycle_time``.

Issue 21's target 6 asks for the fair lock, the read-write lock and the semaphore to cost
Redis at most 1.5x the lock's script time per uncontended cycle (or for NOTES.md to say
what they pay for). Each kind's scripts take arguments the engine computes (owner fields,
hold counts, fence and tombstone lifetimes, the listening flag, ...), so rather than
copying those here, one :class:`aiolock.LockManager` (defaults: renewed 30 s lease,
default ``fence_ttl``) drives real handles, one task, one cycle at a time, on the
benchmark's private server:

* **lock**: ``manager.lock(name)``, ``try_acquire()`` then ``release()`` (the same scripts
  and arguments as the script-only "aiolock's lock" row, through the whole client: the
  baseline of the ratios);
* **fair lock**: ``manager.fair_lock(name)``, the same calls;
* **read-write lock, write hold** / **read hold**: ``rw_lock(name).write()`` / ``.read()``;
* **semaphore, one permit**: ``manager.semaphore(name, 1)``, ``try_acquire()`` (one
  permit) then the permit's ``release()``.

Server time is the ``INFO commandstats`` ``usec`` delta of EVALSHA (and EVAL, which the
client would use only to load a script) over *cycles* cycles after 50 warm-up cycles,
per cycle; the script calls per cycle are counted too (2 when the client sent only the
acquire and the release), and the commands the scripts ran with ``redis.call`` (by name,
from the same stats, in the last repeat: Redis counts those under their own names).
Kinds are interleaved over the repeats; medians.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Awaitable, Callable
from typing import Any

import redis
from redis.asyncio import Redis

from aiolock import LockManager

__all__ = ["KINDS", "LOCK", "run"]

LOCK = "lock"
KINDS = (
    LOCK,
    "fair lock",
    "read-write lock, write hold",
    "read-write lock, read hold",
    "semaphore, one permit",
)
WARM_UP = 50

#: one acquire+release cycle of one kind
Cycle = Callable[[], Awaitable[None]]


def _cycles(manager: LockManager) -> dict[str, Cycle]:
    lock = manager.lock("family:lock")
    fair = manager.fair_lock("family:fair")
    write = manager.rw_lock("family:rw-write").write()
    read = manager.rw_lock("family:rw-read").read()
    semaphore = manager.semaphore("family:semaphore", 1)

    def plain(handle: Any, kind: str) -> Cycle:
        async def cycle() -> None:
            if not await handle.try_acquire():
                raise RuntimeError(f"{kind}: not granted, yet nothing else holds it")
            await handle.release()

        return cycle

    async def permit() -> None:
        got = await semaphore.try_acquire()
        if got is None:
            raise RuntimeError("semaphore: no permit, yet nothing else holds one")
        await got.release()

    cycles = {
        LOCK: plain(lock, LOCK),
        KINDS[1]: plain(fair, KINDS[1]),
        KINDS[2]: plain(write, KINDS[2]),
        KINDS[3]: plain(read, KINDS[3]),
        KINDS[4]: permit,
    }
    assert tuple(cycles) == KINDS
    return cycles


_SENT = ("evalsha", "eval")


def _stats(client: redis.Redis) -> dict[str, tuple[int, float]]:
    """(calls, usec) by command name so far."""
    stats: dict[str, Any] = client.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): (int(s.get("calls", 0)), float(s.get("usec", 0)))
        for name, s in stats.items()
    }


def _sample(
    before: dict[str, tuple[int, float]], after: dict[str, tuple[int, float]], n: int
) -> dict[str, Any]:
    """Per cycle: script usec and calls, and what the scripts ran (redis.call by name)."""
    delta = {
        name: (calls - before.get(name, (0, 0.0))[0], usec - before.get(name, (0, 0.0))[1])
        for name, (calls, usec) in after.items()
    }
    inner = {
        name: calls / n
        for name, (calls, _) in sorted(delta.items())
        if calls and name not in (*_SENT, "info")
    }
    return {
        "usec": sum(delta.get(name, (0, 0.0))[1] for name in _SENT) / n,
        "calls": sum(delta.get(name, (0, 0.0))[0] for name in _SENT) / n,
        "inner": inner,
    }


async def _measure(url: str, cycles: int, repeats: int) -> dict[str, list[dict[str, Any]]]:
    samples: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
    stats = redis.Redis.from_url(url)
    client = Redis.from_url(url)
    try:
        async with LockManager(client, prefix="sf") as manager:
            by_kind = _cycles(manager)
            for _ in range(repeats):
                for kind, cycle in by_kind.items():
                    for _ in range(WARM_UP):
                        await cycle()
                    before = _stats(stats)
                    for _ in range(cycles):
                        await cycle()
                    samples[kind].append(_sample(before, _stats(stats), cycles))
    finally:
        await client.aclose()
        stats.close()
    return samples


def run(url: str, cycles: int, repeats: int) -> list[dict[str, Any]]:
    """One row per kind: server us per cycle (median), its range, script calls and the
    commands the scripts ran (``redis.call``) per cycle, and the ratio to the lock's row
    of the same run."""
    samples = asyncio.run(_measure(url, cycles, repeats))
    lock = statistics.median(s["usec"] for s in samples[LOCK])
    rows = []
    for kind, values in samples.items():
        us = statistics.median(s["usec"] for s in values)
        inner = values[-1]["inner"]
        rows.append(
            {
                "kind": kind,
                "server_us_per_cycle": us,
                "range": [min(s["usec"] for s in values), max(s["usec"] for s in values)],
                "script_calls_per_cycle": statistics.median(s["calls"] for s in values),
                "redis_calls_per_cycle": sum(inner.values()),
                "redis_calls_by_name": inner,
                "vs_lock": us / lock,
            }
        )
    return rows
