"""``aiolock top``: the hottest names across every manager on a server or a Cluster.

Each open manager publishes its contention summary beside its identity record
(:mod:`aiolock._engine.contention`: ``P:mgr:{<id>}:top``, rewritten every second while it
changes). This reads every summary under the prefix (``SCAN``, on every primary of a
Cluster), adds the managers' figures up per name, and, for the names it shows, reads who
holds each now (:mod:`aiolock._redis.inspect`). Nothing is written.

Per name: the waits, timeouts and losses of every manager added up, the wait p99 the
worst of the managers' (each over its latest waits), grants per second added up, and the
tasks waiting now per process (``name@host pid``).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from redis.asyncio import Redis

from aiolock._cli.inspect import Holder, LockInfo, Who, glob_escape
from aiolock._cli.target import Target, describe_name
from aiolock._engine.contention import parse_summary
from aiolock._keys import IDENTITY_TAG
from aiolock._redis.identity import parse_record

__all__ = [
    "INSPECTED",
    "NameRow",
    "holder_text",
    "read_summaries",
    "read_top",
    "render",
    "run_top",
    "waiting_by_name",
    "who_text",
]

#: The inspector's kind for each kind name a summary uses.
INSPECTED = {
    "lock": "lock",
    "fair lock": "fair",
    "read lock": "rw",
    "write lock": "rw",
    "semaphore": "semaphore",
}
#: The longest name a table cell shows (characters).
_NAME_CELL = 40


@dataclass
class NameRow:
    """One name's figures, every manager's added up."""

    kind: str
    name: str
    acquisitions: int = 0
    waits: int = 0
    wait_seconds: float = 0.0
    wait_p99: float = 0.0
    hold_p99: float = 0.0
    handovers: int = 0
    timeouts: int = 0
    losses: int = 0
    waiting: int = 0
    #: how long the tasks waiting now have waited so far, in all
    waiting_seconds: float = 0.0
    grants_per_s: float = 0.0
    managers: int = 0
    #: per process with tasks waiting now: who (``name@host pid``) -> how many
    waiters: dict[str, int] = field(default_factory=dict)
    #: who holds it now, with how long and under which fencing token where Redis says
    holders: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data["waiters"] = [{"who": who, "waiting": n} for who, n in self.waiters.items()]
        return data


def holder_text(who: Holder | Who) -> str:
    """``billing-worker@web-1 pid 4242`` for a holder or waiter the inspector resolved, or,
    when its record is gone, ``(no record, manager 3f2a9c1e)`` (the first digits of its
    id, which ``show`` prints whole)."""
    if who.host is None and who.pid is None:
        return f"(no record, manager {(who.manager or '?')[:8]})"
    return f"{who.name or '?'}@{who.host or '?'} pid {who.pid if who.pid is not None else '?'}"


def who_text(record: dict[str, Any] | None) -> str:
    """``billing-worker@web-1 pid 4242`` from an identity record; ``(no record)``."""
    if record is None:
        return "(no record)"
    name = record.get("n") or record.get("c") or "?"
    return f"{name}@{record.get('h') or '?'} pid {record.get('p', '?')}"


async def _summaries(node: Redis, prefix: str) -> list[tuple[str, dict[str, Any] | None, Any]]:
    """Every (manager id, identity record, summary) on *node* under *prefix*."""
    pattern = f"{glob_escape(prefix)}:{IDENTITY_TAG}:{{*}}:top"
    keys = [key async for key in node.scan_iter(match=pattern, count=1000)]
    if not keys:
        return []
    texts = [key.decode() if isinstance(key, bytes) else str(key) for key in keys]
    pipe = node.pipeline(transaction=False)
    for text in texts:
        pipe.get(text.removesuffix(":top"))
        pipe.get(text)
    replies = await pipe.execute()
    return [
        (text.rsplit("{", 1)[-1].split("}", 1)[0], parse_record(replies[2 * i]), replies[2 * i + 1])
        for i, text in enumerate(texts)
    ]


async def read_summaries(
    target: Target, prefix: str
) -> list[tuple[str, str, list[dict[str, Any]]]]:
    """Every open manager's contention summary under *prefix*: (manager id, who it is,
    its rows); on a Cluster, from every primary."""
    nodes = [target.redis] if target.cluster is None else target.primaries()
    found = []
    for node in nodes:
        for manager, record, raw in await _summaries(node, prefix):
            rows = parse_summary(raw)
            if rows is not None:
                found.append((manager, who_text(record), rows))
    return found


async def waiting_by_name(target: Target, prefix: str) -> dict[tuple[str, str], dict[str, int]]:
    """Per (inspector kind, name): the processes with tasks waiting for it now, each with
    how many (``aiolock list``)."""
    found: dict[tuple[str, str], dict[str, int]] = {}
    for _, who, rows in await read_summaries(target, prefix):
        for row in rows:
            kind, waiting = INSPECTED.get(str(row["kind"])), int(row["waiting"])
            if kind is not None and waiting > 0:
                per = found.setdefault((kind, str(row["name"])), {})
                per[who] = per.get(who, 0) + waiting
    return found


async def read_top(target: Target, prefix: str, limit: int) -> list[NameRow]:
    """The *limit* hottest names (by wait time, the waits in progress included, every
    manager's added up), hottest first, each with who holds it now."""
    rows: dict[tuple[str, str], NameRow] = {}
    for _, who, entries in await read_summaries(target, prefix):
        for entry in entries:
            key = (str(entry["kind"]), str(entry["name"]))
            row = rows.get(key) or rows.setdefault(key, NameRow(*key))
            row.managers += 1
            for name in ("acquisitions", "waits", "handovers", "timeouts", "losses"):
                setattr(row, name, getattr(row, name) + int(entry[name]))
            row.wait_seconds += float(entry["wait_seconds"])
            row.waiting_seconds += float(entry["waiting_seconds"])
            row.grants_per_s += float(entry["grants_per_s"])
            row.wait_p99 = max(row.wait_p99, float(entry["wait_p99"]))
            row.hold_p99 = max(row.hold_p99, float(entry["hold_p99"]))
            if int(entry["waiting"]) > 0:
                row.waiting += int(entry["waiting"])
                row.waiters[who] = row.waiters.get(who, 0) + int(entry["waiting"])
    hottest = sorted(
        rows.values(),
        key=lambda r: (-(r.wait_seconds + r.waiting_seconds), -r.acquisitions, r.name),
    )
    shown = hottest[:limit]
    for row in shown:
        if not row.name.endswith("…"):  # a cut name names no lock
            row.holders = _holders(await describe_name(target, prefix, row.name), row.kind)
    return shown


def _holders(infos: list[LockInfo], kind: str) -> list[dict[str, Any]]:
    wanted = INSPECTED.get(kind)
    return [
        {
            "who": holder_text(holder),
            "role": holder.role,
            "count": holder.count,
            "held_for": holder.held_for,
            "token": holder.token,
        }
        for info in infos
        if info.kind == wanted
        for holder in info.holders
    ]


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.1f}s"


def render(rows: list[NameRow], out: TextIO, *, server: str, now: float) -> None:
    """One screen of the table."""
    stamp = time.strftime("%H:%M:%S", time.localtime(now))
    print(f"aiolock top - {server} - {stamp} - {len(rows)} names", file=out)
    if not rows:
        print(
            "no contention summaries (no open manager with top_k > 0 under this prefix)",
            file=out,
        )
        return
    table = [["NAME", "KIND", "HOLDER", "HELD FOR", "WAITING", "WAIT P99", "GRANTS/S",
              "WAITS", "TIMEOUTS", "LOST"]]  # fmt: skip
    for row in rows:
        name = row.name if len(row.name) <= _NAME_CELL else row.name[: _NAME_CELL - 1] + "…"
        holder = ", ".join(h["who"] for h in row.holders) or "-"
        held = [h["held_for"] for h in row.holders if h["held_for"] is not None]
        per = sorted(row.waiters.items(), key=lambda item: (-item[1], item[0]))
        waiting = f"{row.waiting} ({', '.join(f'{n} {who}' for who, n in per)})" if per else "0"
        table.append([
            name, row.kind, holder, _seconds(max(held) if held else None), waiting,
            _seconds(row.wait_p99), f"{row.grants_per_s:.1f}", str(row.waits),
            str(row.timeouts), str(row.losses),
        ])  # fmt: skip
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for cells in table:
        print("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip(), file=out)


async def run_top(target: Target, args: Any, server: str) -> int:
    """The command: one snapshot (``--once``) or a screen every ``--interval``."""
    if args.once:
        rows = await read_top(target, args.prefix, args.limit)
        if args.json:
            print(json.dumps({"time": time.time(), "names": [r.to_dict() for r in rows]}, indent=2))
        else:
            render(rows, sys.stdout, server=server, now=time.time())
        return 0
    tty = sys.stdout.isatty()
    deadline = None if args.duration is None else time.monotonic() + args.duration
    shown = 0
    while args.count is None or shown < args.count:
        rows = await read_top(target, args.prefix, args.limit)
        if args.json:  # one JSON object per line, for a pipe
            print(json.dumps({"time": time.time(), "names": [r.to_dict() for r in rows]}))
        else:
            if tty:
                print("\x1b[H\x1b[2J", end="")  # like top: the screen redrawn in place
            elif shown:
                print()
            render(rows, sys.stdout, server=server, now=time.time())
        sys.stdout.flush()
        shown += 1
        if deadline is not None and time.monotonic() >= deadline:
            break
        await asyncio.sleep(args.interval)
    return 0
