"""A study: semaphore permits as slot keys, beside the lock and the shipped semaphore (issue 40).

``python -m benchmarks.scripts.slots [--rounds R] [--cycles C] [--batches 1,100,300]
[--limits 1,10,100] [--json PATH]``

Issue 40's target 1 asks for a permit at a lock's cost: Redis time per renewed permit at
most 1.5x the lock's per renewed hold, and an uncontended acquire+release of one permit at
most 1.5x the lock's cycle in script time. The shipped layout keeps a permit's lease end
as a zset score, whose renewal floor (``benchmarks.scripts.renewal``) is already 2x the
lock's. The layout studied here gives each permit unit a *slot key*
``<prefix>:sem:{<name>}:s:<i>`` (1 <= i <= limit) holding the lock's state, whose TTL is
the lease: a permit's renewal is then the lock's ``renew.lua`` over its slot keys. The
prototype scripts, ``slots_acquire.lua`` and ``slots_release.lua`` beside this module,
describe the layout in their headers; they are study scripts, never loaded by the package.

One private ``redis-server`` (:class:`aiolock.testing.RedisServer`, free loopback port,
stopped by pid) runs, interleaved over ``--rounds`` rounds, each subject and reads its
Redis time as renewal.py does: ``CONFIG RESETSTAT``, the calls, then ``INFO
commandstats`` ``usec`` of EVALSHA.

* **Renewal** (:func:`measure_renewal`), batches of ``--batches`` holds, one permit per
  semaphore, enough calls per round for about 300 holds: the shipped lock ``renew.lua``
  over lock states; the shipped semaphore ``renew.lua`` over (holders, expiries, limit)
  of one-permit semaphores; the slot layout's renewal, the lock's ``renew.lua`` over one
  slot key per semaphore. Microseconds per renewed hold; ratio to the lock's.
* **Cycle** (:func:`measure_cycles`), ``--cycles`` uncontended acquire+release cycles a
  round: the shipped lock (``acquire.lua`` + ``release.lua`` with the arguments the
  client sends); then, at each of ``--limits`` with 0 and limit-1 permits held by others,
  the shipped semaphore (its ``acquire.lua`` + ``release.lua`` as ``try_acquire()`` and
  the permit's ``release()`` send them), and the slot prototype: started from slot 1 (a
  scan over the held slots), from the client's hint (the slot its last grant got), both
  with the lock's guarantees (each slot's state is its fence, as a lock's is; a grant
  mark for resends only when the grant is not the hinted slot), and from the hint with
  the shipped semaphore's (a fence key written per grant, a grant mark per grant).
  Script microseconds per cycle; ratio to the lock's.

Each row gives the median over the rounds, the ratio of the medians and the median of the
per-round ratios (:mod:`benchmarks.common.paired`); ``--json`` writes them all.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis.asyncio

from aiolock._redis.scripts import Script
from aiolock.testing import RedisServer
from benchmarks.common.paired import median_ratio, ratio_of_medians, times

__all__ = [
    "CYCLE_ROWS",
    "LOCK",
    "RENEW_ROWS",
    "SCRIPTS",
    "main",
    "measure_cycles",
    "measure_renewal",
]

_HERE = Path(__file__).resolve().parent

LOCK = "lock"
SEMAPHORE = "semaphore (shipped)"
SLOT = "slot layout (lock's renew.lua)"
SLOT_FROM_1 = "slot layout, from slot 1"
SLOT_HINTED = "slot layout, client's hint"
SLOT_FENCED = "slot layout, client's hint, fence key and grant mark"
#: the renewal rows, the lock's first
RENEW_ROWS = (LOCK, SEMAPHORE, SLOT)
#: the cycle rows measured at each (limit, held) beside the lock's one
CYCLE_ROWS = (SEMAPHORE, SLOT_FROM_1, SLOT_HINTED, SLOT_FENCED)

#: script name -> source: the shipped scripts (includes spliced in) and the study's own
SCRIPTS = {
    "lock renew": Script("_kinds/lock/renew").source,
    "lock acquire": Script("_kinds/lock/acquire").source,
    "lock release": Script("_kinds/lock/release").source,
    "semaphore renew": Script("_kinds/semaphore/renew").source,
    "semaphore acquire": Script("_kinds/semaphore/acquire").source,
    "semaphore release": Script("_kinds/semaphore/release").source,
    "slot acquire": (_HERE / "slots_acquire.lua").read_text("utf-8"),
    "slot release": (_HERE / "slots_release.lua").read_text("utf-8"),
}

MANAGER = "0123456789abcdef0123456789abcdef"
LEASE_MS = "10000"
#: what a manager with the default fence_ttl (60 s) sends: fence lifetime, free-state keep
FENCE_MS = KEEP_MS = "60000"
TOMBSTONE_MS = "10000"
#: the grant mark's lifetime (the void marker's: twice the lease)
VOID_MS = "20000"
#: how long the holds set up by the benchmark last (never run out during a run)
_HELD_MS = 3_600_000
#: holds renewed per round and row, about (whole calls of the batch size)
_HOLDS_PER_ROUND = 300


async def _usec(admin: redis.asyncio.Redis) -> float:
    stats = await admin.info("commandstats")
    return float(stats.get("cmdstat_evalsha", {}).get("usec", 0))


def _rows(samples: dict[str, list[float]], lock: Sequence[float], unit: str) -> dict[str, Any]:
    return {
        name: {
            unit: statistics.median(values),
            "range": [min(values), max(values)],
            "vs_lock": ratio_of_medians(values, lock),
            "vs_lock_per_round": median_ratio(values, lock),
            "rounds": values,
        }
        for name, values in samples.items()
    }


async def measure_renewal(
    admin: redis.asyncio.Redis, n: int, rounds: int, prefix: str
) -> dict[str, Any]:
    """Redis us per renewed hold of :data:`RENEW_ROWS` in batches of *n* holds (one
    permit per semaphore), interleaved over *rounds*; every call must find all its holds.
    Keys of its own (``<prefix>renew:*``), deleted after."""
    owner = f"{MANAGER}:7"
    locks = [f"{prefix}renew:lock:{{r{i}}}" for i in range(n)]
    sems = [f"{prefix}renew:sem:{{r{i}}}" for i in range(n)]
    slots = [f"{prefix}renew:sem:{{q{i}}}:s:1" for i in range(n)]
    fields = [f"{owner}:{i}" for i in range(n)]
    seconds, micros = await admin.time()
    ends = seconds * 1000 + micros // 1000 + _HELD_MS
    pipe = admin.pipeline(transaction=False)
    for i in range(n):
        # held states as lock/state.lua writes them: field|count|token|epoch|flag
        pipe.set(locks[i], f"{owner}|1|{ends}|{ends}|", px=_HELD_MS)
        pipe.set(slots[i], f"{fields[i]}|1|{ends}|{ends}|", px=_HELD_MS)
        # a one-permit semaphore as the shipped acquire leaves it (permits.lua)
        pipe.hset(sems[i], mapping={fields[i]: 1, "#held": 1})
        pipe.pexpire(sems[i], _HELD_MS)
        pipe.zadd(f"{sems[i]}:expiry", {fields[i]: ends})
        pipe.pexpire(f"{sems[i]}:expiry", _HELD_MS)
        pipe.set(f"{sems[i]}:limit", 1, px=_HELD_MS)
    await pipe.execute()
    calls: dict[str, tuple[list[str], list[str]]] = {
        LOCK: (locks, [v for _ in range(n) for v in (owner, LEASE_MS)]),
        SEMAPHORE: (
            [k for s in sems for k in (s, f"{s}:expiry", f"{s}:limit")],
            [v for f in fields for v in (f, LEASE_MS)],
        ),
        SLOT: (slots, [v for f in fields for v in (f, LEASE_MS)]),
    }
    shas = {
        LOCK: await admin.script_load(SCRIPTS["lock renew"]),
        SEMAPHORE: await admin.script_load(SCRIPTS["semaphore renew"]),
        SLOT: await admin.script_load(SCRIPTS["lock renew"]),
    }
    per_call = max(1, math.ceil(_HOLDS_PER_ROUND / n))
    samples: dict[str, list[float]] = {name: [] for name in RENEW_ROWS}
    try:
        for _ in range(rounds):
            for name in RENEW_ROWS:
                keys, args = calls[name]
                await admin.config_resetstat()
                for _ in range(per_call):
                    held = await admin.evalsha(shas[name], len(keys), *keys, *args)
                    if list(held) != [1] * n:
                        raise RuntimeError(f"renewal {name!r}: not every hold was found")
                samples[name].append(await _usec(admin) / (per_call * n))
    finally:
        pipe = admin.pipeline(transaction=False)
        for s in sems:
            pipe.delete(s, f"{s}:expiry", f"{s}:limit")
        await pipe.execute()
        await admin.delete(*locks, *slots)
    return {
        "holds": n,
        "calls_per_round": per_call,
        "rounds": rounds,
        "rows": _rows(samples, samples[LOCK], "redis_us_per_hold"),
    }


class _Subject:
    """One row of the cycle measurement: a name's keys and a cycle of its scripts."""

    def __init__(self, row: str, base: str, limit: int, shas: dict[str, str]) -> None:
        self.row, self.base, self.limit, self.shas = row, base, limit, shas
        self.serial = 0
        self.hint = 1  # the slot row's: the first slot of its last grant

    async def cycle(self, admin: redis.asyncio.Redis) -> None:
        self.serial += 1
        field = f"{MANAGER}:{self.serial}"
        base, void = self.base, f"{self.base}:void:{MANAGER}:{self.serial}"
        if self.row == LOCK:
            token = await admin.evalsha(
                self.shas["lock acquire"], 3, base, void, f"{base}:turns", field, LEASE_MS
            )
            if not isinstance(token, int):
                raise RuntimeError(f"lock: not granted ({token!r})")
            released = await admin.evalsha(
                self.shas["lock release"], 1, base, f"{field}|1|{token}|", token
            )
        elif self.row == SEMAPHORE:
            # aiolock._kinds.semaphore.kind: try_acquire() (no claim) and release()
            token = await admin.evalsha(
                self.shas["semaphore acquire"], 7, base, f"{base}:expiry", f"{base}:claims",
                f"{base}:wants", f"{base}:limit", f"{base}:fence", void,
                field, 1, LEASE_MS, self.limit, 0, FENCE_MS, MANAGER,
            )  # fmt: skip
            if not isinstance(token, int):
                raise RuntimeError(f"semaphore: not granted ({token!r})")
            released = await admin.evalsha(
                self.shas["semaphore release"], 4, base, f"{base}:expiry", f"{base}:fence",
                f"{base}:rel:{MANAGER}:{self.serial}",
                field, MANAGER, token, FENCE_MS, TOMBSTONE_MS,
            )  # fmt: skip
        else:
            start = 1 if self.row == SLOT_FROM_1 else self.hint
            # the lock's guarantees (per-slot fencing, a mark only when the grant is not
            # the hinted slot), or the shipped semaphore's (a fence key, always a mark)
            fenced = ("0", "0") if self.row != SLOT_FENCED else (FENCE_MS, "1")
            reply = await admin.evalsha(
                self.shas["slot acquire"], 3, f"{base}:meta", f"{base}:fence", void,
                field, 1, LEASE_MS, self.limit, start, fenced[0], VOID_MS, fenced[1],
            )  # fmt: skip
            if len(reply) != 2 or reply[0] <= 3:
                raise RuntimeError(f"{self.row}: not granted ({reply!r})")
            token, slot = reply
            self.hint = slot
            released = await admin.evalsha(
                self.shas["slot release"], 1, f"{base}:s:{slot}",
                f"{field}|1|{token}|", token, KEEP_MS, MANAGER,
            )  # fmt: skip
        if not isinstance(released, int):
            raise RuntimeError(f"{self.row}: not released ({released!r})")


async def _hold_others(admin: redis.asyncio.Redis, subject: _Subject, held: int) -> None:
    """*held* permits of *subject*'s semaphore held by other clients (an hour's lease)."""
    if not held:
        return
    base = subject.base
    seconds, micros = await admin.time()
    now_ms = seconds * 1000 + micros // 1000
    pipe = admin.pipeline(transaction=False)
    others = [f"{'f' * 32}:{i}" for i in range(held)]
    if subject.row == SEMAPHORE:
        pipe.hset(base, mapping={**dict.fromkeys(others, 1), "#held": held})
        pipe.pexpire(base, _HELD_MS)
        pipe.zadd(f"{base}:expiry", dict.fromkeys(others, now_ms + _HELD_MS))
        pipe.pexpire(f"{base}:expiry", _HELD_MS)
        pipe.set(f"{base}:limit", subject.limit, px=_HELD_MS)
    else:
        token = now_ms * 1000
        for i, other in enumerate(others, start=1):
            pipe.set(f"{base}:s:{i}", f"{other}|1|{token}|{token}|", px=_HELD_MS)
    await pipe.execute()


def _configs(limits: Sequence[int]) -> list[tuple[int, int]]:
    """(limit, permits held by others): 0 and limit-1 at each limit (once at limit 1)."""
    return [(limit, held) for limit in limits for held in sorted({0, limit - 1})]


def config_label(limit: int, held: int) -> str:
    return f"limit {limit}, {held} held"


async def measure_cycles(
    admin: redis.asyncio.Redis, limits: Sequence[int], cycles: int, rounds: int, prefix: str
) -> dict[str, Any]:
    """Script us per uncontended acquire+release: the lock's, then :data:`CYCLE_ROWS` at
    each of *limits* with 0 and limit-1 permits held by others; interleaved over
    *rounds* of *cycles* cycles (after a warm-up), each on a name of its own."""
    shas = {name: await admin.script_load(body) for name, body in SCRIPTS.items()}
    subjects: dict[str, _Subject] = {LOCK: _Subject(LOCK, f"{prefix}cycle:lock:{{l}}", 1, shas)}
    tags = {SEMAPHORE: "s", SLOT_FROM_1: "a", SLOT_HINTED: "h", SLOT_FENCED: "f"}
    for limit, held in _configs(limits):
        for row in CYCLE_ROWS:
            base = f"{prefix}cycle:sem:{{{tags[row]}{limit}-{held}}}"
            subject = _Subject(row, base, limit, shas)
            await _hold_others(admin, subject, held)
            subjects[f"{row} | {config_label(limit, held)}"] = subject
    samples: dict[str, list[float]] = {key: [] for key in subjects}
    try:
        for subject in subjects.values():
            for _ in range(20):  # warm-up: the meta key, the hint
                await subject.cycle(admin)
        for _ in range(rounds):
            for key, subject in subjects.items():
                await admin.config_resetstat()
                for _ in range(cycles):
                    await subject.cycle(admin)
                samples[key].append(await _usec(admin) / cycles)
    finally:
        async for key in admin.scan_iter(match=f"{prefix}cycle:*", count=1000):
            await admin.delete(key)
    lock = samples[LOCK]
    by_config: dict[str, Any] = {}
    for limit, held in _configs(limits):
        label = config_label(limit, held)
        by_config[label] = _rows(
            {row: samples[f"{row} | {label}"] for row in CYCLE_ROWS}, lock, "script_us_per_cycle"
        )
    return {
        "cycles": cycles,
        "rounds": rounds,
        "lock": _rows({LOCK: lock}, lock, "script_us_per_cycle")[LOCK],
        "configs": by_config,
    }


async def run(
    batches: Sequence[int], limits: Sequence[int], cycles: int, rounds: int
) -> dict[str, Any]:
    with RedisServer() as server:
        admin = redis.asyncio.Redis.from_url(server.url)
        try:
            info = await admin.info("server")
            renewal = [await measure_renewal(admin, n, rounds, "study:") for n in batches]
            cycle = await measure_cycles(admin, limits, cycles, rounds, "study:")
        finally:
            await admin.aclose()
    return {
        "server": f"{info.get('server_name', 'redis')} {info['redis_version']}",
        "renewal": renewal,
        "cycle": cycle,
    }


def render(result: dict[str, Any]) -> str:
    lines = [f"Server: {result['server']}", "", "Renewal: Redis us per renewed hold"]
    lines.append("| holds/call | row | us/hold | / lock (medians) | / lock (per round) |")
    lines.append("|---|---|---|---|---|")
    for batch in result["renewal"]:
        for name, row in batch["rows"].items():
            lines.append(
                f"| {batch['holds']} | {name} | {row['redis_us_per_hold']:.2f} | "
                f"{times(row['vs_lock'])} | {times(row['vs_lock_per_round'])} |"
            )
    cycle = result["cycle"]
    lock_us = cycle["lock"]["script_us_per_cycle"]
    lines += ["", f"Cycle: script us per acquire+release (lock {lock_us:.2f})"]
    lines.append("| config | row | us/cycle | / lock (medians) | / lock (per round) |")
    lines.append("|---|---|---|---|---|")
    for label, rows in cycle["configs"].items():
        for name, row in rows.items():
            lines.append(
                f"| {label} | {name} | {row['script_us_per_cycle']:.2f} | "
                f"{times(row['vs_lock'])} | {times(row['vs_lock_per_round'])} |"
            )
    return "\n".join(lines)


def _numbers(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"a comma list of positive integers, not {text!r}")
    return values


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scripts.slots", description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--cycles", type=int, default=300, help="cycles per row and round")
    parser.add_argument("--batches", type=_numbers, default=[1, 100, 300])
    parser.add_argument("--limits", type=_numbers, default=[1, 10, 100])
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    args = parser.parse_args(argv)
    result = asyncio.run(run(args.batches, args.limits, args.cycles, args.rounds))
    print(render(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
