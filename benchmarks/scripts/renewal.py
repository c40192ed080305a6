"""The least a semaphore permit's renewal can cost Redis, beside the lock's (issue 24).

Issue 24 asks for the semaphore's Redis time per renewed permit to be within 2x the lock's.
A lock's state is one key whose TTL is the lease, so its renewal reads the key and moves
its TTL: ``GET`` and ``PEXPIRE``. A permit lives in the semaphore's layout (the holders
hash, the holders' expiry zset, the limit key): its lease end is a zset score, and an ended
lease must never be revived (another client may have counted that permit as free), so a
renewal reads the score and writes the new one (``ZSCORE`` and ``ZADD``, after one
``TIME`` per call), and the keys must then outlive the new lease (one ``PEXPIRE`` per key
of each semaphore in the batch). With one permit per semaphore, the benchmark's shape,
that upkeep is per permit.

:func:`measure` runs, interleaved over *rounds* on the same server and keys of its own
(``<prefix>floor:*``, deleted after), one call of each of these scripts over *n* holds
and reads their Redis time from ``INFO commandstats`` (``usec`` of EVALSHA after
``CONFIG RESETSTAT``):

* **lock**: the shipped ``lock/renew.lua`` (GET, compare the owner, PEXPIRE);
* **permit, score only**: ``TIME``, then ``ZSCORE`` and ``ZADD`` per permit, no key kept
  alive: less than any correct renewal of this layout can do;
* **permit, one key kept**: the same plus one ``PEXPIRE ... GT`` per permit (one of the
  semaphore's keys moved with the lease; the shipped script moves all three).

Each row's median microseconds per hold and its ratio to the lock's are what the scale
benchmark reports beside the shipped scripts' figures.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import redis.asyncio

import aiolock

__all__ = ["SCRIPTS", "measure"]

#: the shipped lock's renewal script, read from the package (no include in it)
_LOCK = (Path(aiolock.__file__).parent / "_kinds" / "lock" / "renew.lua").read_text()

_PERMIT = """
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local held = {}
for i = 1, #KEYS do
  local lease = tonumber(ARGV[2 * i])
  local ends = redis.pcall('zscore', KEYS[i], ARGV[2 * i - 1])
  local live = type(ends) == 'string' and tonumber(ends) > now  -- never revive an ended one
  if live then
    redis.call('zadd', KEYS[i], now + lease, ARGV[2 * i - 1])
    --keep
  end
  held[i] = live and 1 or 0
end
return held
"""

#: row name -> script body (each returns 1 per hold still held)
SCRIPTS = {
    "lock": _LOCK,
    "permit, score only": _PERMIT,
    "permit, one key kept": _PERMIT.replace(
        "--keep", "redis.call('pexpire', KEYS[i], lease, 'GT')"
    ),
}

_LEASE_MS = "600000"


async def measure(admin: redis.asyncio.Redis, n: int, rounds: int, prefix: str) -> dict[str, Any]:
    """Redis us per renewed hold for each of :data:`SCRIPTS` over *n* holds (median of
    *rounds*), and each row's ratio to the lock's. Every call must find all its holds."""
    base = f"{prefix}floor:"
    owner = "bench:floor:1"
    locks = [f"{base}lock:{i}" for i in range(n)]
    permits = [f"{base}permit:{i}" for i in range(n)]
    pipe = admin.pipeline(transaction=False)
    for i in range(n):
        # a held lock state as lock/state.lua writes it: field|count|token|epoch|flag
        pipe.set(locks[i], f"{owner}|1|1|1|", px=int(_LEASE_MS))
        pipe.zadd(permits[i], {f"{owner}:{i}": 2**50})
        pipe.pexpire(permits[i], int(_LEASE_MS))
    await pipe.execute()
    calls: dict[str, tuple[list[str], list[str]]] = {
        "lock": (locks, [v for _ in range(n) for v in (owner, _LEASE_MS)]),
    }
    permit_args = [v for i in range(n) for v in (f"{owner}:{i}", _LEASE_MS)]
    calls["permit, score only"] = calls["permit, one key kept"] = (permits, permit_args)
    shas = {name: await admin.script_load(body) for name, body in SCRIPTS.items()}
    per_hold: dict[str, list[float]] = {name: [] for name in SCRIPTS}
    try:
        for _ in range(rounds):
            for name, sha in shas.items():
                keys, args = calls[name]
                await admin.config_resetstat()
                held = await admin.evalsha(sha, len(keys), *keys, *args)
                if list(held) != [1] * n:
                    raise RuntimeError(f"renewal floor {name!r}: not every hold was found")
                stats = await admin.info("commandstats")
                per_hold[name].append(float(stats["cmdstat_evalsha"]["usec"]) / n)
    finally:
        await admin.delete(*locks, *permits)
    lock = statistics.median(per_hold["lock"])
    return {
        "holds": n,
        "rounds": rounds,
        "rows": {
            name: {
                "redis_us_per_hold": statistics.median(values),
                "vs_lock": statistics.median(values) / lock if lock else 0.0,
            }
            for name, values in per_hold.items()
        },
    }
