"""Per-name contention statistics: the hottest names of one manager, at bounded cost.

A service that slows down first asks which lock, and since when. The manager keeps, for
at most ``top_k`` names, what answers it: acquisitions, waits and their time, the waits'
and holds' p50 and p99, local hand-overs, timeouts and losses. Which names it keeps is a
weighted *space-saving* summary (Metwally, Agrawal and El Abbadi, 2005) by total wait
time: a name that waits enters the table, and when the table is full it takes the place
of the name with the least wait time, starting from that name's total (its ``error``:
the most its total may overstate). Every name whose total wait exceeds the sum of all
waits over ``top_k`` is in the table; memory is ``top_k`` entries whatever the number of
names.

Cost: an acquisition with no wait (the fast path) does one dictionary lookup; a name it
does not find takes a free place, or none (a name that never waited evicts nobody). A
release adds one sample to its entry's hold times. Percentiles are over each entry's
last :data:`SAMPLES` waits and holds, computed only when a snapshot is taken.

**The contention summary** ``P:mgr:{<manager id>}:top`` sits beside the record (the same
hash tag, so the same Cluster slot) while the manager's per-name statistics have
anything to say (``LockManager(top_k=...)``, :mod:`aiolock._engine.contention`): what
``aiolock top`` reads. A JSON object:

=====  ===================================================================
``t``  when it was written (Unix time, seconds, the process's clock)
``n``  the hottest names, hottest first, at most ``top_k`` (100 at most): each a list
       ``[kind, name, acquisitions, waits, wait s, wait p50, wait p99, hold p50,
       hold p99, hand-overs, timeouts, losses, waiting now, their wait so far s,
       grants/s]`` (seconds
       rounded to microseconds; grants/s over the time since the previous write; a name
       longer than :data:`TOP_NAME` characters is cut, ending in ``…``)
=====  ===================================================================

It is written every :data:`TOP_PERIOD` while its figures change, else every ``lease / 3``,
with ``PX <lease>`` as the record is, and deleted with it (``LockManager(identity=False)``
writes neither).
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from aiolock._errors import LockError
from aiolock._keys import ms

logger = logging.getLogger("aiolock")

__all__ = [
    "DEFAULT_TOP_K",
    "MAX_TOP_K",
    "SAMPLES",
    "TOP_NAME",
    "TOP_PERIOD",
    "Contention",
    "Entry",
    "NameStatistics",
    "check_top_k",
    "keep_published",
    "parse_summary",
    "summary_key",
    "top_summary",
]

#: Names a manager tracks by default.
DEFAULT_TOP_K = 20
#: The most a manager may track: the summary it publishes stays small (aiolock top).
MAX_TOP_K = 100
#: Waits and holds per name that its percentiles are computed over (the latest ones).
SAMPLES = 256
#: Seconds between two writes of the contention summary while its figures change.
TOP_PERIOD = 1.0
#: The longest name the contention summary spells out (characters).
TOP_NAME = 200
#: The fields of a row of the summary, in order (see the module docstring).
SUMMARY_FIELDS = (
    "kind", "name", "acquisitions", "waits", "wait_seconds", "wait_p50", "wait_p99",
    "hold_p50", "hold_p99", "handovers", "timeouts", "losses", "waiting",
    "waiting_seconds", "grants_per_s",
)  # fmt: skip


def check_top_k(value: object) -> int:
    """``LockManager(top_k=...)``: an int from 0 (no per-name statistics) to MAX_TOP_K."""
    if type(value) is not int:
        raise TypeError(
            f"top_k must be an int (how many of the hottest names to track, 0 for none), "
            f"not {type(value).__name__}"
        )
    if not 0 <= value <= MAX_TOP_K:
        raise ValueError(
            f"top_k must be from 0 (no per-name statistics) to {MAX_TOP_K}, got {value}"
        )
    return value


@dataclass(frozen=True)
class NameStatistics:
    """Contention on one name, as one manager saw it since the name entered its table.

    Attributes:
        kind: the lock kind (``"lock"``, ``"fair lock"``, ``"read lock"``,
            ``"write lock"``, ``"semaphore"``).
        name: the lock's name.
        acquisitions: new holds (not re-entries).
        waits: acquires that found the name held and waited (granted or not).
        wait_seconds: the time those waits took, in all: what the table ranks by. It may
            overstate the name's own total by at most ``error``.
        error: the total of the name this one replaced in the table (0 if none).
        wait_p50: median of the latest waits (seconds; 0 with none).
        wait_p99: 99th percentile of the latest waits.
        hold_p50: median of the latest holds, acquired to released or lost.
        hold_p99: 99th percentile of the latest holds.
        handovers: holds granted by a release of this manager to one of its waiting
            tasks, without the lock being freed in between.
        timeouts: acquires that ran out of time.
        losses: holds lost while held.
        waiting: tasks of this manager waiting for it now.
        waiting_seconds: how long those tasks have waited so far, in all (the table
            ranks by ``wait_seconds`` plus this: a name whose waiters are stuck behind
            a hung holder shows while they wait).
        tracked_for: seconds since the name entered the table.
    """

    kind: str
    name: str
    acquisitions: int
    waits: int
    wait_seconds: float
    error: float
    wait_p50: float
    wait_p99: float
    hold_p50: float
    hold_p99: float
    handovers: int
    timeouts: int
    losses: int
    waiting: int
    waiting_seconds: float
    tracked_for: float


class Entry:
    """One tracked name's figures (the fast path updates ``acquisitions`` and ``holds``
    in place: see :meth:`Contention.acquired`)."""

    __slots__ = (
        "acquisitions",
        "error",
        "handovers",
        "holds",
        "kind",
        "losses",
        "name",
        "since",
        "timeouts",
        "wait_seconds",
        "waits",
        "waits_taken",
    )

    def __init__(self, kind: str, name: str, base: float) -> None:
        self.kind = kind
        self.name = name
        self.acquisitions = 0
        self.waits = 0
        self.wait_seconds = base
        self.error = base
        self.handovers = 0
        self.timeouts = 0
        self.losses = 0
        self.waits_taken: deque[float] = deque(maxlen=SAMPLES)
        self.holds: deque[float] = deque(maxlen=SAMPLES)
        self.since = time.monotonic()


def _percentile(samples: deque[float], q: float) -> float:
    if not samples:
        return 0.0
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Contention:
    """The table of one manager (see the module docstring). Keys are a hold's
    ``resource`` (one per kind and name); callers pass the kind and name along for the
    rare event that adds an entry."""

    __slots__ = ("entries", "top_k", "waiting")

    def __init__(self, top_k: int) -> None:
        self.top_k = top_k
        #: resource -> its entry. The fast path reads it inline (see :meth:`acquired`)
        self.entries: dict[str, Entry] = {}
        #: the engine's waits in progress, per resource: [tasks, the sum of their start
        #: times (monotonic), kind, name]; a resource goes when its last wait ends. Its
        #: waits count at once, in or out of the table: a name whose holder hangs shows
        #: while its waiters wait, not when they give up
        self.waiting: dict[str, list[Any]] = {}

    def __len__(self) -> int:
        return len(self.entries)

    def _entry(self, resource: str, kind: str, name: str) -> Entry | None:
        """The entry of *resource*, added if the table has room."""
        entry = self.entries.get(resource)
        if entry is None and len(self.entries) < self.top_k:
            entry = self.entries[resource] = Entry(kind, name, 0.0)
        return entry

    def acquired(self, resource: str, kind: str, name: str) -> None:
        """A new hold of *resource*. The fast path does this inline: an entry found is
        counted there, and only a name that may take a free place calls this (a call is
        a Python function entered, which an uncontended cycle has a budget of)."""
        entry = self.entries.get(resource)
        if entry is None:
            if len(self.entries) >= self.top_k:
                return  # a name that did not wait evicts nobody
            entry = self.entries[resource] = Entry(kind, name, 0.0)
        entry.acquisitions += 1

    def handed_over(self, resource: str) -> None:
        entry = self.entries.get(resource)
        if entry is not None:
            entry.handovers += 1

    def held(self, resource: str, seconds: float) -> None:
        """A hold of *resource* ended after *seconds* (inline in HoldRegistry.remove)."""
        entry = self.entries.get(resource)
        if entry is not None:
            entry.holds.append(seconds)

    def lost(self, resource: str, kind: str, name: str) -> None:
        entry = self._entry(resource, kind, name)
        if entry is not None:
            entry.losses += 1

    def timed_out(self, resource: str, kind: str, name: str) -> None:
        entry = self._entry(resource, kind, name)
        if entry is not None:
            entry.timeouts += 1

    def wait_began(self, resource: str, kind: str, name: str) -> float:
        """A task of the manager begins the engine's wait for *resource*: when (monotonic)."""
        now = time.monotonic()
        waits = self.waiting.get(resource)
        if waits is None:
            self.waiting[resource] = [1, now, kind, name]
        else:
            waits[0] += 1
            waits[1] += now
        return now

    def wait_ended(
        self, resource: str, kind: str, name: str, began: float, busy: bool, handed: bool
    ) -> None:
        """That wait ended: it found the lock held (*busy*) or was *handed* the lock by a
        local release, or neither (the lock was free: no wait to count)."""
        waits = self.waiting.get(resource)
        if waits is not None:
            if waits[0] > 1:
                waits[0] -= 1
                waits[1] -= began
            else:
                del self.waiting[resource]
        if busy or handed:
            self.waited(resource, kind, name, time.monotonic() - began)
            if handed:
                self.handed_over(resource)

    def waited(self, resource: str, kind: str, name: str, seconds: float) -> None:
        """An acquire of *resource* found it held and waited *seconds* (granted or not)."""
        entries = self.entries
        entry = entries.get(resource)
        if entry is None:
            if not self.top_k:
                return
            base = 0.0
            if len(entries) >= self.top_k:
                # Space-saving: the least-waited name makes way, and the newcomer
                # inherits its total (the most by which the newcomer's may overstate).
                least = min(entries, key=lambda r: entries[r].wait_seconds)
                base = entries.pop(least).wait_seconds
            entry = entries[resource] = Entry(kind, name, base)
        entry.waits += 1
        entry.wait_seconds += seconds
        entry.waits_taken.append(seconds)

    def snapshot(self) -> tuple[NameStatistics, ...]:
        """The table and the names waited for now, hottest first (by wait time, the
        waits in progress included), at most ``top_k``."""
        if not self.top_k:
            return ()
        now = time.monotonic()
        waiting = self.waiting
        rows = [_row(e, waiting.get(resource), now) for resource, e in self.entries.items()]
        rows += [
            _row(Entry(kind, name, 0.0), waits, now)
            for resource, waits in waiting.items()
            if resource not in self.entries
            for kind, name in [(waits[2], waits[3])]
        ]
        rows.sort(key=lambda r: (-(r.wait_seconds + r.waiting_seconds), -r.acquisitions, r.name))
        return tuple(rows[: self.top_k])


def _row(e: Entry, waits: list[Any] | None, now: float) -> NameStatistics:
    count, began = (0, 0.0) if waits is None else (waits[0], waits[1])
    return NameStatistics(
        kind=e.kind,
        name=e.name,
        acquisitions=e.acquisitions,
        waits=e.waits,
        wait_seconds=round(e.wait_seconds, 6),
        error=round(e.error, 6),
        wait_p50=_percentile(e.waits_taken, 0.5),
        wait_p99=_percentile(e.waits_taken, 0.99),
        hold_p50=_percentile(e.holds, 0.5),
        hold_p99=_percentile(e.holds, 0.99),
        handovers=e.handovers,
        timeouts=e.timeouts,
        losses=e.losses,
        waiting=count,
        waiting_seconds=round(max(count * now - began, 0.0), 6),
        tracked_for=round(now - e.since, 3),
    )


def summary_key(identity_key: str) -> str:
    """The key of the contention summary beside the identity record at *identity_key*."""
    return f"{identity_key}:top"


def top_summary(
    rows: Sequence[NameStatistics], before: dict[tuple[str, str], int], seconds: float
) -> str:
    """The contention summary's value (see the module docstring); *before*: each row's
    acquisitions *seconds* ago (a row not in it counts no grants/s yet)."""
    names = []
    for r in rows:
        name = r.name if len(r.name) <= TOP_NAME else r.name[: TOP_NAME - 1] + "…"
        earlier = before.get((r.kind, r.name))
        rate = 0.0 if earlier is None or seconds <= 0 else (r.acquisitions - earlier) / seconds
        names.append([
            r.kind, name, r.acquisitions, r.waits, round(r.wait_seconds, 6),
            round(r.wait_p50, 6), round(r.wait_p99, 6), round(r.hold_p50, 6),
            round(r.hold_p99, 6), r.handovers, r.timeouts, r.losses, r.waiting,
            round(r.waiting_seconds, 6), round(max(rate, 0.0), 3),
        ])  # fmt: skip
    return json.dumps({"t": round(time.time(), 3), "n": names}, separators=(",", ":"))


def parse_summary(raw: Any) -> list[dict[str, Any]] | None:
    """A summary read back, as one dict per row (SUMMARY_FIELDS), or None if *raw* is
    missing or not one aiolock wrote; rows of another shape are left out."""
    try:
        data = json.loads(raw) if raw is not None else None
    except (ValueError, TypeError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("n"), list):
        return None
    return [
        dict(zip(SUMMARY_FIELDS, row, strict=True))
        for row in data["n"]
        if isinstance(row, list) and len(row) == len(SUMMARY_FIELDS)
    ]


async def keep_published(
    contention: Contention,
    call: Callable[..., Awaitable[Any]],
    key: str,
    lease: float,
    reached: Callable[[], bool] = lambda: True,
) -> None:
    """Write *contention*'s summary at *key* (with *call*, the manager client's) every
    TOP_PERIOD while its figures change, else every third of *lease*, while the manager
    is open: it expires one lease after the process stops. Not while the manager's last
    round trip failed (*reached* False): under an outage or a slow network the lock
    operations get the manager's connections, not the summary."""
    last, lease_ms, limit = 0.0, ms(lease), lease / 3
    #: per row (kind, name): acquisitions at the last write, for grants/s
    before: dict[tuple[str, str], int] = {}
    seen: dict[tuple[str, str], tuple[int, int, int, int]] = {}
    while True:
        await anyio.sleep(TOP_PERIOD)
        rows, now = contention.snapshot(), time.monotonic()
        counts = {(r.kind, r.name): (r.acquisitions, r.waits, r.losses, r.waiting) for r in rows}
        if not rows or (counts == seen and now - last < limit) or not reached():
            continue
        value = top_summary(rows, before, now - last)
        before, seen, last = {(r.kind, r.name): r.acquisitions for r in rows}, counts, now
        try:
            with anyio.fail_after(limit):
                await call("SET", key, value, "PX", lease_ms, key=key)
        except (LockError, TimeoutError) as exc:
            logger.debug("could not publish the manager's contention summary: %s", exc)
