"""Where W1's time goes beside the W0 floor: one task, one client at a time, side by side.

``python -m benchmarks.client.sequential [--cycles N] [--repeats R] [--out DIR]``

Issue 21's target 3 asks W1 (one task looping acquire+release on one name) for >= 0.95x
the W0 floor, redis-py's asyncio client sending two ``EVALSHA`` of ``return 1`` per
cycle. A W1 cycle is two round trips, each waiting for Redis, so it pays for what Redis
does inside the scripts as well as for the client. This benchmark separates the two. One
private ``redis-server`` (:class:`aiolock.testing.RedisServer`, free loopback port,
stopped by pid) serves, interleaved over ``--repeats`` rounds of ``--cycles`` cycles
each, every client in a fresh event loop with fresh connections:

* **W0 floor**: ``redis.asyncio.Redis()``, two ``EVALSHA`` of ``return 1`` (W0 itself);
* **minimal client, return 1**: :class:`benchmarks.client.layers.MinimalClient` (one
  asyncio stream, a hiredis reader, nothing else) sending the same two commands;
* **the floor's client, aiolock's scripts** and **minimal client, aiolock's scripts**:
  each of those two clients sending aiolock's own ``lock/acquire`` and ``lock/release``
  with the keys and arguments the engine sends
  (:class:`benchmarks.client.layers.ScriptCycles`, which checks each grant and release);
  the minimal client's gap to itself with ``return 1`` is what the scripts cost a
  sequential cycle, the client held fixed and lean;
* **aiolock's LockManager**: ``manager.lock(name).try_acquire(timeout=5)`` and
  ``release()``, as W1 drives it;
* **redis-py's Lock**: ``Redis.lock(name, timeout=30, blocking_timeout=5)``.

Each row gives cycles per second, the client process's CPU per cycle
(``time.process_time``) and Redis's time inside commands per cycle (``INFO
commandstats``, reset before each measurement), medians over the rounds, and its
cycles/s over the floor's as the median of the per-round ratios
(:mod:`benchmarks.common.paired`) with the ratio of medians beside it, and three comparisons
per round (:func:`summarize`): the scripts' cost to the minimal client, the engine's
beside the minimal client with the same scripts, and the engine's beside the floor's
client with the same scripts. Writes
``<out>/w1_gap.json`` and a section of ``<out>/RESULTS.md`` between the ``w1-gap``
markers. Every loop is bounded by its cycle count and by a 120 s deadline.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import statistics
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from redis.asyncio import Redis

from aiolock._kinds.lock.kind import ACQUIRE, RELEASE
from aiolock._redis.client import Arg
from aiolock._redis.scripts import Script
from aiolock.testing import RedisServer
from benchmarks.client.layers import MANAGER, Cycle, MinimalClient, ScriptCycles, client_cycle
from benchmarks.common.paired import median_ratio, per_round, ratio_of_medians, times
from benchmarks.common.sections import write_section

FLOOR = "W0 floor: redis.asyncio, two EVALSHA of `return 1`"
MINIMAL_FLOOR = "minimal client, two EVALSHA of `return 1`"
REPLAY = "the floor's client, aiolock's two scripts"
MINIMAL_REPLAY = "minimal client, aiolock's two scripts"
PEER = "redis-py's Lock"
#: no measurement may run longer than this, whatever --cycles says
DEADLINE_S = 120.0


@contextlib.asynccontextmanager
async def _floor(host: str, port: int) -> AsyncIterator[Cycle]:
    """redis.asyncio sending `return 1` twice per cycle: the W0 floor."""
    redis = Redis(host=host, port=port)
    try:
        sha = await redis.script_load("return 1")

        async def floor(_: str) -> None:
            await redis.evalsha(sha, 1, "floor")
            await redis.evalsha(sha, 1, "floor")

        yield floor
    finally:
        await redis.aclose()


@contextlib.asynccontextmanager
async def _replay(host: str, port: int) -> AsyncIterator[Cycle]:
    """The floor's client (redis.asyncio, nothing else) sending aiolock's two scripts."""
    redis = Redis(host=host, port=port)
    try:
        for script in (ACQUIRE, RELEASE):
            await redis.script_load(script.source)

        async def run(script: Script, keys: tuple[str, ...], args: tuple[Arg, ...]) -> Any:
            return await redis.evalsha(script.sha, len(keys), *keys, *args)

        yield ScriptCycles(run).cycle
    finally:
        await redis.aclose()


@contextlib.asynccontextmanager
async def _minimal_floor(host: str, port: int) -> AsyncIterator[Cycle]:
    """client_floor's minimal client (an asyncio stream and a hiredis reader, nothing
    else) sending the floor's `return 1`: the same two commands per cycle with the least
    client CPU."""
    loader = Redis(host=host, port=port)
    connection = await asyncio.open_connection(host, port)
    try:
        # MinimalClient only reads a script's sha
        script = cast(Script, SimpleNamespace(sha=await loader.script_load("return 1")))
        run = MinimalClient([connection]).run

        async def floor(_: str) -> None:
            await run(script, ("floor",), ())
            await run(script, ("floor",), ())

        yield floor
    finally:
        await loader.aclose()
        connection[1].close()


#: each row's client: a context manager that yields its cycle and keeps its connections
#: open until it exits
CLIENTS: dict[str, Callable[[str, int], AbstractAsyncContextManager[Cycle]]] = {
    FLOOR: _floor,
    MINIMAL_FLOOR: _minimal_floor,
    REPLAY: _replay,
    # client_floor's minimal client runs aiolock's scripts already
    MINIMAL_REPLAY: functools.partial(client_cycle, "minimal batching client"),
    MANAGER: functools.partial(client_cycle, MANAGER),
    PEER: functools.partial(client_cycle, PEER),
}
#: the rows, in the tables' order
ROWS = tuple(CLIENTS)


async def _server_us(admin: Redis) -> float:
    """Redis's time inside commands since the last reset, in microseconds (INFO's own
    command and the reset not counted)."""
    stats: dict[str, dict[str, Any]] = await admin.info("commandstats")
    return float(
        sum(
            entry["usec"]
            for name, entry in stats.items()
            if name not in ("cmdstat_info", "cmdstat_config|resetstat")
        )
    )


async def _measure(name: str, host: str, port: int, cycles: int) -> tuple[float, float, float]:
    """Cycles/s, client CPU us per cycle and server us per cycle of *name*'s cycles."""
    admin = Redis(host=host, port=port)
    try:
        async with CLIENTS[name](host, port) as cycle:
            for _ in range(max(cycles // 20, 10)):  # warm up: scripts, connections, name
                await cycle("w1")
            await admin.config_resetstat()
            deadline = time.monotonic() + DEADLINE_S
            done = 0
            cpu, wall = time.process_time(), time.perf_counter()
            while done < cycles and time.monotonic() < deadline:
                await cycle("w1")
                done += 1
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            server = await _server_us(admin)
    finally:
        await admin.aclose()
    return done / wall, cpu / done * 1e6, server / done


def run(cycles: int, repeats: int) -> dict[str, Any]:
    samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in ROWS}
    with RedisServer() as server:
        for _ in range(repeats):
            for name in ROWS:
                samples[name].append(asyncio.run(_measure(name, server.host, server.port, cycles)))
    return summarize(samples, cycles, repeats)


def summarize(
    samples: dict[str, list[tuple[float, float, float]]], cycles: int, repeats: int
) -> dict[str, Any]:
    """Rows from each client's (cycles/s, client CPU us, server us) per round, in round
    order (index k of every list is round k)."""

    def rates_of(name: str) -> list[float]:
        return [rate for rate, _, _ in samples[name]]

    floor = rates_of(FLOOR)
    rows: list[dict[str, Any]] = []
    for name, values in samples.items():
        rates = rates_of(name)
        rows.append(
            {
                "client": name,
                "cycles_per_s": statistics.median(rates),
                "cycles_per_s_by_round": rates,
                "cpu_us_per_cycle": statistics.median(cpu for _, cpu, _ in values),
                "server_us_per_cycle": statistics.median(server for _, _, server in values),
                "vs_floor_paired": median_ratio(rates, floor),
                "vs_floor_per_round": per_round(rates, floor),
                "vs_floor": ratio_of_medians(rates, floor),
            }
        )

    def compare(label: str, mine: str, theirs: str) -> dict[str, Any]:
        return {
            "comparison": label,
            "measured": median_ratio(rates_of(mine), rates_of(theirs)),
            "per_round": per_round(rates_of(mine), rates_of(theirs)),
        }

    return {
        "cycles": cycles,
        "repeats": repeats,
        "rows": rows,
        "comparisons": [
            compare(
                "what aiolock's two scripts cost a lean client (minimal client: aiolock's "
                "scripts / `return 1`)",
                MINIMAL_REPLAY,
                MINIMAL_FLOOR,
            ),
            compare(
                "what the engine costs beside a lean client sending the same scripts "
                "(LockManager / minimal client, aiolock's scripts)",
                MANAGER,
                MINIMAL_REPLAY,
            ),
            compare(
                "the LockManager beside the floor's own client sending the same scripts",
                MANAGER,
                REPLAY,
            ),
        ],
    }


def render(result: dict[str, Any]) -> str:
    lines = [
        "### W1 beside the floor: what the scripts cost a sequential cycle",
        "",
        f"`python -m benchmarks.client.sequential`: one task, {result['cycles']:,} cycles per "
        f"measurement, {result['repeats']} interleaved rounds, medians. Client CPU: the "
        "client process's `time.process_time` per cycle; server: Redis's time inside "
        "commands per cycle (`INFO commandstats`). x floor: the median of the per-round "
        "ratios of cycles/s (each round's ratio in brackets), the ratio of medians beside it.",
        "",
        "| client | cycles/s | client CPU us/cycle | server us/cycle | x floor (per round) "
        "| x floor, ratio of medians |",
        "|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        each = ", ".join(f"{r:.2f}x" for r in row["vs_floor_per_round"])
        lines.append(
            f"| {row['client']} | {row['cycles_per_s']:,.0f} | {row['cpu_us_per_cycle']:.1f} "
            f"| {row['server_us_per_cycle']:.1f} | {times(row['vs_floor_paired'])} ({each}) "
            f"| {times(row['vs_floor'])} |"
        )
    lines += [
        "",
        "| cycles/s, side by side | median of per-round ratios (each round) |",
        "|---|---|",
    ]
    for row in result["comparisons"]:
        each = ", ".join(f"{r:.2f}x" for r in row["per_round"])
        lines.append(f"| {row['comparison']} | {times(row['measured'])} ({each}) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    if not 1 <= args.cycles <= 100_000 or not 1 <= args.repeats <= 20:
        parser.error("--cycles must be in 1..100000, --repeats in 1..20")
    started = time.monotonic()
    result = run(args.cycles, args.repeats)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "w1_gap.json").write_text(json.dumps(result, indent=2) + "\n")
    text = render(result)
    write_section(args.out / "RESULTS.md", "w1-gap", text)
    print(text)
    print(f"\n({time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
