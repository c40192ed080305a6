"""The managers an adapter watches, and their statistics added up per key prefix.

Gauges and counters read from :meth:`~aiolock.LockManager.statistics` carry the prefix as
their only identifying label (lock names would make one series per name); several open
managers with one prefix in a process are added up, so their series never collide.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

from aiolock._manager import ManagerStatistics
from aiolock._observe import ObservedManager

__all__ = ["PrefixTotals", "WatchedManagers"]


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


class WatchedManagers:
    """Managers an observer was attached to; forgotten when they are garbage collected."""

    def __init__(self) -> None:
        self._managers: weakref.WeakSet[ObservedManager] = weakref.WeakSet()

    def add(self, manager: ObservedManager) -> None:
        self._managers.add(manager)

    def totals(self) -> dict[str, PrefixTotals]:
        """Per prefix, the statistics of the managers that are open now."""
        totals: dict[str, PrefixTotals] = {}
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
        return totals
