"""The workloads. Each runs inside one worker process and returns a JSON-able dict.

All loops are bounded by a cycle count and/or a deadline, and every acquire has a
timeout. Times are ``time.monotonic()`` (CLOCK_MONOTONIC, system-wide on Linux, so
records from several processes on one machine can be merged).
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
import tracemalloc
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio

from benchmarks.common import metrics
from benchmarks.common.metrics import COUNTS, Admin, ClientCounts, ServerSnapshot
from benchmarks.peers.adapters import AcquireTimeout, LockAdapter
from benchmarks.peers.config import ACQUIRE_TIMEOUT, LEASE

Result = dict[str, Any]
#: (worker id, acquire-return time, release-return time) of one acquisition.
Record = tuple[str, float, float]

SUBSCRIBE_COMMANDS = frozenset(
    {"subscribe", "psubscribe", "ssubscribe", "unsubscribe", "punsubscribe", "sunsubscribe"}
)


@dataclass
class Window:
    """Client counts, server commandstats, CPU and wall time at one instant."""

    client: ClientCounts
    server: ServerSnapshot | None
    cpu: float
    wall: float

    @classmethod
    async def take(cls, admin: Admin | None) -> Window:
        server = await admin.snapshot() if admin is not None else None
        return cls(COUNTS.copy(), server, time.process_time(), time.monotonic())

    def until(self, later: Window) -> Result:
        """Deltas between this window start and *later*, as report fields."""
        client = later.client.minus(self.client)
        out: Result = {
            "wall_s": later.wall - self.wall,
            "cpu_s": later.cpu - self.cpu,
            "round_trips": client.round_trips,
            "top_level_commands": client.total_commands,
            "top_level_by_name": dict(client.commands),
        }
        if self.server is not None and later.server is not None:
            server = metrics.server_delta(self.server, later.server)
            out["all_commands"] = sum(server.values())
            out["all_by_name"] = dict(server)
            out["in_script_commands"] = max(0, out["all_commands"] - client.total_commands)
            usec = metrics.usec_delta(self.server, later.server, server)
            out["server_usec_by_name"] = dict(usec)
            out["server_cpu_s"] = later.server.cpu_s - self.server.cpu_s
            out["server_usec"] = sum(usec.values())
            out["sent_usec"] = metrics.sent_usec(usec, server, client.commands)
        return out


def resent_usec(total: Result, sent: Counter[str]) -> None:
    """Recompute ``sent_usec`` of a window for the commands *sent* by other processes."""
    if "server_usec_by_name" in total:
        total["sent_usec"] = metrics.sent_usec(
            Counter(total["server_usec_by_name"]), Counter(total["all_by_name"]), sent
        )


def per(total: Result, n: int, keys: Sequence[str] = ()) -> Result:
    """``<key>_per`` fields: *total* counts divided by *n* operations; server time and
    CPU as ``sent_us_per_op`` and ``server_cpu_us_per_op`` (microseconds)."""
    out: Result = {}
    for key in ("round_trips", "top_level_commands", "all_commands", "in_script_commands", *keys):
        if key in total and n > 0:
            out[f"{key}_per_op"] = total[key] / n
    if n > 0 and "sent_usec" in total:
        out["sent_us_per_op"] = total["sent_usec"] / n
        # Every cmdstat summed: counts what scripts run with redis.call twice.
        out["all_usec_per_op"] = total["server_usec"] / n
        # Of the sent commands' time, what the commands run inside scripts took; the rest
        # of a script's time is Lua and the script call itself.
        out["in_script_us_per_op"] = (total["server_usec"] - total["sent_usec"]) / n
        out["server_cpu_us_per_op"] = total["server_cpu_s"] * 1e6 / n
    return out


async def sample_connections(admin: Admin, delay: float) -> int:
    await asyncio.sleep(delay)
    return len(await admin.connections())


# -- W0 floor ------------------------------------------------------------------------


async def w0_floor(url: str, admin: Admin, params: Result) -> Result:
    """Raw client, two EVALSHA of ``return 1`` per cycle: the cost floor of a lock cycle."""
    client = redis.asyncio.Redis.from_url(url)
    try:
        sha = await client.script_load("return 1")
        for _ in range(50):  # warm-up
            await client.evalsha(sha, 1, "floor")
        return await _cycles(admin, params, _floor_cycle(client, sha))
    finally:
        await client.aclose()


def _floor_cycle(client: redis.asyncio.Redis, sha: str) -> Any:
    async def cycle() -> None:
        await client.evalsha(sha, 1, "floor")
        await client.evalsha(sha, 1, "floor")

    return cycle


async def _cycles(admin: Admin, params: Result, cycle: Any) -> Result:
    max_cycles = int(params["cycles"])
    latencies: list[float] = []
    conns = asyncio.ensure_future(sample_connections(admin, min(0.2, params["seconds"] / 2)))
    start = await Window.take(admin)
    deadline = start.wall + float(params["seconds"])
    now = start.wall
    while len(latencies) < max_cycles and now < deadline:
        t0 = time.monotonic()
        await cycle()
        now = time.monotonic()
        latencies.append(now - t0)
    end = await Window.take(admin)
    total = start.until(end)
    n = len(latencies)
    return {
        "cycles": n,
        "cycles_per_s": n / sum(latencies) if latencies else 0.0,
        **metrics.latency_summary(latencies, "cycle"),
        **total,
        **per(total, n),
        "connections": await conns,
    }


# -- W1 uncontended --------------------------------------------------------------------


async def w1_uncontended(adapter: LockAdapter, admin: Admin, params: Result) -> Result:
    for _ in range(50):  # warm-up: connections, script loading
        await adapter.release(await adapter.acquire("w1", ACQUIRE_TIMEOUT))

    async def cycle() -> None:
        await adapter.release(await adapter.acquire("w1", ACQUIRE_TIMEOUT))

    return await _cycles(admin, params, cycle)


# -- C1 server time per uncontended cycle ----------------------------------------------


async def c1_server_time(adapter: LockAdapter, admin: Admin, params: Result) -> Result:
    """W1's loop, shorter: what one acquire+release cycle costs the server.

    ``sent_us_per_op`` (INFO commandstats ``usec`` of the commands the library sent, so a
    script counts with everything it runs) is the headline; ``server_cpu_us_per_op`` adds
    the server's socket I/O and event loop (INFO cpu).
    """
    for _ in range(50):  # warm-up: connections, script loading
        await adapter.release(await adapter.acquire("c1", ACQUIRE_TIMEOUT))

    async def cycle() -> None:
        await adapter.release(await adapter.acquire("c1", ACQUIRE_TIMEOUT))

    return await _cycles(admin, params, cycle)


# -- C3 memory left per used name -------------------------------------------------------

#: C3's lock names: ``c3n:<n>`` (used once each) and ``c3r:<n>`` (used ``reuses`` times
#: each); no other key contains these (the warm-up name is ``c3warm``). Each tag holds a
#: letter that is not a hex digit: a library's key may end a random hex id with ":"
#: (aiolock's release tombstones ``<prefix>:{<name>}:rel:<id>:<n>``), and "c3:" matched
#: the warm-up name's tombstone whenever the id ended in "c3" (one run in 256).
C3_TAG = "c3n:"
C3_REUSED_TAG = "c3r:"


def key_shape(key: str, tag: str = C3_TAG) -> str:
    """*key* with the lock name (``<tag><n>``) replaced by ``<name>``, ids by ``<id>``."""
    head, _, rest = key.partition(tag)
    digits = len(rest) - len(rest.lstrip("0123456789"))
    return f"{head}<name>" + re.sub(r"[0-9a-f]{16,}(:\d+)?", "<id>", rest[digits:])


async def memory_left(admin: Admin, tag: str, used: int) -> Result:
    """What Redis holds for the names ``<tag><n>``: keys, bytes, TTLs, per used name."""
    left = await admin.keys_matching(f"*{tag}*")
    total_bytes = sum(k.bytes for k in left)
    expiring = [k.pttl_ms for k in left if k.pttl_ms >= 0]
    persistent = sum(1 for k in left if k.pttl_ms == -1)
    shapes: dict[str, dict[str, Any]] = {}
    for k in left:
        shape = shapes.setdefault(
            key_shape(k.key, tag), {"type": k.kind, "keys": 0, "bytes": 0, "max_ttl_s": None}
        )
        shape["keys"] += 1
        shape["bytes"] += k.bytes
        if k.pttl_ms == -1:
            shape["max_ttl_s"] = "never"
        elif shape["max_ttl_s"] != "never":
            shape["max_ttl_s"] = max(float(shape["max_ttl_s"] or 0.0), k.pttl_ms / 1000)
    return {
        "keys_left": len(left),
        "keys_per_name": len(left) / used if used else None,
        "bytes_left": total_bytes,
        "bytes_left_per_name": total_bytes / used if used else None,
        "persistent_keys": persistent,
        # None when nothing is left; "never" when some key has no expiry.
        "max_ttl_s": "never" if persistent else (max(expiring) / 1000 if expiring else None),
        "min_ttl_s": min(expiring) / 1000 if expiring else None,
        "key_shapes": shapes,
        "gone_within_60s": persistent == 0 and all(t <= 60_000 for t in expiring),
    }


async def c3_memory_left(adapter: LockAdapter, admin: Admin, params: Result) -> Result:
    """Acquire and release N distinct names once each; then measure what Redis keeps.

    Keys left = every key containing a used name (``SCAN MATCH *c3n:*``), whatever the
    library's prefix; their ``MEMORY USAGE`` (``SAMPLES 0``, exact) summed over N, and
    their ``PTTL``: a key without expiry stays until deleted. The same for a few names
    used ``reuses`` times each (``reused_*`` fields): state that grows with use shows there.
    """
    n = int(params["names"])
    n_reused = int(params.get("reused_names", 0))
    reuses = int(params.get("reuses", 1))
    deadline = time.monotonic() + float(params["seconds"])
    await adapter.release(await adapter.acquire("c3warm", ACQUIRE_TIMEOUT))  # scripts
    for tag in (C3_TAG, C3_REUSED_TAG):
        before = await admin.keys_matching(f"*{tag}*")
        if before:
            raise RuntimeError(f"{len(before)} keys named like C3's locks exist before the run")
    used = 0
    t0 = time.monotonic()
    while used < n and time.monotonic() < deadline:
        await adapter.release(await adapter.acquire(f"{C3_TAG}{used}", ACQUIRE_TIMEOUT))
        used += 1
    cycle_s = time.monotonic() - t0
    reused = 0
    while reused < n_reused and time.monotonic() < deadline:
        for _ in range(reuses):
            await adapter.release(
                await adapter.acquire(f"{C3_REUSED_TAG}{reused}", ACQUIRE_TIMEOUT)
            )
        reused += 1
    # Let anything a release leaves to the background (a publish, a deferred delete) land.
    await asyncio.sleep(float(params["settle"]))
    once = await memory_left(admin, C3_TAG, used)
    again = await memory_left(admin, C3_REUSED_TAG, reused) if n_reused else {}
    return {
        "names": used,
        "cycle_s": cycle_s,
        "settle_s": float(params["settle"]),
        **once,
        "reused_names": reused,
        "reuses": reuses,
        **{f"reused_{k}": v for k, v in again.items()},
    }


# -- W2 concurrency --------------------------------------------------------------------


async def warm_names(adapter: LockAdapter, names: Sequence[str]) -> None:
    """One cycle on each name, all at once: connections and scripts exist afterwards."""

    async def warm(name: str) -> None:
        await adapter.release(await adapter.acquire(name, ACQUIRE_TIMEOUT))

    await asyncio.gather(*(warm(name) for name in names))


async def cycle_names(adapter: LockAdapter, names: Sequence[str], deadline: float) -> list[int]:
    """One task per name, acquire+release loops until *deadline*; cycles of each task."""
    counts = [0] * len(names)

    async def worker(i: int) -> None:
        name = names[i]
        while time.monotonic() < deadline:
            await adapter.release(await adapter.acquire(name, ACQUIRE_TIMEOUT))
            counts[i] += 1

    await asyncio.gather(*(worker(i) for i in range(len(names))))
    return counts


async def w2_concurrency(adapter: LockAdapter, admin: Admin, params: Result) -> Result:
    tasks = int(params["tasks"])
    seconds = float(params["seconds"])
    names = [f"w2:{i}" for i in range(tasks)]
    await warm_names(adapter, names)
    conns = asyncio.ensure_future(sample_connections(admin, seconds / 2))
    start = await Window.take(admin)
    counts = await cycle_names(adapter, names, start.wall + seconds)
    end = await Window.take(admin)
    total = start.until(end)
    n = sum(counts)
    return {
        "tasks": tasks,
        "cycles": n,
        "cycles_per_s": n / total["wall_s"],
        "min_task_cycles": min(counts),
        **total,
        **per(total, n),
        "connections": await conns,
    }


# -- W3 contention ---------------------------------------------------------------------


async def contend(
    adapter: LockAdapter,
    tasks: int,
    deadline: float,
    worker_prefix: str,
    grace: float = 0.25,
    name: str = "w3",
) -> tuple[list[Record], int, int]:
    """*tasks* tasks loop acquire/release on lock *name* until *deadline*.

    A task still waiting in ``acquire`` *grace* seconds after the deadline is cancelled
    (polling libraries would otherwise need seconds to let every waiter through once).
    Returns the records, the number of mutual-exclusion violations seen in this process
    (two tasks between acquire-return and release at once) and the number of waits
    cancelled at the end.
    """
    records: list[Record] = []
    inside = 0
    violations = 0
    waiting = [False] * tasks

    async def worker(i: int) -> None:
        nonlocal inside, violations
        wid = f"{worker_prefix}{i}"
        while time.monotonic() < deadline:
            waiting[i] = True
            try:
                handle = await adapter.acquire(name, ACQUIRE_TIMEOUT)
            except asyncio.CancelledError:
                return
            waiting[i] = False
            t_acq = time.monotonic()
            inside += 1
            if inside > 1:
                violations += 1
            inside -= 1
            await adapter.release(handle)
            records.append((wid, t_acq, time.monotonic()))

    running = [asyncio.ensure_future(worker(i)) for i in range(tasks)]
    _, pending = await asyncio.wait(running, timeout=max(0.0, deadline + grace - time.monotonic()))
    cancelled = 0
    for i, task in enumerate(running):
        if task in pending and waiting[i]:
            task.cancel()
            cancelled += 1
    if pending:
        await asyncio.wait(pending, timeout=ACQUIRE_TIMEOUT)
    for task in running:
        error = task.exception() if task.done() and not task.cancelled() else None
        if error is not None:
            raise error
    return records, violations, cancelled


def contention_metrics(records: Sequence[Record], start: float, end: float) -> Result:
    """Throughput, handoff latency, owner changes and fairness from merged records."""
    ordered = sorted(records, key=lambda r: r[1])
    in_window = [r for r in ordered if start <= r[1] <= end]
    per_worker = Counter(r[0] for r in ordered)
    handoffs: list[float] = []
    change_handoffs: list[float] = []
    changes = 0
    negative = 0
    for prev, cur in itertools.pairwise(ordered):
        gap = cur[1] - prev[2]
        if gap < 0:
            negative += 1
        handoffs.append(gap)
        if cur[0] != prev[0]:
            changes += 1
            change_handoffs.append(gap)
    n = len(ordered)
    return {
        "acquisitions": n,
        "acquisitions_per_s": len(in_window) / (end - start) if end > start else 0.0,
        "owner_change_share": changes / (n - 1) if n > 1 else 0.0,
        "workers": len(per_worker),
        "min_worker_acquisitions": min(per_worker.values()) if per_worker else 0,
        "max_worker_share": max(per_worker.values()) / n if n else 0.0,
        "negative_handoffs": negative,
        **metrics.latency_summary(handoffs, "handoff"),
        **metrics.latency_summary(change_handoffs, "change_handoff"),
        "handoff_samples_us": metrics.quantile_sample(change_handoffs or handoffs),
    }


async def w3_contention(adapter: LockAdapter, admin: Admin, params: Result) -> Result:
    tasks = int(params["tasks"])
    seconds = float(params["seconds"])
    # Warm-up: every task contends briefly, so connections and scripts exist already.
    # (Another name: a wait cancelled at its end could leave that lock held.)
    warm_end = time.monotonic() + min(0.2, seconds / 4)
    await contend(adapter, tasks, warm_end, "warm", grace=1.0, name="w3:warm")
    conns = asyncio.ensure_future(sample_connections(admin, seconds / 2))
    start = await Window.take(admin)
    deadline = start.wall + seconds
    records, violations, cancelled = await contend(adapter, tasks, deadline, "t")
    end = await Window.take(admin)
    total = start.until(end)
    out = contention_metrics(records, start.wall, deadline)
    return {
        "tasks": tasks,
        **out,
        "mutex_violations": violations,
        "cancelled_waits": cancelled,
        **total,
        **per(total, out["acquisitions"]),
        "connections": await conns,
    }


# -- W4 many waiters -------------------------------------------------------------------


async def _settle(since: float, least: float, most: float) -> float:
    """Wait until the waiters' start-up traffic is over: at least *least* seconds, then
    until no round trip was made for 0.1 s, at most *most* seconds. A library that polls
    never goes quiet and gets *most*. Returns the seconds waited since *since*."""
    await asyncio.sleep(max(0.0, since + least - time.monotonic()))
    last = COUNTS.round_trips
    while time.monotonic() - since < most:
        await asyncio.sleep(0.1)
        if COUNTS.round_trips == last:
            break
        last = COUNTS.round_trips
    return time.monotonic() - since


async def w4_waiters(adapter: LockAdapter, admin: Admin, params: Result) -> Result:
    waiters = int(params["waiters"])
    hold = float(params["hold"])
    settle = float(params["settle"])
    serve_timeout = float(params["serve_timeout"])
    await adapter.release(await adapter.acquire("w4", ACQUIRE_TIMEOUT))  # warm-up
    holder = await adapter.acquire("w4", ACQUIRE_TIMEOUT)
    t_held = time.monotonic()
    tracemalloc.start()
    mem0, rss0 = tracemalloc.get_traced_memory()[0], metrics.rss_bytes()
    served: list[float] = []
    errors: Counter[str] = Counter()
    timeout = hold + serve_timeout

    async def waiter() -> None:
        try:
            handle = await adapter.acquire("w4", timeout)
        except AcquireTimeout:
            errors["timeout"] += 1
            return
        served.append(time.monotonic())
        await adapter.release(handle)

    begin = await Window.take(admin)
    tasks = [asyncio.ensure_future(waiter()) for _ in range(waiters)]
    settle_s = await _settle(begin.wall, settle, max(settle, hold * 0.5))
    wait_start = await Window.take(admin)
    samples: list[list[dict[str, Any]]] = []
    wait_end_at = t_held + hold
    for i in range(3):  # three CLIENT LIST samples spread over the wait
        target = wait_start.wall + (wait_end_at - wait_start.wall) * (i + 1) / 4
        await asyncio.sleep(max(0.0, target - time.monotonic()))
        samples.append(await admin.connections())
    await asyncio.sleep(max(0.0, wait_end_at - time.monotonic()))
    wait_end = await Window.take(admin)
    mem1, rss1 = tracemalloc.get_traced_memory()[0], metrics.rss_bytes()
    tracemalloc.stop()
    early = len(served)
    await adapter.release(holder)
    t_rel = time.monotonic()
    _, pending = await asyncio.wait(tasks, timeout=serve_timeout)
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.wait(pending, timeout=5)
    end = await Window.take(admin)
    startup = begin.until(wait_start)
    wait = wait_start.until(wait_end)
    serve = wait_end.until(end)
    wait_by_name: dict[str, int] = wait.get("all_by_name", {})
    after = sorted(t - t_rel for t in served)
    return {
        "waiters": waiters,
        "served": len(served),
        "served_before_release": early,
        "errors": dict(errors),
        "cancelled": len(pending),
        "all_served_s": after[-1] if len(served) == waiters else None,
        "served_p50_s": metrics.percentile(after, 50),
        "settle_s": settle_s,
        "wait_seconds": wait["wall_s"],
        "wait_commands": wait.get("all_commands"),
        "wait_commands_per_s": (wait.get("all_commands") or 0) / wait["wall_s"],
        "wait_non_subscribe_commands": sum(
            n for name, n in wait_by_name.items() if name not in SUBSCRIBE_COMMANDS
        ),
        "wait_round_trips": wait["round_trips"],
        "wait_by_name": wait_by_name,
        "startup_commands": startup.get("all_commands"),
        "startup_round_trips": startup["round_trips"],
        "startup_by_name": startup.get("all_by_name", {}),
        "serve_commands": serve.get("all_commands"),
        "serve_round_trips": serve["round_trips"],
        "connections": max(len(s) for s in samples),
        "subscribed_connections": max(metrics.sub_count(s) for s in samples),
        "tracemalloc_growth_bytes": mem1 - mem0,
        "rss_growth_bytes": rss1 - rss0,
        "memory_per_waiter_bytes": (mem1 - mem0) / waiters,
        "wait_cpu_s": wait["cpu_s"],
    }


# -- W5 many holds ---------------------------------------------------------------------


async def w5_holds(adapter: LockAdapter, admin: Admin, params: Result) -> Result:
    n = int(params["locks"])
    lease = float(params["lease"])
    periods = float(params["periods"])
    acquire_deadline = time.monotonic() + float(params["acquire_seconds"])
    warm = await adapter.acquire("w5:warm", ACQUIRE_TIMEOUT)
    if not adapter.auto_renews:
        await adapter.renew([warm])  # loads the renewal script outside the window
    await adapter.release(warm)
    base_keys = await admin.dbsize()
    tracemalloc.start()
    mem0, rss0 = tracemalloc.get_traced_memory()[0], metrics.rss_bytes()
    handles: list[object] = []
    t0 = time.monotonic()
    while len(handles) < n and time.monotonic() < acquire_deadline:
        handles.append(await adapter.acquire(f"w5:{len(handles)}", ACQUIRE_TIMEOUT))
    acquire_s = time.monotonic() - t0
    mem1, rss1 = tracemalloc.get_traced_memory()[0], metrics.rss_bytes()
    tracemalloc.stop()
    held = len(handles)
    out: Result = {
        "locks": held,
        "lease_s": lease,
        "acquire_all_s": acquire_s,
        "memory_per_lock_bytes": (mem1 - mem0) / held if held else None,
        "rss_per_lock_bytes": (rss1 - rss0) / held if held else None,
        "renewal": "auto" if adapter.auto_renews else "manual pass",
    }
    try:
        if held < n:
            raise RuntimeError(f"only {held} of {n} locks acquired in {acquire_s:.1f} s")
        if acquire_s > 0.9 * lease:
            raise RuntimeError(
                f"acquiring {n} locks took {acquire_s:.1f} s, too close to the {lease:.0f} s "
                "lease: the first locks would expire before renewal; use a longer lease"
            )
        start = await Window.take(admin)
        if adapter.auto_renews:
            await asyncio.sleep(lease * periods)
            per_period = periods
        else:
            await adapter.renew(handles)
            per_period = 1.0
        end = await Window.take(admin)
        total = start.until(end)
        out.update(
            {
                "observed_s": total["wall_s"],
                "periods": per_period,
                "renew_round_trips_per_period": total["round_trips"] / per_period,
                "renew_commands_per_period": total.get("all_commands", 0) / per_period,
                "renew_top_level_per_period": total["top_level_commands"] / per_period,
                "renew_cpu_s_per_period": total["cpu_s"] / per_period,
                "renew_by_name": total.get("all_by_name", {}),
                "keys_after": await admin.dbsize() - base_keys,
                "connections": len(await admin.connections()),
            }
        )
        return out
    finally:
        await _release_all(adapter, handles, time.monotonic() + float(params["acquire_seconds"]))


async def _release_all(adapter: LockAdapter, handles: Sequence[object], deadline: float) -> None:
    """Release *handles* until *deadline*; the first failure is raised after the loop."""
    first: Exception | None = None
    for h in handles:
        if time.monotonic() > deadline:
            break
        try:
            await adapter.release(h)
        except Exception as exc:
            first = first or exc
    if first is not None:
        raise first


LOCK_WORKLOADS = {
    "w1": w1_uncontended,
    "w2": w2_concurrency,
    "w3": w3_contention,
    "w4": w4_waiters,
    "w5": w5_holds,
    "c1": c1_server_time,
    "c3": c3_memory_left,
}
#: Most tasks using one adapter (``c2`` runs ``w3mp``'s parts, 4 tasks each).
CONCURRENCY = {
    "w1": 1,
    "w2": 64,
    "w2mp": 64,
    "w3": 16,
    "w3mp": 4,
    "w4": 501,
    "w5": 1,
    "c1": 1,
    "c2": 4,
    "c3": 1,
}
DEFAULT_LEASE = LEASE
