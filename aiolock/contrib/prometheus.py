"""Prometheus metrics for aiolock, through ``prometheus_client``.

Install with ``pip install 'aiolock[prometheus]'``, then::

    from aiolock.contrib.prometheus import PrometheusObserver

    locks = LockManager(redis, observers=[PrometheusObserver()])  # the default registry

One observer per registry; it can watch any number of managers. It registers, in its
registry, histograms and counters fed by the lock events, and a collector that reads the
managers' :meth:`~aiolock.LockManager.statistics` at each scrape (see :data:`METRICS`).
Lock names are labels of the per-name gauges only (``aiolock_name_*``), and only for the
hottest names: the managers' top-K tables (``LockManager(top_k=)``, 20 by default),
merged per prefix; every other label is the kind or the managers' key prefix.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "aiolock.contrib.prometheus needs prometheus_client: "
        "pip install 'aiolock[prometheus]' (or prometheus-client)"
    ) from exc

from aiolock._observe import AcquireFailure, ObservedManager, Observer
from aiolock.contrib._statistics import NAME_GAUGES, PrefixTotals, WatchedManagers

__all__ = ["METRICS", "SECONDS_BUCKETS", "PrometheusObserver", "StatisticsCollector"]

#: Histogram buckets (seconds) of the wait and hold durations.
SECONDS_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0, float("inf"),
)  # fmt: skip


def _name_metric(namespace: str, attribute: str, seconds: bool) -> str:
    """``aiolock_name_wait_p99_seconds``: a percentile in seconds says its unit; the
    totals in seconds already end in it (``aiolock_name_wait_seconds``)."""
    unit = "_seconds" if seconds and not attribute.endswith("seconds") else ""
    return f"{namespace}_name_{attribute}{unit}"


#: The metric families with the default namespace: name -> what it measures [labels].
METRICS = {
    "aiolock_wait_seconds": "histogram: acquire waits [kind, result]",
    "aiolock_hold_seconds": "histogram: holds, acquired to end [kind, result]",
    "aiolock_acquisitions_total": "counter: acquires by result [kind, result]",
    "aiolock_losses_total": "counter: holds lost [kind]",
    "aiolock_renewals_total": "counter: holds renewed by the watchdog [kind]",
    "aiolock_held": "gauge: holds now [prefix, kind]",
    "aiolock_waiters": "gauge: tasks waiting now [prefix]",
    "aiolock_pending_cleanups": "gauge: undo/release commands awaiting a retry [prefix]",
    "aiolock_connection_errors_total": "counter: round trips failed on a connection error [prefix]",
    "aiolock_pubsub_reconnects_total": "counter: pub/sub connection re-established [prefix]",
    "aiolock_released_on_task_exit_total": "counter: holds released as their task ended [prefix]",
    **{
        _name_metric("aiolock", attribute, seconds): f"gauge: {what} [prefix, kind, name]"
        for attribute, (seconds, what) in NAME_GAUGES.items()
    },
}


class StatisticsCollector:
    """A ``prometheus_client`` collector: the watched managers' statistics at each scrape."""

    def __init__(self, managers: WatchedManagers, namespace: str = "aiolock") -> None:
        self._managers = managers
        self._ns = namespace

    def describe(self) -> Iterator[Metric]:
        """The families it yields (without samples): lets the registry check for clashes."""
        return self._families({})

    def collect(self) -> Iterator[Metric]:
        return self._families(self._managers.totals())

    def _families(self, totals: dict[str, PrefixTotals]) -> Iterator[Metric]:
        ns = self._ns
        held = GaugeMetricFamily(
            f"{ns}_held", "Holds of the managers' tasks now, by kind.", labels=["prefix", "kind"]
        )
        gauges: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            "waiters": GaugeMetricFamily(
                f"{ns}_waiters", "Tasks waiting for a lock now.", labels=["prefix"]
            ),
            "pending_cleanups": GaugeMetricFamily(
                f"{ns}_pending_cleanups",
                "Undo or release commands waiting to be retried in the background.",
                labels=["prefix"],
            ),
        }
        counters = {
            "connection_errors": CounterMetricFamily(
                f"{ns}_connection_errors",
                "Redis round trips that failed on a connection error (retried or ridden out).",
                labels=["prefix"],
            ),
            "pubsub_reconnects": CounterMetricFamily(
                f"{ns}_pubsub_reconnects",
                "Times the pub/sub connection was lost and re-established.",
                labels=["prefix"],
            ),
            "released_on_task_exit": CounterMetricFamily(
                f"{ns}_released_on_task_exit",
                "Holds released because their task ended without releasing them.",
                labels=["prefix"],
            ),
        }
        names = {
            attribute: GaugeMetricFamily(
                _name_metric(ns, attribute, seconds), what, labels=["prefix", "kind", "name"]
            )
            for attribute, (seconds, what) in NAME_GAUGES.items()
        }
        for prefix, total in totals.items():
            for kind, count in total.held.items():
                held.add_metric([prefix, kind], count)
            for attribute, family in (gauges | counters).items():
                family.add_metric([prefix], getattr(total, attribute))
            for row in total.names:
                for attribute, family in names.items():
                    family.add_metric([prefix, row.kind, row.name], getattr(row, attribute))
        yield held
        yield from (gauges | counters).values()
        yield from names.values()


class PrometheusObserver(Observer):
    """Feeds Prometheus histograms and counters from lock events, and exposes statistics.

    Args:
        registry: where the metrics are registered; ``None``: ``prometheus_client``'s
            default ``REGISTRY``. One observer per registry (a second one clashes).
        namespace: the first part of every metric name.
        buckets: the histograms' buckets, in seconds.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        namespace: str = "aiolock",
        buckets: Sequence[float] = SECONDS_BUCKETS,
    ) -> None:
        registry = REGISTRY if registry is None else registry
        self._managers = WatchedManagers()
        self.wait_seconds = Histogram(
            f"{namespace}_wait_seconds",
            "Time from the start of an acquire to its end, by result.",
            ["kind", "result"],
            registry=registry,
            buckets=buckets,
        )
        self.hold_seconds = Histogram(
            f"{namespace}_hold_seconds",
            "Time a hold lasted, from its acquisition to its release or loss.",
            ["kind", "result"],
            registry=registry,
            buckets=buckets,
        )
        self.acquisitions = Counter(
            f"{namespace}_acquisitions",
            "Acquires of new holds, by result (acquired, timeout, cancelled, error).",
            ["kind", "result"],
            registry=registry,
        )
        self.losses = Counter(
            f"{namespace}_losses", "Holds lost while held.", ["kind"], registry=registry
        )
        self.renewals = Counter(
            f"{namespace}_renewals",
            "Holds renewed by the lease watchdog.",
            ["kind"],
            registry=registry,
        )
        self.collector = StatisticsCollector(self._managers, namespace)
        registry.register(self.collector)

    def attached(self, manager: ObservedManager) -> None:
        self._managers.add(manager)

    def acquired(self, kind: str, name: str, waited_s: float, token: int) -> None:
        self.wait_seconds.labels(kind, "acquired").observe(waited_s)
        self.acquisitions.labels(kind, "acquired").inc()

    def acquire_failed(self, kind: str, name: str, waited_s: float, reason: AcquireFailure) -> None:
        self.wait_seconds.labels(kind, reason).observe(waited_s)
        self.acquisitions.labels(kind, reason).inc()

    def released(self, kind: str, name: str, held_s: float, token: int) -> None:
        self.hold_seconds.labels(kind, "released").observe(held_s)

    def lost(self, kind: str, name: str, held_s: float, token: int, reason: str) -> None:
        self.hold_seconds.labels(kind, "lost").observe(held_s)
        self.losses.labels(kind).inc()

    def renewed(self, kind: str, count: int, round_trip_s: float) -> None:
        self.renewals.labels(kind).inc(count)
