"""Scale: per-waiter and per-hold costs at 1k, 5k, 20k and 50k (issue 24).

``python -m benchmarks.scale.sizes [--sizes 1000,5000,20000,50000] [--quick] [--no-peers]
[--budget S] [--out DIR]``

One private ``redis-server`` (:class:`aiolock.testing.RedisServer`, free loopback port,
stopped by pid) serves every phase; the server is flushed between sizes. For each size N:

* **waiters**: a holder process (``python -m benchmarks.scale.sizes --holder ...``) holds N
  locks (one per name, lease ``--lease``, renewed), and this process starts one waiter
  task per name (``async with manager.lock(name)``). Setup CPU per waiter is this
  process's ``time.process_time`` from starting the tasks until the hub counts N waiters
  and N confirmed subscriptions; memory per waiter the RSS growth over the same span.
  Then, over two lease periods (the holder renewing), the waiters' probes per second,
  counted by script in this process (attempts: the lock's acquire script; looks: its
  probe script), apart from the listener registrations that
  ``aiolock show`` reads (counted by themselves). Then the holder releases
  all N at once; CPU per wake is this process's CPU from that order until every waiter
  has held and released, divided by N; release-all is the wall time until every waiter
  has held.
* **holds**: one manager holds N locks, N read holds (``rw_lock(name).read()``) and N
  semaphore permits (one per semaphore, limit 2), lease 600 s so that no round of its own
  interferes. Each kind's holds are renewed in a round of their own
  (``Watchdog.run_round``, what the watchdog runs each period), 3 times; Redis time per
  renewal call and per hold from ``INFO commandstats`` (``CONFIG RESETSTAT`` before each).
  Beside them, the renewal floor (:mod:`benchmarks.scripts.renewal`): the least a permit's
  renewal in the semaphore's layout can cost, against the lock's renewal, on keys of its
  own (up to 300 holds a call). Then a full round of all 3N holds: its wall time and round
  trips (one round per period).
* **redis-py's Lock** (sizes up to ``--peer-max``, default 5,000): the same waiters phase
  with ``Redis.lock(name, timeout=60, sleep=0.1)`` (redis-py's default polling interval),
  its waiters sharing a ``BlockingConnectionPool`` of 64 connections; the holder holds
  with redis-py too. Its setup has no end to wait for (a poller never "waits" in a way one
  can count), so the rows compare the waiting CPU per waiter per second, Redis CPU while
  waiting, CPU per wake and release-all.

Every phase has a time limit; ``--budget`` (default 720 s) bounds the run: a size that
would start after it is skipped and said so. Writes ``<out>/scale.json`` and a section of
``<out>/RESULTS.md`` between the ``scale`` markers. Exits 1 if a phase failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import redis.asyncio

from aiolock import LockManager
from aiolock.testing import RedisServer
from benchmarks.common import metrics
from benchmarks.common.sections import write_section
from benchmarks.scripts import renewal

Result = dict[str, Any]
PREFIX = "scale"
SIZES = (1_000, 5_000, 20_000, 50_000)
QUICK_SIZES = (100, 300)
#: how many tasks acquire or release a process's holds at once (a hold belongs to the
#: task that acquired it, so these tasks live until the holds are released)
LANES = 500
HOLDS_LEASE = 600.0
RENEW_ROUNDS = 3
#: holds in each call of the renewal floor's scripts (benchmarks/scripts/renewal.py)
FLOOR_HOLDS = 300
#: calls of each floor script, interleaved (each takes about a millisecond; the median of
#: more of them steadies a figure that a shared machine's noise moves)
FLOOR_ROUNDS = 9
PEER_POOL = 64
#: why the probe rate is not N / (10 x lease): benchmarks/NOTES.md, issue 24, item 2
PROBE_NOTE = "documented: one look (the probe script) per lease end, NOTES.md issue 24 item 2"
#: seconds over which the peer rows measure the cost of waiting
PEER_WAIT = 2.0


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def names(n: int) -> list[str]:
    return [f"s{i}" for i in range(n)]


async def _in_lanes(
    items: list[Any], work: Any, release: asyncio.Event
) -> list[asyncio.Task[None]]:
    """Run ``work(item)`` for every item in ``LANES`` tasks that then wait for *release*;
    ``work`` returns an async undo that each lane runs for its items afterwards."""

    async def lane(part: list[Any]) -> None:
        undo = [await work(item) for item in part]
        await release.wait()
        for u in undo:
            await u()

    return [asyncio.create_task(lane(items[i::LANES])) for i in range(min(LANES, len(items)))]


async def _until(check: Any, deadline: float, what: str, step: float = 0.05) -> None:
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not done before the phase's time limit")
        await asyncio.sleep(step)


# -- the holder process ------------------------------------------------------------------


async def _holder(lib: str, url: str, n: int, lease: float) -> None:
    """Hold n names; answer ``stats`` and ``release`` on stdin; exit on ``exit`` or EOF."""
    release = asyncio.Event()
    done = 0
    manager: LockManager | None = None
    client: Any = None
    pool: Any = None
    if lib == "aiolock":
        manager = await LockManager.from_url(url, lease=lease, prefix=PREFIX).open()
        mgr = manager

        async def work(name: str) -> Any:
            nonlocal done
            lock = mgr.lock(name)
            await lock.acquire(timeout=60)
            done += 1
            return lock.release
    else:
        pool = redis.asyncio.BlockingConnectionPool.from_url(url, max_connections=PEER_POOL)
        client = redis.asyncio.Redis(connection_pool=pool)

        async def work(name: str) -> Any:
            nonlocal done
            lock = client.lock(f"{PREFIX}:{name}", timeout=120)
            if not await lock.acquire(blocking=False):
                raise RuntimeError(f"redis-py holder could not take {name}")
            done += 1
            return lock.release

    lanes = await _in_lanes(names(n), work, release)
    await _until(
        lambda: done == n or any(lane.done() for lane in lanes),
        time.monotonic() + 300, "holder acquiring",
    )  # fmt: skip
    for lane in lanes:
        if lane.done():
            lane.result()  # a lane that failed: its error ends the holder
    print("held", flush=True)
    try:
        while True:
            line = (await asyncio.to_thread(sys.stdin.readline)).strip()
            if line == "stats":
                trips = 0 if manager is None else manager.statistics().renewal_round_trips
                print(json.dumps({"renewal_round_trips": trips}), flush=True)
            elif line == "release":
                release.set()
                await asyncio.gather(*lanes)
                print("released", flush=True)
            else:
                break
    finally:
        release.set()
        await asyncio.gather(*lanes, return_exceptions=True)
        if manager is not None:
            await manager.aclose()
        if client is not None:
            await client.aclose()
            await pool.aclose()


class Holder:
    """The holder process, driven by lines on its stdin."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, lib: str, url: str, n: int, lease: float, limit: float) -> Holder:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "benchmarks.scale.sizes", "--holder", lib, url, str(n),
            str(lease),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        holder = cls(proc)
        try:
            await holder.expect("held", limit)
        except BaseException:
            await holder.stop()
            raise
        return holder

    async def expect(self, word: str, limit: float) -> str:
        """The holder's next line, which must start with *word*."""
        assert self.proc.stdout is not None
        text = (await asyncio.wait_for(self.proc.stdout.readline(), limit)).decode().strip()
        if not text:
            raise RuntimeError(f"holder exited (code {await self.proc.wait()})")
        if not text.startswith(word):
            raise RuntimeError(f"holder said {text!r}, expected {word!r}")
        return text

    async def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()

    async def renewal_round_trips(self) -> int:
        await self.send("stats")
        return int(json.loads(await self.expect("{", 30))["renewal_round_trips"])

    async def stop(self) -> None:
        if self.proc.returncode is None:
            try:
                await self.send("exit")
                await asyncio.wait_for(self.proc.wait(), 60)
            except (asyncio.TimeoutError, ConnectionError):  # wait_for's, on 3.10 too
                self.proc.kill()  # our own child, by its handle
                await self.proc.wait()


# -- waiters -----------------------------------------------------------------------------


async def _commandstats(admin: redis.asyncio.Redis) -> tuple[dict[str, int], dict[str, int], float]:
    info: dict[str, Any] = await admin.info("commandstats", "cpu")
    return (
        metrics.parse_commandstats(info),
        metrics.parse_commandstats(info, "usec"),
        metrics.server_cpu_s(info),
    )


class ScriptCounts:
    """Counts this process's script calls by script name, at the client's one entry point
    for scripts (INFO commandstats counts every EVALSHA alike: attempts, probes and
    listener registrations could not be told apart there), and the keys they name (a
    listener registration call carries a batch of locks)."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.keys: dict[str, int] = {}
        self._original: Any = None

    def __enter__(self) -> ScriptCounts:
        from aiolock._redis.pipeline import Pipelining

        self._original = original = Pipelining.run
        calls, named = self.calls, self.keys

        def run(client: Any, script: Any, keys: Any, args: Any) -> Any:
            calls[script.name] = calls.get(script.name, 0) + 1
            named[script.name] = named.get(script.name, 0) + len(keys)
            return original(client, script, keys, args)

        Pipelining.run = run  # type: ignore[method-assign, assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        from aiolock._redis.pipeline import Pipelining

        Pipelining.run = self._original  # type: ignore[method-assign]

    def snapshot(self) -> dict[str, int]:
        """Calls by script name, and keys named by ``keys:<script name>``."""
        return {**self.calls, **{f"keys:{name}": n for name, n in self.keys.items()}}


async def waiters_aiolock(url: str, admin: redis.asyncio.Redis, n: int, lease: float) -> Result:
    limit = 60 + n / 100  # seconds per step: generous, bounded
    holder = await Holder.start("aiolock", url, n, lease, limit)
    manager = await LockManager.from_url(url, prefix=PREFIX).open()
    held = 0
    tasks: list[asyncio.Task[None]] = []
    counts = ScriptCounts().__enter__()
    try:

        async def waiter(name: str) -> None:
            nonlocal held
            async with manager.lock(name, timeout=limit * 3):
                held += 1

        hub = manager.statistics
        rss0, cpu0 = metrics.rss_bytes(), time.process_time()
        tasks = [asyncio.create_task(waiter(name)) for name in names(n)]
        await _until(
            lambda: hub().hub.waiters == n and hub().hub.subscriptions >= n,
            time.monotonic() + limit, "waiters subscribing", step=0.02,
        )  # fmt: skip
        setup_cpu = time.process_time() - cpu0
        rss1 = metrics.rss_bytes()
        # Probes over two of the holder's lease periods.
        await asyncio.sleep(lease)  # every head has made its first look or attempt
        calls0 = counts.snapshot()
        w0 = time.monotonic()
        await asyncio.sleep(2 * lease)
        calls1 = counts.snapshot()
        window = time.monotonic() - w0

        def delta(script: str) -> int:
            return calls1.get(script, 0) - calls0.get(script, 0)

        attempts = delta("_kinds/lock/acquire")
        looks = delta("_kinds/lock/probe")
        registrations = delta("keys:_kinds/lock/listen")  # one key per lock written
        registration_calls = delta("_kinds/lock/listen")
        # Release all; wait until every waiter has held and released.
        early = held  # waiters that held before the release (a lease that ran out): 0
        cpu0, t0 = time.process_time(), time.monotonic()
        await holder.send("release")
        await _until(lambda: held == n, time.monotonic() + limit, "waiters holding", step=0.005)
        all_held = time.monotonic() - t0
        await asyncio.wait_for(asyncio.gather(*tasks), limit)
        wake_cpu = time.process_time() - cpu0
        await holder.expect("released", limit)
        return {
            "n": n,
            "lease_s": lease,
            "setup_cpu_us_per_waiter": setup_cpu / n * 1e6,
            "rss_bytes_per_waiter": (rss1 - rss0) / n,
            "wake_cpu_us_per_waiter": wake_cpu / n * 1e6,
            "all_held_s": all_held,
            "all_held_us_per_waiter": all_held / n * 1e6,
            "probe_window_s": window,
            "attempts_per_s": attempts / window,
            "looks_per_s": looks / window,
            "probes_per_s": (attempts + looks) / window,
            "listener_registrations_per_s": registrations / window,
            "listener_registration_calls_per_s": registration_calls / window,
            "probe_target_per_s": n / (10 * lease),
            "held_before_release": early,
        }
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await manager.aclose()
        await holder.stop()
        counts.__exit__()


async def waiters_redis_py(url: str, admin: redis.asyncio.Redis, n: int, wait: float) -> Result:
    limit = 60 + n / 50
    holder = await Holder.start("redis-py", url, n, 120, limit)
    pool = redis.asyncio.BlockingConnectionPool.from_url(url, max_connections=PEER_POOL)
    client = redis.asyncio.Redis(connection_pool=pool)
    held = 0
    tasks: list[asyncio.Task[None]] = []
    try:

        async def waiter(name: str) -> None:
            nonlocal held
            lock = client.lock(f"{PREFIX}:{name}", timeout=60, sleep=0.1)
            if not await lock.acquire(blocking_timeout=limit * 3):
                raise TimeoutError(f"redis-py waiter on {name} timed out")
            held += 1
            await lock.release()

        tasks = [asyncio.create_task(waiter(name)) for name in names(n)]
        await asyncio.sleep(1.0)  # every poller is in its loop
        _, _, scpu0 = await _commandstats(admin)
        cpu0, w0 = time.process_time(), time.monotonic()
        await asyncio.sleep(wait)
        window = time.monotonic() - w0
        waiting_cpu = time.process_time() - cpu0
        _, _, scpu1 = await _commandstats(admin)
        cpu0, t0 = time.process_time(), time.monotonic()
        await holder.send("release")
        await _until(lambda: held == n, time.monotonic() + limit, "redis-py waiters holding", 0.005)
        all_held = time.monotonic() - t0
        await asyncio.wait_for(asyncio.gather(*tasks), limit)
        wake_cpu = time.process_time() - cpu0
        await holder.expect("released", limit)
        return {
            "n": n,
            "waiting_cpu_us_per_waiter_s": waiting_cpu / n / window * 1e6,
            "waiting_redis_cpu_pct": (scpu1 - scpu0) / window * 100,
            "wake_cpu_us_per_waiter": wake_cpu / n * 1e6,
            "all_held_s": all_held,
        }
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.aclose()
        await pool.aclose()
        await holder.stop()


async def waiting_cost_aiolock(url: str, admin: redis.asyncio.Redis, n: int, wait: float) -> Result:
    """The aiolock side of the peer rows: waiting CPU and Redis CPU over *wait* s, with a
    holder whose lease (10 s) does not end in the window, as the peer's does not."""
    limit = 60 + n / 100
    holder = await Holder.start("aiolock", url, n, 10.0, limit)
    manager = await LockManager.from_url(url, prefix=PREFIX).open()
    tasks: list[asyncio.Task[None]] = []
    try:

        async def waiter(name: str) -> None:
            async with manager.lock(name, timeout=limit * 3):
                pass

        tasks = [asyncio.create_task(waiter(name)) for name in names(n)]
        hub = manager.statistics
        await _until(
            lambda: hub().hub.waiters == n and hub().hub.subscriptions >= n,
            time.monotonic() + limit, "waiters subscribing", step=0.02,
        )  # fmt: skip
        _, _, scpu0 = await _commandstats(admin)
        cpu0, w0 = time.process_time(), time.monotonic()
        await asyncio.sleep(wait)
        window = time.monotonic() - w0
        waiting_cpu = time.process_time() - cpu0
        _, _, scpu1 = await _commandstats(admin)
        await holder.send("release")
        await asyncio.wait_for(asyncio.gather(*tasks), limit)
        await holder.expect("released", limit)
        return {
            "waiting_cpu_us_per_waiter_s": waiting_cpu / n / window * 1e6,
            "waiting_redis_cpu_pct": (scpu1 - scpu0) / window * 100,
        }
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await manager.aclose()
        await holder.stop()


# -- holds -------------------------------------------------------------------------------


async def holds(url: str, admin: redis.asyncio.Redis, n: int) -> Result:
    manager = await LockManager.from_url(url, lease=HOLDS_LEASE, prefix=PREFIX).open()
    release = asyncio.Event()
    lanes: list[asyncio.Task[None]] = []
    try:

        async def hold(item: tuple[str, str]) -> Any:
            kind, name = item
            if kind == "lock":
                lock = manager.lock(name)
                await lock.acquire(timeout=60)
                return lock.release
            if kind == "read":
                read = manager.rw_lock(name).read()
                await read.acquire(timeout=60)
                return read.release
            permit = await manager.semaphore(name, 2).acquire(timeout=60)
            return permit.release

        items = [(kind, f"{kind}{i}") for kind in ("lock", "read", "sem") for i in range(n)]
        t0 = time.monotonic()
        lanes = await _in_lanes(items, hold, release)
        engine = manager._engine
        assert engine is not None
        await _until(lambda: len(engine.registry) >= 3 * n, t0 + 120 + n / 100, "holding", 0.05)
        acquire_s = time.monotonic() - t0
        by_kind: dict[str, Result] = {}
        for kind in ("lock", "read lock", "semaphore"):
            chosen = [h for h in engine.registry.renewable() if h.kind.name == kind]
            per_call, per_hold, walls, calls = [], [], [], 0
            for _ in range(RENEW_ROUNDS):
                await admin.config_resetstat()
                t = time.monotonic()
                if not await engine.watchdog.run_round(chosen):
                    raise RuntimeError(f"a renewal round of {kind} holds failed")
                walls.append(time.monotonic() - t)
                stats = await admin.info("commandstats")
                ev = stats.get("cmdstat_evalsha", {})
                calls = int(ev.get("calls", 0))
                per_call.append(float(ev.get("usec", 0)) / max(1, calls))
                per_hold.append(float(ev.get("usec", 0)) / max(1, len(chosen)))
            by_kind[kind] = {
                "holds": len(chosen),
                "calls_per_round": calls,
                "batch": chosen[0].kind.renew_batch if chosen else 0,
                "redis_us_per_call": statistics.median(per_call),
                "redis_us_per_call_max": max(per_call),
                "redis_us_per_hold": statistics.median(per_hold),
                "round_wall_s": statistics.median(walls),
            }
        # the least this layout's permit renewal can cost, on the same server
        floor = await renewal.measure(admin, min(n, FLOOR_HOLDS), FLOOR_ROUNDS, PREFIX)
        trips0, t = engine.watchdog.round_trips, time.monotonic()
        ok = await engine.watchdog.renew_all()
        full_wall = time.monotonic() - t
        return {
            "n": n,
            "acquire_all_s": acquire_s,
            "by_kind": by_kind,
            "renew_floor": floor,
            "full_round_ok": ok,
            "full_round_s": full_wall,
            "round_trips_per_period": engine.watchdog.round_trips - trips0,
        }
    finally:
        release.set()
        await asyncio.wait_for(asyncio.gather(*lanes, return_exceptions=True), 120 + n / 100)
        await manager.aclose()


# -- the run -----------------------------------------------------------------------------


def _phases(
    url: str, admin: redis.asyncio.Redis, n: int, lease: float, peer_max: int
) -> list[tuple[str, Callable[[], Awaitable[Result]]]]:
    """The phases of one size, in order (redis-py's only up to *peer_max*)."""
    phases: list[tuple[str, Callable[[], Awaitable[Result]]]] = [
        ("waiters", partial(waiters_aiolock, url, admin, n, lease)),
        ("holds", partial(holds, url, admin, n)),
    ]
    if n <= peer_max:
        phases.append(("peer_aiolock", partial(waiting_cost_aiolock, url, admin, n, PEER_WAIT)))
        phases.append(("peer_redis_py", partial(waiters_redis_py, url, admin, n, PEER_WAIT)))
    return phases


async def run(sizes: list[int], peer_max: int, lease: float, budget: float) -> Result:
    started = time.monotonic()
    out: Result = {"sizes": sizes, "lease_s": lease, "peer_max": peer_max, "rows": [],
                   "skipped": [], "errors": []}  # fmt: skip
    with RedisServer() as server:
        admin = redis.asyncio.Redis.from_url(server.url, client_name="scale-admin")
        try:
            for n in sizes:
                if time.monotonic() - started > budget:
                    out["skipped"].append(n)
                    log(f"N={n}: skipped, the {budget:.0f} s budget is spent")
                    continue
                row: Result = {"n": n}
                for phase, call in _phases(server.url, admin, n, lease, peer_max):
                    t = time.monotonic()
                    try:
                        row[phase] = await call()
                    except Exception as exc:  # recorded; the run goes on with the next phase
                        out["errors"].append(f"N={n} {phase}: {type(exc).__name__}: {exc}")
                        log(out["errors"][-1])
                    log(f"N={n} {phase}: {time.monotonic() - t:.1f} s")
                    await admin.flushdb()
                out["rows"].append(row)
        finally:
            await admin.aclose()
    out["seconds"] = time.monotonic() - started
    out["targets"] = targets(out["rows"])
    return out


def _status(ok: bool) -> str:
    return "met" if ok else "**not met**"


def targets(rows: list[Result]) -> list[Result]:
    """Each of issue 24's targets, measured and judged, as report rows."""
    found: list[Result] = []
    by_n = {row["n"]: row for row in rows}

    def add(target: str, measured: str, ok: bool, note: str = "") -> None:
        status = _status(ok) + (f" ({note})" if note and not ok else "")
        found.append({"target": target, "measured": measured, "status": status})

    small, large = min(by_n, default=0), max(by_n, default=0)
    if 5_000 in by_n and 50_000 in by_n:
        small, large = 5_000, 50_000
    a, b = by_n.get(small, {}).get("waiters"), by_n.get(large, {}).get("waiters")
    if a and b and small != large:
        for key, what in (("wake_cpu_us_per_waiter", "CPU per wake"),
                          ("setup_cpu_us_per_waiter", "setup CPU per waiter")):  # fmt: skip
            ratio = b[key] / a[key]
            add(f"{what} at {large:,} within 1.3x of {small:,}",
                f"{b[key]:.0f} vs {a[key]:.0f} us = {ratio:.2f}x", ratio <= 1.3)  # fmt: skip
    for n, row in sorted(by_n.items()):
        w = row.get("waiters")
        if w:
            add(f"release-all at {n:,} within 100 us x N ({n * 100e-6:.2f} s)",
                f"{w['all_held_s']:.2f} s ({w['all_held_us_per_waiter']:.0f} us x N)",
                w["all_held_us_per_waiter"] <= 100)  # fmt: skip
            add(f"probes at {n:,} <= N / (10 x lease) = {w['probe_target_per_s']:,.0f}/s",
                f"{w['probes_per_s']:,.0f}/s ({max(0, w['attempts_per_s']):,.0f} attempts, "
                f"{w['looks_per_s']:,.0f} looks)",
                w["probes_per_s"] <= w["probe_target_per_s"], PROBE_NOTE)  # fmt: skip
        h = row.get("holds")
        if h:
            for kind, k in h["by_kind"].items():
                add(f"renewal call < 1 ms at {n:,}: {kind}",
                    f"{k['redis_us_per_call']:.0f} us (max {k['redis_us_per_call_max']:.0f})",
                    k["redis_us_per_call"] < 1000)  # fmt: skip
            lock, sem = h["by_kind"]["lock"], h["by_kind"]["semaphore"]
            ratio = sem["redis_us_per_hold"] / lock["redis_us_per_hold"]
            floor = h["renew_floor"]["rows"]
            add(f"semaphore per permit within 2x lock at {n:,}",
                f"{sem['redis_us_per_hold']:.2f} vs {lock['redis_us_per_hold']:.2f} us "
                f"= {ratio:.2f}x", ratio <= 2.0,
                "this layout's floor in the same run: ZSCORE + ZADD alone "
                f"{floor['permit, score only']['vs_lock']:.2f}x, with one key kept "
                f"{floor['permit, one key kept']['vs_lock']:.2f}x")  # fmt: skip
    return found


def render(result: Result) -> str:
    rows = [row for row in result["rows"] if "waiters" in row or "holds" in row]
    lines = [
        "### Scale: per-waiter and per-hold costs (issue 24)",
        "",
        f"`python -m benchmarks.scale.sizes --sizes {','.join(str(n) for n in result['sizes'])}` "
        f"({result['seconds']:.0f} s; one run, 2-core machine shared with other work). "
        f"Holder's lease in the waiters phase {result['lease_s']:g} s. See the module "
        "docstring for what each figure is.",
        "",
        "| N | setup CPU us/waiter | RSS B/waiter | CPU us/wake | release-all s "
        "| us x N | attempts/s | looks/s | target probes/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        w = row.get("waiters")
        if w:
            lines.append(
                f"| {row['n']:,} | {w['setup_cpu_us_per_waiter']:.0f} "
                f"| {w['rss_bytes_per_waiter']:,.0f} | {w['wake_cpu_us_per_waiter']:.0f} "
                f"| {w['all_held_s']:.2f} | {w['all_held_us_per_waiter']:.0f} "
                f"| {max(0, w['attempts_per_s']):,.0f} | {w['looks_per_s']:,.0f} "
                f"| {w['probe_target_per_s']:,.0f} |"
            )
    early = [f"{row['n']:,}: {row['waiters']['held_before_release']}" for row in rows
             if row.get("waiters", {}).get("held_before_release")]  # fmt: skip
    if early:
        lines += [
            "",
            "Waiters that held before the release (the holder's lease ran out "
            "under load; their wakes are missing from CPU per wake): " + ", ".join(early),
        ]
    lines += [
        "",
        "| N | kind | batch | calls/round | Redis us/call (median, max of 3) | Redis us/hold "
        "| round s |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        h = row.get("holds")
        if h:
            for kind, k in h["by_kind"].items():
                lines.append(
                    f"| {row['n']:,} | {kind} | {k['batch']} | {k['calls_per_round']} "
                    f"| {k['redis_us_per_call']:.0f}, {k['redis_us_per_call_max']:.0f} "
                    f"| {k['redis_us_per_hold']:.2f} | {k['round_wall_s']:.3f} |"
                )
            lines.append(
                f"| {row['n']:,} | all 3N in one round | | {h['round_trips_per_period']} "
                f"round trips per period | | | {h['full_round_s']:.3f} |"
            )
            floor = h["renew_floor"]
            for name, f in floor["rows"].items():
                lines.append(
                    f"| {row['n']:,} | floor: {name} | {floor['holds']} | 1 "
                    f"| | {f['redis_us_per_hold']:.2f} ({f['vs_lock']:.2f}x the floor's lock) | |"
                )
    peers = [row for row in rows if "peer_redis_py" in row and "peer_aiolock" in row]
    if peers:
        lines += [
            "",
            "Side by side with redis-py's Lock (polling every 0.1 s, 64 pooled connections); "
            "ratios are aiolock / redis-py (below 1: aiolock spends less):",
            "",
            "| N | waiting CPU us/waiter/s | Redis CPU while waiting % | CPU us/wake "
            "| release-all s |",
            "|---|---|---|---|---|",
        ]
        for row in peers:
            a, p, w = row["peer_aiolock"], row["peer_redis_py"], row["waiters"]

            def cell(x: float, y: float, fmt: str) -> str:
                return f"{x:{fmt}} vs {y:{fmt}} = {x / y:.3f}x" if y else f"{x:{fmt}} vs 0"

            wait_cpu = "waiting_cpu_us_per_waiter_s"
            lines.append(
                f"| {row['n']:,} "
                f"| {cell(a[wait_cpu], p[wait_cpu], '.1f')} "
                f"| {cell(a['waiting_redis_cpu_pct'], p['waiting_redis_cpu_pct'], '.1f')} "
                f"| {cell(w['wake_cpu_us_per_waiter'], p['wake_cpu_us_per_waiter'], '.0f')} "
                f"| {cell(w['all_held_s'], p['all_held_s'], '.2f')} |"
            )
    lines += ["", "| target (issue 24) | measured | status |", "|---|---|---|"]
    lines += [f"| {t['target']} | {t['measured']} | {t['status']} |" for t in result["targets"]]
    if result["skipped"]:
        lines += ["", f"Skipped (time budget): N = {', '.join(map(str, result['skipped']))}."]
    if result["errors"]:
        lines += ["", "Errors: " + "; ".join(result["errors"])]
    return "\n".join(lines)


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--sizes takes whole numbers separated by commas, got {text!r}") from None
    if not sizes or any(not 10 <= n <= 100_000 for n in sizes):
        raise ValueError(f"--sizes must each be in 10..100000, got {text!r}")
    return sizes


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--holder"]:  # the holder process (started by this module)
        lib, url, n, lease = argv[1], argv[2], int(argv[3]), float(argv[4])
        asyncio.run(_holder(lib, url, n, lease))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--quick", action="store_true", help="small sizes, for a test")
    parser.add_argument("--no-peers", action="store_true", help="skip redis-py's Lock")
    parser.add_argument("--peer-max", type=int, default=5_000)
    parser.add_argument("--lease", type=float, default=4.0)
    parser.add_argument("--budget", type=float, default=720.0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    try:
        sizes = list(QUICK_SIZES) if args.quick else parse_sizes(args.sizes)
    except ValueError as exc:
        parser.error(str(exc))
    if not 0.5 <= args.lease <= 30 or not 10 <= args.budget <= 3600:
        parser.error("--lease must be in 0.5..30 s and --budget in 10..3600 s")
    peer_max = 0 if args.no_peers else args.peer_max
    result = asyncio.run(run(sizes, peer_max, 1.0 if args.quick else args.lease, args.budget))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scale.json").write_text(json.dumps(result, indent=2) + "\n")
    text = render(result)
    write_section(args.out / "RESULTS.md", "scale", text)
    print(text)
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
