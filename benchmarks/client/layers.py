"""Where W2's client CPU goes: the same 64-task workload through one layer more at a time.

``python -m benchmarks.client.layers [--seconds S] [--repeats R] [--tasks N] [--out DIR]``

Issue 7 asks for W2 (64 tasks looping acquire+release on distinct names) at 3x the best
Python peer. W2 is bound by the client process's CPU, not by Redis or round trips, so this
measures what each layer of aiolock's client costs per cycle. One private ``redis-server``
(:class:`aiolock.testing.RedisServer`, free loopback port, stopped by pid) serves, in one
process and interleaved over ``--repeats`` rounds of ``--seconds`` each:

* **minimal batching client**: what W2 needs and nothing more. Commands wait in one queue
  and go out as pipelines (of at most ``Client.MAX_BATCH`` commands, as aiolock's do), at
  most 3 in flight, each on its own asyncio stream connection,
  replies read with a ``hiredis.Reader``; aiolock's own ``lock/acquire`` and
  ``lock/release`` scripts with the keys and arguments the engine sends, packed by the
  same function, and their replies decoded by the same functions. No timeouts, retries,
  error translation, pool, owner tracking, renewal or local queue;
* **aiolock's Client**: the same scripts and arguments through ``Client.run`` (the command
  layer: redis-py's pool and connections, a time limit per round trip, a retry on a fresh
  connection, error translation, script loading);
* **aiolock's LockManager**: ``manager.lock(name).try_acquire(timeout=5)`` and
  ``release()``, as W2 does (the engine on top: ownership per task, the local wait queue,
  hand-over, the hold registry, renewal by the watchdog, fencing tokens);
* **redis-py's Lock**: ``Redis.lock(name, timeout=30, blocking_timeout=5)``, as W2 does.

Every client is made by ``Redis()`` defaults where it uses redis-py. Each row gives cycles
per second and the client process's CPU per cycle (``time.process_time``), medians over the
repeats, its CPU over the minimal client's both as the ratio of the two medians and as the
median of the per-round ratios (round k's CPU per cycle over the minimal client's in round
k, :mod:`benchmarks.common.paired`), and issue 21's target 2 as a row: the LockManager's client
CPU per cycle <= 2.0x the minimal batching client's (met / not met), judged on the median
of the per-round ratios, the rounds' clients having run within seconds of each other
(the minimal client's own spread from round to round once decided the ratio of medians:
benchmarks/NOTES.md); the ratio of medians is shown beside it. Writes
``<out>/client_floor.json`` and a section of ``<out>/RESULTS.md`` between the
``client-floor`` markers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import hiredis
from redis.asyncio import Redis

from aiolock import LockManager
from aiolock._engine.contention import DEFAULT_TOP_K
from aiolock._engine.kind import Granted, ReleaseStatus, decode_attempt, decode_release
from aiolock._keys import KeySpace
from aiolock._kinds.lock.kind import ACQUIRE, DEFAULT_KEEP_MS, RELEASE
from aiolock._redis.client import Arg, Client, _pack
from aiolock._redis.scripts import Script
from aiolock.testing import RedisServer
from benchmarks.common.paired import median_ratio, per_round, ratio_of_medians, times
from benchmarks.common.sections import write_section

PREFIX = "clientfloor"
LEASE_MS = 30_000
MANAGER_ID = "0123456789abcdef0123456789abcdef"
MANAGER = "aiolock's LockManager"
#: the same without per-name contention statistics (what they cost W2)
MANAGER_NO_STATS = "aiolock's LockManager, top_k=0"
ROWS = ("minimal batching client", "aiolock's Client", MANAGER, "redis-py's Lock")
#: issue 21's target 2 (its client-CPU half; W2 cycles/s vs main is the main harness's)
TARGET = "aiolock's LockManager: client CPU per W2 cycle <= 2.0x the minimal batching client"

#: one cycle of one task: acquire then release *name*
Cycle = Callable[[str], Awaitable[None]]


def _bad(reply: Any) -> Exception:
    return RuntimeError(f"unexpected reply {reply!r}")


class ScriptCycles:
    """Acquire+release cycles made of the engine's two script calls, sent by *run*."""

    def __init__(
        self, run: Callable[[Script, tuple[str, ...], tuple[Arg, ...]], Awaitable[Any]]
    ) -> None:
        self._run = run
        self._keys = KeySpace(PREFIX, MANAGER_ID)
        self._number = 0
        # how long a free state is kept, as a manager with the default fence_ttl sends it
        # (the longer of fence_ttl and the tombstone lifetime: aiolock._kinds.lock.kind)
        self.keep_ms = "60000"

    async def cycle(self, name: str) -> None:
        keys = self._keys.keys(name)
        self._number += 1
        field = f"{MANAGER_ID}:{self._number}"
        void = keys.void(f"{MANAGER_ID}:{self._number}")
        granted = decode_attempt(
            await self._run(ACQUIRE, (keys.lock, void, keys.turns), (field, LEASE_MS)), _bad
        )
        if not isinstance(granted, Granted):
            raise RuntimeError(f"{name} was busy: names are distinct, nothing else holds it")
        # how the held state begins (field, one hold, token), token; a final release of
        # this manager's field with the default keep, no successor and nobody listening,
        # so nothing more (aiolock._kinds.lock.kind)
        token = granted.token
        args: tuple[str | int, ...] = (f"{field}|1|{token}|", token)
        if self.keep_ms != DEFAULT_KEEP_MS:
            args += (self.keep_ms,)
        released = decode_release(await self._run(RELEASE, (keys.lock,), args), _bad)
        if released.status is not ReleaseStatus.RELEASED:
            raise RuntimeError(f"{name} was not released: {released}")


class MinimalClient:
    """Pipelines of queued commands, at most one per connection in flight, and nothing else."""

    def __init__(self, connections: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]):
        self._idle = list(connections)
        self._queue: deque[tuple[tuple[Arg, ...], asyncio.Future[Any]]] = deque()

    async def run(self, script: Script, keys: tuple[str, ...], args: tuple[Arg, ...]) -> Any:
        future = asyncio.get_running_loop().create_future()
        self._queue.append((("EVALSHA", script.sha, len(keys), *keys, *args), future))
        self._kick()
        return await future

    def _kick(self) -> None:
        while self._queue and self._idle:
            queue = self._queue
            batch = [queue.popleft() for _ in range(min(len(queue), Client.MAX_BATCH))]
            asyncio.get_running_loop().create_task(self._flush(self._idle.pop(), batch))

    async def _flush(
        self,
        connection: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        batch: list[tuple[tuple[Arg, ...], asyncio.Future[Any]]],
    ) -> None:
        stream, writer = connection
        writer.write(_pack([command for command, _ in batch]))
        reader = hiredis.Reader()
        for _, future in batch:
            reply = reader.gets()
            while reply is False:
                data = await stream.read(65536)
                if not data:
                    raise ConnectionError("the benchmark's server closed the connection")
                reader.feed(data)
                reply = reader.gets()
            future.set_result(reply)
        self._idle.append(connection)
        self._kick()


async def _loop(cycle: Cycle, tasks: int, seconds: float) -> tuple[float, float]:
    """Cycles per second and client CPU per cycle (us) of *tasks* tasks for *seconds*."""
    counts = [0] * tasks

    async def worker(i: int) -> None:
        name = f"w2:{i}"
        while time.monotonic() < deadline:
            await cycle(name)
            counts[i] += 1

    for i in range(tasks):  # warm up: scripts loaded, connections open, names used once
        await cycle(f"w2:{i}")
    cpu, wall = time.process_time(), time.monotonic()
    deadline = wall + seconds
    await asyncio.gather(*(worker(i) for i in range(tasks)))
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    n = sum(counts)
    return n / wall, cpu / max(n, 1) * 1e6


@contextlib.asynccontextmanager
async def client_cycle(name: str, host: str, port: int) -> AsyncIterator[Cycle]:
    """The cycle of the client *name* (one of :data:`ROWS`), its connections open meanwhile.

    Also :mod:`benchmarks.client.instructions`'s clients, so both measure the same code.
    """
    if name == "minimal batching client":
        connections = [await asyncio.open_connection(host, port) for _ in range(3)]
        loader = Redis(host=host, port=port)
        try:
            for script in (ACQUIRE, RELEASE):
                await loader.script_load(script.source)
            yield ScriptCycles(MinimalClient(connections).run).cycle
        finally:
            await loader.aclose()
            for _, writer in connections:
                writer.close()
    elif name == "aiolock's Client":
        redis = Redis(host=host, port=port)
        client = Client(redis)
        try:
            yield ScriptCycles(client.run).cycle
        finally:
            await client.aclose()
            await redis.aclose()
    elif name in (MANAGER, MANAGER_NO_STATS):
        redis = Redis(host=host, port=port)
        top_k = 0 if name == MANAGER_NO_STATS else DEFAULT_TOP_K
        try:
            async with LockManager(
                redis, prefix=PREFIX, lease=LEASE_MS / 1000, top_k=top_k
            ) as manager:

                async def cycle(lock_name: str) -> None:
                    lock = manager.lock(lock_name)
                    if not await lock.try_acquire(timeout=5):
                        raise RuntimeError(f"{lock_name} was busy")
                    await lock.release()

                yield cycle
        finally:
            await redis.aclose()
    else:
        redis = Redis(host=host, port=port)
        try:

            async def peer(lock_name: str) -> None:
                lock = redis.lock(
                    f"redis-py:{lock_name}", timeout=LEASE_MS / 1000, blocking_timeout=5
                )
                if not await lock.acquire():
                    raise RuntimeError(f"{lock_name} was busy")
                await lock.release()

            yield peer
        finally:
            await redis.aclose()


async def _row(name: str, host: str, port: int, tasks: int, seconds: float) -> tuple[float, float]:
    """One measurement of the client *name* (a fresh event loop and connections)."""
    async with client_cycle(name, host, port) as cycle:
        return await _loop(cycle, tasks, seconds)


def run(seconds: float, repeats: int, tasks: int) -> dict[str, Any]:
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in ROWS}
    with RedisServer() as server:
        for _ in range(repeats):
            for name in ROWS:
                samples[name].append(
                    asyncio.run(_row(name, server.host, server.port, tasks, seconds))
                )
    return summarize(samples, tasks, seconds, repeats)


def summarize(
    samples: dict[str, list[tuple[float, float]]], tasks: int, seconds: float, repeats: int
) -> dict[str, Any]:
    """Rows and the target from each client's (cycles/s, CPU us/cycle) per round, in
    round order (index k of every list is round k)."""
    minimal = [cpu for _, cpu in samples[ROWS[0]]]
    peer_rate = statistics.median(rate for rate, _ in samples[ROWS[-1]])
    rows: list[dict[str, Any]] = []
    for name, values in samples.items():
        rate = statistics.median(r for r, _ in values)
        cpu = [c for _, c in values]
        rows.append(
            {
                "client": name,
                "cycles_per_s": rate,
                "cpu_us_per_cycle": statistics.median(cpu),
                "cpu_range": [min(cpu), max(cpu)],
                "cpu_by_round": cpu,
                "cpu_vs_minimal": ratio_of_medians(cpu, minimal),
                "cpu_vs_minimal_paired": median_ratio(cpu, minimal),
                "rate_vs_redis_py": rate / peer_rate,
            }
        )
    manager = next(row for row in rows if row["client"] == MANAGER)
    paired = manager["cpu_vs_minimal_paired"]
    targets = [
        {
            "target": TARGET,
            # judged: the median of the per-round ratios (each round's clients ran
            # seconds apart); the ratio of the medians beside it
            "measured": paired,
            "per_round": per_round(manager["cpu_by_round"], minimal),
            "ratio_of_medians": manager["cpu_vs_minimal"],
            "limit": 2.0,
            "met": None if paired is None else paired <= 2.0,
        }
    ]
    return {
        "tasks": tasks,
        "seconds": seconds,
        "repeats": repeats,
        "rows": rows,
        "targets": targets,
    }


def render(result: dict[str, Any]) -> str:
    lines = [
        "### Client floor: where W2's client CPU goes",
        "",
        f"`python -m benchmarks.client.layers`: {result['tasks']} tasks on distinct names, "
        f"{result['seconds']:g} s per measurement, median of {result['repeats']} interleaved "
        "repeats (rounds); client CPU is the client process's `time.process_time` per cycle. "
        "CPU / minimal: each row's median over the minimal client's; per round: the median "
        "over the rounds of the row's CPU over the minimal client's in the same round, which "
        "the target is judged on.",
        "",
        "| client | cycles/s | client CPU us/cycle | range | CPU / minimal "
        "| CPU / minimal, per round | cycles/s / redis-py |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        low, high = row["cpu_range"]
        lines.append(
            f"| {row['client']} | {row['cycles_per_s']:,.0f} | {row['cpu_us_per_cycle']:.1f} "
            f"| {low:.1f}-{high:.1f} | {times(row['cpu_vs_minimal'])} "
            f"| {times(row['cpu_vs_minimal_paired'])} | {row['rate_vs_redis_py']:.2f}x |"
        )
    lines += [
        "",
        "Each row adds layers to the one above it (see the module docstring): the minimal "
        "client sends the same scripts with the same arguments, so the gaps are what "
        "aiolock's command layer and engine cost in the client process per cycle.",
        "",
        "| target (issue 21) | measured: median of per-round ratios | ratio of medians | |",
        "|---|---|---|---|",
    ]
    for target in result["targets"]:
        verdict = "n/a" if target["met"] is None else "met" if target["met"] else "**not met**"
        each = ", ".join(f"{r:.2f}x" for r in target["per_round"])
        lines.append(
            f"| {target['target']} | {times(target['measured'])} ({each}) "
            f"| {times(target['ratio_of_medians'])} | {verdict} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    if not 0 < args.seconds <= 60 or not 1 <= args.repeats <= 20 or not 1 <= args.tasks <= 1024:
        parser.error("--seconds must be in (0, 60], --repeats in 1..20, --tasks in 1..1024")
    started = time.monotonic()
    result = run(args.seconds, args.repeats, args.tasks)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "client_floor.json").write_text(json.dumps(result, indent=2) + "\n")
    text = render(result)
    write_section(args.out / "RESULTS.md", "client-floor", text)
    print(text)
    print(f"\n({time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
