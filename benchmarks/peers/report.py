"""RESULTS.md (tables, ratios, targets), results.json and PNG plots."""

from __future__ import annotations

import importlib
import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common.paired import per_round
from benchmarks.common.sections import kept_sections
from benchmarks.peers.adapters import ADAPTERS, BASELINE, PEERS
from benchmarks.peers.config import FLOOR, WORKLOADS

Summary = dict[str, dict[str, Any]]
AIOLOCK = "aiolock"


# -- formatting ------------------------------------------------------------------------


def num(value: Any, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        if digits == 0:
            return f"{value:,.0f}"
        return f"{value:,.{digits}f}"
    return str(value)


def ratio(a: Any, b: Any) -> str:
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or not b:
        return "n/a"
    return f"{a / b:.2f}x"


def kib(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "n/a"
    return f"{value / 1024:,.1f} KiB"


def short(error: Any, limit: int = 300) -> str:
    """An error message cut to *limit* characters (some libraries repr whole clients)."""
    text = str(error or "")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def progress_line(record: dict[str, Any]) -> str:
    head = f"[{record['workload']}] {record['lib']:<18} {record['seconds']:5.1f} s  "
    if not record.get("ok"):
        return head + f"FAILED: {short(record.get('error'))}"
    m = record["metrics"]
    cost = [
        f"{num(m[key], 1)} {label}"
        for key, label in COST_PROGRESS.get(record["workload"], ())
        if key in m
    ]
    if cost:
        return head + ", ".join(cost)
    for key, label in (
        ("cycles_per_s", "cycles/s"),
        ("acquisitions_per_s", "acq/s"),
        ("all_served_s", "s to serve all"),
        ("renew_round_trips_per_period", "renewal round trips/period"),
    ):
        if key in m:
            return head + f"{num(m[key], 3 if key == 'all_served_s' else 0)} {label}"
    return head + "ok"


COST_PROGRESS: dict[str, tuple[tuple[str, str], ...]] = {
    "c1": (("sent_us_per_op", "server us/cycle"), ("server_cpu_us_per_op", "server CPU us/cycle")),
    "c2": (("server_cpu_us_per_op", "server CPU us/acq"), ("acquisitions_per_s", "acq/s")),
    "c3": (("bytes_left_per_name", "B left/name"), ("keys_per_name", "keys/name")),
}


def metric(summary: Summary, workload: str, lib: str, key: str) -> Any:
    entry = summary.get(workload, {}).get(lib)
    if not entry or not entry.get("ok"):
        return None
    return entry["metrics"].get(key)


def ok_libs(summary: Summary, workload: str) -> list[str]:
    return [lib for lib, e in summary.get(workload, {}).items() if e.get("ok")]


# -- tables ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    title: str
    cell: Callable[[str, dict[str, Any]], str]


def table(summary: Summary, workload: str, columns: Sequence[Column]) -> list[str]:
    entries = summary.get(workload, {})
    if not entries:
        return []
    lines = [
        "| library | " + " | ".join(c.title for c in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for lib, entry in entries.items():
        if not entry.get("ok"):
            lines.append(f"| {lib} | " + " | ".join("-" for _ in columns) + " |")
            continue
        m = entry["metrics"]
        lines.append(f"| {lib} | " + " | ".join(c.cell(lib, m) for c in columns) + " |")
    return lines


def col(title: str, key: str, digits: int = 0) -> Column:
    return Column(title, lambda _lib, m: num(m.get(key), digits))


def vs_aiolock(summary: Summary, workload: str, key: str) -> Column:
    """aiolock's value divided by this row's (how many times better aiolock is)."""
    base = metric(summary, workload, AIOLOCK, key)
    return Column(
        "aiolock / this", lambda lib, m: "-" if lib == AIOLOCK else ratio(base, m.get(key))
    )


def spread(summary: Summary, workload: str, digits: int = 0) -> Column:
    def cell(lib: str, _m: dict[str, Any]) -> str:
        values = summary[workload][lib].get("key_values") or []
        if len(values) < 2:
            return "-"
        return f"{min(values):,.{digits}f}-{max(values):,.{digits}f}"

    return Column("range over repeats", cell)


def sections(summary: Summary) -> list[str]:
    floor = metric(summary, "w0", FLOOR, "cycles_per_s")
    out: list[str] = []
    cycle_cols = [
        Column("x floor", lambda _l, m: ratio(m.get("cycles_per_s"), floor)),
        col("p50 us", "cycle_p50_us"),
        col("p99 us", "cycle_p99_us"),
        col("round trips/cycle", "round_trips_per_op", 2),
        col("client cmds/cycle", "top_level_commands_per_op", 2),
        col("all cmds/cycle", "all_commands_per_op", 2),
        col("conns", "connections"),
    ]
    contention_cols = [
        col("owner changes", "owner_change_share", 3),
        col("handoff p50 us (owner change)", "change_handoff_p50_us"),
        col("handoff p99 us (owner change)", "change_handoff_p99_us"),
        col("handoff p50 us (all)", "handoff_p50_us"),
        col("handoff p99 us (all)", "handoff_p99_us"),
        col("min acq/worker", "min_worker_acquisitions"),
        col("max share", "max_worker_share", 3),
        col("client cmds/acq", "top_level_commands_per_op", 2),
        col("all cmds/acq", "all_commands_per_op", 2),
        col("round trips/acq", "round_trips_per_op", 2),
        col("conns", "connections"),
    ]
    specs: dict[str, list[Column]] = {
        "w0": [col("cycles/s", "cycles_per_s"), spread(summary, "w0"), *cycle_cols],
        "w1": [
            col("cycles/s", "cycles_per_s"),
            vs_aiolock(summary, "w1", "cycles_per_s"),
            spread(summary, "w1"),
            *cycle_cols,
        ],
        "w2": [
            col("cycles/s", "cycles_per_s"),
            vs_aiolock(summary, "w2", "cycles_per_s"),
            spread(summary, "w2"),
            col("min cycles/task", "min_task_cycles"),
            col("round trips/cycle", "round_trips_per_op", 2),
            col("all cmds/cycle", "all_commands_per_op", 2),
            col("conns", "connections"),
            col("client CPU s", "cpu_s", 2),
        ],
        "w2mp": [
            col("cycles/s", "cycles_per_s"),
            vs_aiolock(summary, "w2mp", "cycles_per_s"),
            spread(summary, "w2mp"),
            col("tasks", "tasks"),
            col("min cycles/task", "min_task_cycles"),
            col("min cycles/process", "min_process_cycles"),
            col("round trips/cycle", "round_trips_per_op", 2),
            col("all cmds/cycle", "all_commands_per_op", 2),
            col("server CPU us/cycle", "server_cpu_us_per_op", 1),
            col("conns", "connections"),
            col("client CPU s (all processes)", "cpu_s", 2),
        ],
        "w3": [
            col("acq/s", "acquisitions_per_s"),
            vs_aiolock(summary, "w3", "acquisitions_per_s"),
            spread(summary, "w3"),
            *contention_cols,
            col("mutex violations", "mutex_violations"),
        ],
        "w3mp": [
            col("acq/s", "acquisitions_per_s"),
            vs_aiolock(summary, "w3mp", "acquisitions_per_s"),
            spread(summary, "w3mp"),
            *contention_cols,
        ],
        "w4": [
            Column("served", lambda _l, m: f"{m.get('served')}/{m.get('waiters')}"),
            col("all served after release, s", "all_served_s", 3),
            col("median served after release, s", "served_p50_s", 3),
            col("settle s", "settle_s", 2),
            col("start-up cmds", "startup_commands"),
            col("cmds/s during wait", "wait_commands_per_s"),
            col("non-subscribe cmds during wait", "wait_non_subscribe_commands"),
            col("round trips during wait", "wait_round_trips"),
            col("conns", "connections"),
            col("subscribed conns", "subscribed_connections"),
            Column("tracemalloc growth", lambda _l, m: kib(m.get("tracemalloc_growth_bytes"))),
            Column("RSS growth", lambda _l, m: kib(m.get("rss_growth_bytes"))),
            col("bytes/waiter", "memory_per_waiter_bytes"),
        ],
        "w5": [
            col("locks", "locks"),
            col("renewal", "renewal"),
            col("round trips/lease period", "renew_round_trips_per_period"),
            col("all cmds/lease period", "renew_commands_per_period"),
            Column(
                "CPU ms/lease period",
                lambda _l, m: num(_scaled(m.get("renew_cpu_s_per_period"), 1e3), 1),
            ),
            col("bytes/lock (tracemalloc)", "memory_per_lock_bytes"),
            col("bytes/lock (RSS)", "rss_per_lock_bytes"),
            col("keys in Redis after", "keys_after"),
            col("acquire all, s", "acquire_all_s", 2),
        ],
    }
    specs.update(cost_specs(summary))
    for workload, columns in specs.items():
        lines = table(summary, workload, columns)
        if lines:
            out += [f"### {WORKLOADS[workload]}", "", *lines, ""]
            out += COST_NOTES.get(workload, [])
            if workload == "w1":
                out += floor_note(summary)
    return out


# -- Redis-side cost (C1-C3) -----------------------------------------------------------

#: The peer the Redis-side cost targets compare with: redis-py's own ``Lock``.
COST_BASE = "redis-py"


def ttl_text(value: Any) -> str:
    if value is None:
        return "nothing left"
    if value == "never":
        return "never (no TTL)"
    return f"{num(value, 1)} s"


def sent_by_name(m: dict[str, Any], per_key: str) -> str:
    """Server time per operation of each command name the client sent."""
    n = m.get(per_key) or 0
    usec: dict[str, int] = m.get("server_usec_by_name") or {}
    calls: dict[str, int] = m.get("all_by_name") or {}
    sent: dict[str, int] = m.get("top_level_by_name") or {}
    if not n:
        return "n/a"
    parts = []
    for name, k in sorted(sent.items(), key=lambda kv: -usec.get(kv[0], 0)):
        total = calls.get(name, 0)
        if total > 0:
            share = min(1.0, k / total)
            parts.append(f"{name} {usec.get(name, 0) * share / n:.1f}")
    return ", ".join(parts) or "n/a"


def shapes_text(m: dict[str, Any], key: str = "key_shapes") -> str:
    """What is left per name: key shape, type, bytes per key, longest TTL."""
    shapes: dict[str, dict[str, Any]] = m.get(key) or {}
    if not shapes:
        return "nothing"
    parts = []
    for shape, info in shapes.items():
        keys = int(info.get("keys") or 0)
        each = info.get("bytes", 0) / keys if keys else 0
        parts.append(
            f"`{shape}` {info.get('type')} x{keys:,}, {each:,.0f} B each, "
            f"TTL {ttl_text(info.get('max_ttl_s'))}"
        )
    return "; ".join(parts)


def idle_corrected(m: dict[str, Any]) -> Any:
    """Server CPU per acquisition minus the idle server's background over the window."""
    values = [m.get(k) for k in ("server_cpu_s", "server_idle_cpu_per_s", "wall_s")]
    n = m.get("acquisitions")
    if not n or not all(isinstance(v, (int, float)) for v in values):
        return None
    cpu, idle, wall = (float(v or 0) for v in values)
    return (cpu - idle * wall) * 1e6 / n


def per_owner_change(m: dict[str, Any]) -> Any:
    """Server CPU per acquisition that went to another task than the previous one."""
    cpu, share = m.get("server_cpu_us_per_op"), m.get("owner_change_share")
    if not isinstance(cpu, (int, float)) or not isinstance(share, (int, float)) or not share:
        return None
    return cpu / share


def cost_specs(summary: Summary) -> dict[str, list[Column]]:
    return {
        "c1": [
            col("server us/cycle (sent cmds)", "sent_us_per_op", 1),
            vs_aiolock(summary, "c1", "sent_us_per_op"),
            spread(summary, "c1", 1),
            Column("us/cycle by sent command", lambda _l, m: sent_by_name(m, "cycles")),
            col("of which redis.call in scripts, us/cycle", "in_script_us_per_op", 1),
            col("every cmdstat summed, us/cycle", "all_usec_per_op", 1),
            col("server CPU us/cycle", "server_cpu_us_per_op", 1),
            col("client cmds/cycle", "top_level_commands_per_op", 2),
            col("all cmds/cycle", "all_commands_per_op", 2),
            col("cycles", "cycles"),
        ],
        "c2": [
            col("server CPU us/acq", "server_cpu_us_per_op", 1),
            vs_aiolock(summary, "c2", "server_cpu_us_per_op"),
            spread(summary, "c2", 1),
            Column("minus idle, us/acq", lambda _l, m: num(idle_corrected(m), 1)),
            Column(
                "idle server CPU ms/s",
                lambda _l, m: num(_scaled(m.get("server_idle_cpu_per_s"), 1e3), 2),
            ),
            col("server us/acq (sent cmds)", "sent_us_per_op", 1),
            # A lock that lets the releasing task take it straight back changes owner
            # rarely and wakes nobody; the cost of a fair hand-over shows per owner change.
            col("owner changes/acq", "owner_change_share", 3),
            Column("server CPU us/owner change", lambda _l, m: num(per_owner_change(m), 1)),
            col("acquisitions", "acquisitions"),
            col("acq/s", "acquisitions_per_s"),
            col("client cmds/acq", "top_level_commands_per_op", 2),
            col("all cmds/acq", "all_commands_per_op", 2),
            col("round trips/acq", "round_trips_per_op", 2),
        ],
        "c3": [
            col("names used", "names"),
            col("bytes left/name", "bytes_left_per_name", 1),
            col("keys left/name", "keys_per_name", 2),
            col("keys without TTL", "persistent_keys"),
            Column("longest TTL", lambda _l, m: ttl_text(m.get("max_ttl_s"))),
            Column("what is left", lambda _l, m: shapes_text(m)),
            Column(
                "names used N times",
                lambda _l, m: f"{num(m.get('reused_names'))} x {num(m.get('reuses'))}",
            ),
            col("bytes left/name (used N times)", "reused_bytes_left_per_name", 1),
            Column("longest TTL (used N times)", lambda _l, m: ttl_text(m.get("reused_max_ttl_s"))),
            Column(
                "what is left (used N times)", lambda _l, m: shapes_text(m, "reused_key_shapes")
            ),
        ],
    }


COST_NOTES: dict[str, list[str]] = {
    "c1": [
        "Server time = INFO commandstats `usec` of the commands the library sent (a "
        "script's EVALSHA time includes what it runs with `redis.call`; those inner "
        'commands are not added again; "every cmdstat summed" adds them a second time, '
        'and "of which redis.call" is their share, the rest being Lua and the script '
        "call itself). Server CPU = INFO cpu (`used_cpu_user + "
        'used_cpu_sys`), which adds socket I/O and the event loop. "aiolock / this" '
        "here: higher means aiolock costs the server more.",
        "",
    ],
    "c2": [
        "Server CPU = INFO cpu delta over the window plus the drain after it, divided by "
        "the acquisitions in it (whole server: command execution, socket I/O, pub/sub "
        'delivery, cron). "minus idle" subtracts the background measured while all '
        "4 processes were connected and idle just before the window.",
        "",
    ],
    "c3": [
        "Keys left = every key whose name contains a used lock name (`SCAN MATCH *c3n:*`), "
        "after every name was acquired and released once, one at a time (and, in the "
        '"used N times" columns, other names acquired and released N times in a row); '
        "bytes = "
        "`MEMORY USAGE key SAMPLES 0`; TTL = `PTTL` right after the run.",
        "",
    ],
}


def cost_rows(summary: Summary) -> list[str]:
    """One row per Redis-side cost measure, every library side by side."""
    measures = [
        ("c1", "sent_us_per_op", "Redis script execution per uncontended cycle, us", 1, "<= 2x"),
        (
            "c2",
            "server_cpu_us_per_op",
            "Redis CPU per contended acquisition across 4 processes, us",
            1,
            "<= 1.2x",
        ),
        ("c3", "bytes_left_per_name", "Redis memory left per used name after release, B", 0,
         "<= 100 B, or gone within 60 s"),
        ("c3", "reused_bytes_left_per_name",
         "Redis memory left per name used 10 times, B", 0, "(same)"),
    ]  # fmt: skip
    present = [m for m in measures if summary.get(m[0])]
    if not present:
        return []
    libs = [lib for lib in ADAPTERS if any(lib in summary[m[0]] for m in present)]
    lines = [
        "### Redis-side cost per operation (C1-C3), side by side",
        "",
        "| measure | " + " | ".join(libs) + f" | aiolock / {COST_BASE} | target |",
        "|---|" + "---|" * (len(libs) + 2),
    ]
    reuses = next(
        (m["metrics"].get("reuses") for m in summary.get("c3", {}).values() if m.get("ok")), None
    )
    for workload, key, label, digits, goal in present:
        title = label.replace("10 times", f"{num(reuses)} times")
        cells = []
        for lib in libs:
            value = metric(summary, workload, lib, key)
            text = num(value, digits)
            if workload == "c3" and value is not None:
                ttl = metric(
                    summary, workload, lib, key.replace("bytes_left_per_name", "max_ttl_s")
                )
                text += " (nothing left)" if ttl is None else f" (TTL {ttl_text(ttl)})"
            cells.append(text)
        mine, base = (
            metric(summary, workload, AIOLOCK, key),
            metric(summary, workload, COST_BASE, key),
        )
        rel = ratio(mine, base)
        if workload == "c3" and base == 0:
            rel = f"n/a ({COST_BASE} leaves nothing)"
        lines.append(f"| {title} | " + " | ".join(cells) + f" | {rel} | {goal} |")
    return [*lines, ""]


def _scaled(value: Any, factor: float) -> Any:
    return value * factor if isinstance(value, (int, float)) else None


# -- targets ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    workload: str
    text: str
    measured: str
    status: str  # "met", "not met", "n/a"
    #: the ratio the status was judged on, where a row says which (the W1-vs-floor rows)
    figure: float | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "workload": self.workload,
            "target": self.text,
            "measured": self.measured,
            "status": self.status,
        }
        if self.figure is not None:
            out["figure"] = self.figure
        return out


def _status(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "not met")


def _best_peer(summary: Summary, workload: str, key: str, lower: bool = False) -> tuple[str, Any]:
    values = [(lib, metric(summary, workload, lib, key)) for lib in PEERS]
    values = [(lib, v) for lib, v in values if isinstance(v, (int, float))]
    if not values:
        return ("", None)
    return (min if lower else max)(values, key=lambda lv: lv[1])


def targets(summary: Summary) -> list[Target]:
    out: list[Target] = []

    def a(workload: str, key: str) -> Any:
        return metric(summary, workload, AIOLOCK, key)

    if "w1" in summary:
        out.append(vs_floor(summary, "W1", 0.9, ">= 0.9x W0 floor cycles/s"))
        # The lock at least as fast as the bare two-EVALSHA floor.
        out.append(vs_floor(summary, "W1 (issue 7)", 1.0, ">= 1.0x W0 floor cycles/s"))
        out += issue21_w1(summary)
    if "w2" in summary:
        w2 = a("w2", "cycles_per_s")
        peer, best = _best_peer(summary, "w2", "cycles_per_s")
        ok = None if w2 is None or best is None else w2 >= 3 * best
        out.append(
            Target(
                "W2",
                ">= 3x best Python peer cycles/s",
                f"{num(w2)} vs {peer or 'no peer'} {num(best)} = {ratio(w2, best)}",
                _status(ok),
            )
        )
        out.append(at_least(summary, "W2 (issue 21)", "w2", BASELINE, 1.25))
    if "w2mp" in summary:
        out.append(at_least(summary, "W2mp (issue 21)", "w2mp", COST_BASE, 3.2))
    for w, label in (("w3", "one process"), ("w3mp", "4 processes")):
        if w not in summary:
            continue
        workers = a(w, "workers")
        expected = metric(summary, w, AIOLOCK, "tasks")
        least, share = a(w, "min_worker_acquisitions"), a(w, "max_worker_share")
        ok = None
        if least is not None and share is not None:
            ok = workers == expected and least >= 1 and share <= 0.10
        out.append(
            Target(
                f"W3 ({label})",
                "no starvation: every worker acquires, none > 10% of acquisitions",
                f"{num(workers)}/{num(expected)} workers acquired, fewest "
                f"{num(least)}, max share {num(_scaled(share, 100), 1)}%",
                _status(ok),
            )
        )
        if w == "w3":
            changes = a(w, "owner_change_share")
            out.append(
                Target(
                    "W3 (one process)",
                    ">= 90% of acquisitions change owner",
                    f"{num(_scaled(changes, 100), 1)}%",
                    _status(None if changes is None else changes >= 0.9),
                )
            )
        top, every = a(w, "top_level_commands_per_op"), a(w, "all_commands_per_op")
        out.append(
            Target(
                f"W3 ({label})",
                "<= 4 Redis commands per acquisition (client-sent)",
                num(top, 2),
                _status(None if top is None else top <= 4),
            )
        )
        out.append(
            Target(
                f"W3 ({label})",
                "<= 4 Redis commands per acquisition (all, incl. inside scripts)",
                num(every, 2),
                _status(None if every is None else every <= 4),
            )
        )
        # The issue's definition (release-return -> next holder's acquire-return, whoever
        # the next holder is) decides; the owner-change-only figure is shown as well, but
        # for a polling library it only samples the rare polls that hit the free window.
        for key, what in (
            ("handoff_p50_us", "every handoff, as the issue defines it"),
            ("change_handoff_p50_us", "owner changes only; biased for polling peers"),
        ):
            mine = a(w, key)
            peer, best = _best_peer(summary, w, key, lower=True)
            ok = None if mine is None or best is None else mine < best
            out.append(
                Target(
                    f"W3 ({label})",
                    f"handoff p50 below every peer's ({what})",
                    f"{num(mine)} us vs best peer {peer or 'none'} {num(best)} us",
                    _status(ok),
                )
            )
    if "w4" in summary:
        extra, conns, served = (
            a("w4", "wait_non_subscribe_commands"),
            a("w4", "connections"),
            a("w4", "all_served_s"),
        )
        out.append(
            Target(
                "W4",
                "no Redis commands during the wait beyond subscribing",
                f"{num(extra)} other commands ({num(a('w4', 'wait_commands_per_s'), 1)}"
                " cmds/s in total)",
                _status(None if extra is None else extra == 0),
            )
        )
        out.append(
            Target(
                "W4", "<= 4 connections", num(conns), _status(None if conns is None else conns <= 4)
            )
        )
        waiters = a("w4", "waiters")
        out.append(
            Target(
                "W4",
                f"all {num(waiters)} served in < 0.15 s after release",
                f"{num(served, 3)} s"
                if served is not None
                else f"served {num(a('w4', 'served'))}/{num(waiters)}",
                _status(
                    None if a("w4", "served") is None else served is not None and served < 0.15
                ),
            )
        )
    out += cost_targets(summary)
    if "w5" in summary:
        rt, locks = a("w5", "renew_round_trips_per_period"), a("w5", "locks")
        out.append(
            Target(
                "W5",
                "renewal of 10,000 held locks in <= 100 round trips per lease period",
                f"{num(rt, 1)} round trips per period for {num(locks)} locks",
                _status(None if rt is None else rt <= 100),
            )
        )
    return out


#: How the issue 21 rows name the libraries they compare with.
BY_NAME = {COST_BASE: "redis-py's Lock", BASELINE: f"aiolock before issue 21 ({BASELINE})"}


def at_least(summary: Summary, label: str, workload: str, other: str, factor: float) -> Target:
    """aiolock's cycles/s >= *factor* x *other*'s, measured in the same run."""
    mine = metric(summary, workload, AIOLOCK, "cycles_per_s")
    theirs = metric(summary, workload, other, "cycles_per_s")
    times = f"{factor:.1f}x" if factor == int(factor) else f"{factor:g}x"  # 1.0x, 1.25x
    if other not in summary.get(workload, {}):
        measured = f"{num(mine)}; {other} not run"
    else:
        measured = f"{num(mine)} vs {other} {num(theirs)} = {ratio(mine, theirs)}"
    return Target(
        label,
        f">= {times} {BY_NAME.get(other, other)} cycles/s, same run",
        measured,
        _status(None if mine is None or not theirs else mine >= factor * theirs),
    )


def floor_note(summary: Summary) -> list[str]:
    """Under W1's table: how the floor ran beside it and what the targets are judged on."""
    rounds = floor_rounds(summary)
    if not rounds:
        return []
    return [
        "W0's floor repeats ran interleaved with W1's (round k: the floor, then each "
        "library). The x floor column is each row's median over the floor's median; the W1 "
        "vs floor targets are judged on the median of aiolock's per-round ratios (W1 repeat "
        "k / floor repeat k): " + ", ".join(f"{r:.2f}x" for r in rounds) + ".",
        "",
    ]


def floor_rounds(summary: Summary) -> list[float]:
    """aiolock's W1 cycles/s over the floor's, round by round, when W0's repeats ran
    interleaved with W1's (repeat k of each in round k); empty otherwise."""
    floor = summary.get("w0", {}).get(FLOOR) or {}
    mine = summary.get("w1", {}).get(AIOLOCK) or {}
    if "w1" not in floor.get("interleaved_with", ()):
        return []
    return per_round(mine.get("key_by_repeat") or [], floor.get("key_by_repeat") or [])


def vs_floor(summary: Summary, label: str, factor: float, text: str) -> Target:
    """aiolock's W1 cycles/s >= *factor* x the W0 floor's, measured in the same run.

    Judged on the median of the per-round ratios when the floor ran round by round beside
    W1 (every full run with both); the ratio of the two medians, which compares repeats
    taken minutes apart, is shown beside it, and judged only when there are no rounds.
    """
    w1 = metric(summary, "w1", AIOLOCK, "cycles_per_s")
    floor = metric(summary, "w0", FLOOR, "cycles_per_s")
    medians = f"{num(w1)} vs floor {num(floor)} = {ratio(w1, floor)}"
    rounds = floor_rounds(summary)
    if rounds:
        judged: float | None = statistics.median(rounds)
        each = ", ".join(f"{r:.2f}x" for r in rounds)
        measured = (
            f"{judged:.2f}x, median of {len(rounds)} per-round ratios ({each}); "
            f"ratio of medians {medians}"
        )
    else:
        judged = None if w1 is None or not floor else w1 / floor
        measured = medians
    return Target(
        label,
        text,
        measured,
        _status(None if judged is None else judged >= factor),
        figure=judged,
    )


def issue21_w1(summary: Summary) -> list[Target]:
    """Issue 21's target 3: W1 at least redis-py's Lock and 0.95x the two-EVALSHA floor."""
    return [
        at_least(summary, "W1 (issue 21)", "w1", COST_BASE, 1.0),
        vs_floor(
            summary, "W1 (issue 21)", 0.95, ">= 0.95x W0 floor (two EVALSHA) cycles/s, same run"
        ),
    ]


def cost_targets(summary: Summary) -> list[Target]:
    out: list[Target] = []
    for workload, key, label, limit, what in (
        ("c1", "sent_us_per_op", "C1", 2.0,
         "server time of the commands sent per uncontended cycle"),
        ("c2", "server_cpu_us_per_op", "C2", 1.2,
         "Redis CPU per contended acquisition (4 processes)"),
    ):  # fmt: skip
        if workload not in summary:
            continue
        mine = metric(summary, workload, AIOLOCK, key)
        base = metric(summary, workload, COST_BASE, key)
        ok = None if mine is None or not base else mine <= limit * base
        out.append(
            Target(
                label,
                f"{what} <= {limit:g}x redis-py's Lock",
                f"{num(mine, 1)} us vs redis-py {num(base, 1)} us = {ratio(mine, base)}",
                _status(ok),
            )
        )
    if "c3" not in summary:
        return out
    for pre, label, what in (
        ("", "C3", "used name"),
        ("reused_", "C3 (names used N times)", "name used N times (N in the C3 table)"),
    ):
        per_name = metric(summary, "c3", AIOLOCK, f"{pre}bytes_left_per_name")
        if per_name is None and pre:
            continue
        gone = metric(summary, "c3", AIOLOCK, f"{pre}gone_within_60s")
        keys = metric(summary, "c3", AIOLOCK, f"{pre}keys_per_name")
        ok = None if per_name is None else (per_name <= 100 or bool(gone))
        out.append(
            Target(
                label,
                f"Redis memory left per {what} after release <= 100 B on average, "
                "or all of it gone within 60 s",
                f"{num(per_name, 1)} B/name in {num(keys, 2)} keys/name, longest TTL "
                f"{ttl_text(metric(summary, 'c3', AIOLOCK, f'{pre}max_ttl_s'))}",
                _status(ok),
            )
        )
    return out


# -- plots -----------------------------------------------------------------------------


def make_plots(out: Path, summary: Summary) -> list[str]:
    try:
        matplotlib: Any = importlib.import_module("matplotlib")
    except ImportError:
        return []
    matplotlib.use("Agg")
    plt: Any = importlib.import_module("matplotlib.pyplot")
    written: list[str] = []

    layouts = [w for w in ("w3", "w3mp") if summary.get(w)]
    if layouts:
        fig, axes = plt.subplots(1, len(layouts), figsize=(6.5 * len(layouts), 4.5), squeeze=False)
        for ax, w in zip(axes[0], layouts, strict=True):
            for lib, entry in summary[w].items():
                samples = (
                    entry.get("metrics", {}).get("handoff_samples_us") if entry.get("ok") else None
                )
                if not samples:
                    continue
                xs = sorted(samples)
                ys = [(i + 1) / len(xs) for i in range(len(xs))]
                ax.step(xs, ys, where="post", label=lib)
            # symlog: negative handoffs (the next owner's acquire returned before the
            # releaser's release did) stay visible left of zero.
            ax.set_xscale("symlog", linthresh=10.0)
            ax.axvline(0, color="grey", linewidth=0.8)
            ax.set_xlabel("handoff latency, us (release-return -> next owner's acquire-return)")
            ax.set_ylabel("cumulative share")
            ax.set_title(WORKLOADS[w].split(":")[1].strip())
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle("W3 handoff latency distribution (owner changes)")
        fig.tight_layout()
        fig.savefig(out / "handoff_latency.png", dpi=110)
        plt.close(fig)
        written.append("handoff_latency.png")

    bars = [
        (w, k)
        for w, k in (
            ("w1", "cycles_per_s"),
            ("w2", "cycles_per_s"),
            ("w2mp", "cycles_per_s"),
            ("w3", "acquisitions_per_s"),
            ("w3mp", "acquisitions_per_s"),
        )
        if summary.get(w)
    ]
    if bars:
        libs = [lib for lib in ADAPTERS if any(lib in summary[w] for w, _ in bars)]
        fig, axes = plt.subplots(1, len(bars), figsize=(4.2 * len(bars), 4.5), squeeze=False)
        for ax, (w, key) in zip(axes[0], bars, strict=True):
            values = [metric(summary, w, lib, key) or 0.0 for lib in libs]
            ax.bar(range(len(libs)), values, color=[f"C{i}" for i in range(len(libs))])
            ax.set_xticks(range(len(libs)))
            ax.set_xticklabels(libs, rotation=35, ha="right", fontsize=8)
            ax.set_title(w.upper() + (" cycles/s" if "cycles" in key else " acquisitions/s"))
            floor = metric(summary, "w0", FLOOR, "cycles_per_s")
            if w == "w1" and floor:
                ax.axhline(floor, color="k", linestyle="--", linewidth=1, label="W0 floor")
                ax.legend(fontsize=8)
            ax.grid(True, axis="y", alpha=0.3)
        fig.suptitle("Throughput per library (higher is better)")
        fig.tight_layout()
        fig.savefig(out / "throughput.png", dpi=110)
        plt.close(fig)
        written.append("throughput.png")
    return written


# -- documents -------------------------------------------------------------------------


METHOD = """\
## Method

* One private `redis-server` on a free loopback port (`aiolock.testing.RedisServer`),
  no persistence; `FLUSHALL` before every run. Every (library, workload) pair runs in a
  fresh `python -m benchmarks.peers.worker` process; `w2mp` and `w3mp` start 4 more worker
  processes. The baseline (`aiolock-pre21`, `--baseline REV`) is that revision's
  `aiolock/` package, extracted once per run with `git archive`, found first on the
  workers' `sys.path`; a result whose processes imported another `aiolock` is refused.
* **Round trips** = socket writes the library makes, counted by wrapping the client
  connection's send path (`send_packed_command` for redis-py asyncio and sync;
  `RedisConnection.execute` for aioredis 1.x). A pipeline flush counts once.
* **Client cmds** = top-level commands the client sends (EVALSHA, SET, PUBLISH,
  SUBSCRIBE, ...), counted by name where the client packs them.
* **All cmds** = the server's `INFO commandstats` delta (`calls + rejected_calls`),
  which includes the commands Lua scripts run with `redis.call`; all - client = commands
  run inside scripts. The harness's own INFO / CLIENT LIST / DBSIZE calls are subtracted.
  New connections made inside a window add their handshake (HELLO, ...) to both counts.
* **Connections** = `CLIENT LIST` entries other than the harness's own, sampled in the
  middle of the run (W4: the maximum of three samples during the wait).
* **Handoff latency** (W3): acquisitions sorted by acquire-return time (`time.monotonic()`,
  system-wide on Linux, so records from the 4 processes are merged directly); handoff =
  next acquire-return minus previous release-return. "owner change" handoffs are those
  where the next holder is a different task, the wake-up latency of a waiter; "all"
  includes a task re-taking the lock it just released. A small negative value is possible
  (the next holder's acquire reply can arrive before the releaser's reply). Plots show the
  owner-change distribution. Throughput counts acquisitions that returned inside the
  timed window; commands per acquisition include the drain after it.
* **Memory**: `tracemalloc` (Python allocations) and RSS deltas; tracemalloc runs only
  while memory is measured (W4 wait, W5 acquiring), never during timed sections.
* **CPU**: `time.process_time()` of the worker process (all threads).
* **Redis-side cost** (C1-C3): server time = `INFO commandstats` `usec` delta of the
  command names the library sent (a script's time includes the commands it runs, which
  Redis also adds to their own stats, so those are not added again; a name sent and also
  run inside scripts counts in proportion to its top-level calls); server CPU = `INFO
  cpu` `used_cpu_user + used_cpu_sys` delta (the whole server process, so it includes
  socket I/O and a few tens of microseconds per harness `INFO`); memory left =
  `MEMORY USAGE ... SAMPLES 0` and `PTTL` of every key named after a used lock name.
* **Repeats** are interleaved across libraries (round k: library A, B, C); when W0 and
  W1 both run, W0's floor repeats are interleaved with W1's (round k: the floor, then each
  library). Tables show the median repeat; a target comparing W1 with the floor is judged
  on the median of the per-round ratios (aiolock's W1 repeat k / the floor's repeat k),
  with the ratio of the medians shown beside it.
* Per-acquire timeout 20 s; every loop is bounded by a deadline and/or a count.
"""


def markdown(
    meta: dict[str, Any],
    summary: Summary,
    runs: list[dict[str, Any]],
    goals: list[Target],
    images: list[str],
) -> str:
    lines = [
        "# aiolock benchmark results",
        "",
        f"Generated {meta['date_utc']} by `{meta['command'].strip()}` "
        f"(profile **{meta['profile']}**, {meta['total_seconds']:.0f} s).",
        "",
        f"Python {meta['python']} on {meta['platform']}, {meta['cpus']} CPUs; "
        f"redis-server {meta['redis_server']} on loopback. Load average before/after: "
        f"{meta['loadavg_before'][0]} / {meta['loadavg_after'][0]} (other work on the machine "
        "adds noise; repeats are interleaved across libraries).",
        "",
        *([f"{meta['baseline']}.", ""] if meta.get("baseline") else []),
        "| library | version |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in meta["versions"].items()),
        "",
        "## Targets (aiolock)",
        "",
        "| workload | target | measured | status |",
        "|---|---|---|---|",
        *(f"| {t.workload} | {t.text} | {t.measured} | **{t.status}** |" for t in goals),
        "",
    ]
    notes = Path(__file__).resolve().parent.parent / "NOTES.md"
    if notes.exists():  # hand-written analysis of the targets, measured separately
        lines += [notes.read_text("utf-8").strip(), ""]
    if meta["profile"] == "quick":
        lines += [
            "Quick profile: short runs (W1-W3 0.5 s, one repeat), W4 holds 1 s and waits "
            "at most 3 s for the waiters, W5 holds 1,000 locks (not 10,000) with a 6 s "
            "lease, C1 runs 2,000 cycles or 1 s, C2 0.5 s and C3 200 names, so these "
            "numbers check the harness; use the full run for comparisons.",
            "",
        ]
    lines += [
        "## Results",
        "",
        "Values are from the median repeat (by the first column). "
        "\"aiolock / this\" is aiolock's value divided by the row's.",
        "",
    ]
    lines += cost_rows(summary)
    lines += sections(summary)
    failures = [r for r in runs if not r.get("ok")]
    if failures:
        lines += [
            "## Failed runs",
            "",
            "| workload | library | repeat | error |",
            "|---|---|---|---|",
        ]
        for r in failures:
            error = short(r.get("error")).replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {r['workload']} | {r['lib']} | {r['repeat']} | {error} |")
        lines.append("")
    leftovers = [r for r in runs if r.get("leftover_clients")]
    if leftovers:
        lines += [
            "Connections still open 3 s after the worker exited: "
            + ", ".join(f"{r['workload']}/{r['lib']}: {r['leftover_clients']}" for r in leftovers),
            "",
        ]
    lines += ["## How each library is driven", ""]
    for name, cls in ADAPTERS.items():
        if name in meta["versions"]:
            lines.append(f"* **{name}**: {cls.note}")
    lines += [
        "* The peers' redis-py clients are built with `max_connections=1024` (redis-py 8's "
        "default pool of 100 overflows with W4's 500 waiters); aiolock's client has "
        "redis-py's defaults.",
        "",
        METHOD,
        "## Parameters",
        "",
        "```json",
        json.dumps(meta["params"], indent=1),
        "```",
        "",
    ]
    if images:
        lines += ["## Plots", ""] + [f"![{img}]({img})" for img in images] + [""]
    return "\n".join(lines)


def write_all(
    out: Path,
    meta: dict[str, Any],
    summary: Summary,
    runs: list[dict[str, Any]],
    *,
    plots: bool = True,
) -> None:
    goals = targets(summary)
    images = make_plots(out, summary) if plots else []
    doc = {"meta": meta, "targets": [t.to_json() for t in goals], "summary": summary, "runs": runs}
    (out / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    text = markdown(meta, summary, runs, goals, images)
    (out / "RESULTS.md").write_text(text + kept_sections(out / "RESULTS.md"))
