"""The managers an adapter watches, and their statistics added up per key prefix.

Gauges and counters read from :meth:`~aiolock.LockManager.statistics` carry the prefix as
their identifying label; several open managers with one prefix in a process are added
up, so their series never collide. Lock names are labels of the per-name gauges only,
and only for the hottest names: the managers' top-K tables (``LockManager(top_k=)``)
merged per prefix and cut to the largest of them, so a process exports at most
``top_k`` names per prefix however many it uses.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field, replace

from aiolock import NameStatistics
from aiolock._manager import ManagerStatistics
from aiolock._observe import ObservedManager

__all__ = ["NAME_GAUGES", "PrefixTotals", "WatchedManagers", "merge_names"]

#: The per-name gauges: attribute of :class:`~aiolock.NameStatistics` -> (whether it is
#: seconds, what it measures). Gauges, not counters: a name that leaves a manager's table
#: and comes back starts again from 0.
NAME_GAUGES: dict[str, tuple[bool, str]] = {
    "wait_seconds": (True, "Time the name's waits took, in all, while in the top-K table."),
    "waiting": (False, "Tasks waiting for the name now."),
    "waiting_seconds": (True, "Time the tasks waiting for the name now have waited so far."),
    "waits": (False, "Acquires that waited for the name, while in the top-K table."),
    "acquisitions": (False, "New holds of the name, while in the top-K table."),
    "wait_p50": (True, "Median of the name's latest waits (the worst manager's)."),
    "wait_p99": (True, "99th percentile of the name's latest waits (the worst manager's)."),
    "hold_p50": (True, "Median of the name's latest holds (the worst manager's)."),
    "hold_p99": (True, "99th percentile of the name's latest holds (the worst manager's)."),
    "handovers": (False, "Holds of the name handed over by a local release."),
    "timeouts": (False, "Acquires of the name that ran out of time."),
    "losses": (False, "Holds of the name lost while held."),
}
#: The per-name figures that are the worst manager's, not a sum.
_WORST = frozenset({"wait_p50", "wait_p99", "hold_p50", "hold_p99", "tracked_for"})


def merge_names(tables: list[tuple[NameStatistics, ...]]) -> list[NameStatistics]:
    """The managers' *tables* as one: per kind and name, counts and times added up,
    percentiles the worst; hottest first, cut to the largest table's length."""
    merged: dict[tuple[str, str], NameStatistics] = {}
    for table in tables:
        for row in table:
            key = (row.kind, row.name)
            seen = merged.get(key)
            if seen is None:
                merged[key] = row
                continue
            changes = {
                name: max(getattr(seen, name), getattr(row, name))
                if name in _WORST
                else getattr(seen, name) + getattr(row, name)
                for name in (*NAME_GAUGES, "error", "tracked_for")
            }
            merged[key] = replace(seen, **changes)
    hottest = sorted(
        merged.values(), key=lambda r: (-(r.wait_seconds + r.waiting_seconds), r.kind, r.name)
    )
    return hottest[: max((len(t) for t in tables), default=0)]


@dataclass
class PrefixTotals:
    """The statistics of the open managers of one prefix, added up."""

    #: holds now, per kind (every kind acquired so far appears, 0 when none is held)
    held: dict[str, int] = field(default_factory=dict)
    waiters: int = 0
    pending_cleanups: int = 0
    connection_errors: int = 0
    pubsub_reconnects: int = 0
    released_on_task_exit: int = 0
    #: the hottest names of the prefix's managers (see :func:`merge_names`)
    names: list[NameStatistics] = field(default_factory=list)


class WatchedManagers:
    """Managers an observer was attached to; forgotten when they are garbage collected."""

    def __init__(self) -> None:
        self._managers: weakref.WeakSet[ObservedManager] = weakref.WeakSet()

    def add(self, manager: ObservedManager) -> None:
        self._managers.add(manager)

    def totals(self) -> dict[str, PrefixTotals]:
        """Per prefix, the statistics of the managers that are open now."""
        totals: dict[str, PrefixTotals] = {}
        tables: dict[str, list[tuple[NameStatistics, ...]]] = {}
        for manager in list(self._managers):
            if not manager.is_open:
                continue
            stats: ManagerStatistics = manager.statistics()
            total = totals.setdefault(manager.prefix, PrefixTotals())
            for kind in {*stats.acquired, *stats.held_by_kind}:
                total.held[kind] = total.held.get(kind, 0) + stats.held_by_kind.get(kind, 0)
            total.waiters += stats.hub.waiters
            total.pending_cleanups += stats.pending_cleanups
            total.connection_errors += stats.connection_errors
            total.pubsub_reconnects += stats.hub.reconnects
            total.released_on_task_exit += stats.released_on_task_exit
            tables.setdefault(manager.prefix, []).append(stats.names)
        for prefix, total in totals.items():
            total.names = merge_names(tables[prefix])
        return totals
