"""OpenTelemetry for aiolock: spans for waiting and holding, and lock metrics.

Install with ``pip install 'aiolock[otel]'`` (the OpenTelemetry API; an SDK and an
exporter of your choice do the rest), then::

    from aiolock.contrib.opentelemetry import OpenTelemetryObserver

    locks = LockManager(redis, observers=[OpenTelemetryObserver()])

Spans (both children of the span current where the lock is acquired):

* ``aiolock.wait``: from the start of an acquire to its end, with ``aiolock.result``
  ``acquired``, ``timeout``, ``cancelled`` or ``error`` (status ERROR);
* ``aiolock.hold``: from the acquisition to the release or loss, with ``aiolock.result``
  ``released`` or ``lost`` (status ERROR, and ``aiolock.lost_reason``).

Both carry ``aiolock.kind``, ``aiolock.name`` and (once acquired) ``aiolock.fencing_token``.
Metrics: see :data:`METRICS` and ``docs/observability.md``. Lock names are attributes of
the per-name gauges only (``aiolock.name.*``), for the hottest names only (the managers'
top-K tables, ``LockManager(top_k=)``), and not at all with ``lock_names=False``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

try:
    from opentelemetry import metrics, trace
    from opentelemetry.metrics import CallbackOptions, Observation
    from opentelemetry.trace import Span, Status, StatusCode
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "aiolock.contrib.opentelemetry needs the OpenTelemetry API: "
        "pip install 'aiolock[otel]' (or opentelemetry-api)"
    ) from exc

from aiolock import __version__
from aiolock._observe import AcquireFailure, ObservedManager, Observer
from aiolock.contrib._statistics import NAME_GAUGES, WatchedManagers

__all__ = ["METRICS", "SECONDS_BUCKETS", "OpenTelemetryObserver"]

#: Histogram bucket boundaries (seconds) advised for the wait and hold durations: lock
#: waits and holds range from a millisecond to minutes, not the SDK's default 0-10000.
SECONDS_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0,
)  # fmt: skip

#: The instruments: name -> what it measures (attributes in brackets).
METRICS = {
    "aiolock.wait.duration": "histogram, s: acquire waits [aiolock.kind, aiolock.result]",
    "aiolock.hold.duration": "histogram, s: holds, acquired to end [aiolock.kind, aiolock.result]",
    "aiolock.acquisitions": "counter: acquires by result [aiolock.kind, aiolock.result]",
    "aiolock.losses": "counter: holds lost [aiolock.kind]",
    "aiolock.renewals": "counter: holds renewed by the watchdog [aiolock.kind]",
    "aiolock.held": "gauge: holds now [aiolock.prefix, aiolock.kind]",
    "aiolock.waiters": "gauge: tasks waiting now [aiolock.prefix]",
    **{
        f"aiolock.name.{attribute}": (
            f"gauge{', s' if seconds else ''}: {what} [aiolock.prefix, aiolock.kind, aiolock.name]"
        )
        for attribute, (seconds, what) in NAME_GAUGES.items()
    },
}

#: Hold spans remembered at most; beyond this the oldest are dropped (never ended).
MAX_OPEN_HOLDS = 100_000


class OpenTelemetryObserver(Observer):
    """Records aiolock's waits and holds as spans and metrics through OpenTelemetry.

    One observer can watch any number of managers. Without providers it uses the global
    ones (``trace.set_tracer_provider``, ``metrics.set_meter_provider``), as configured by
    the application or ``opentelemetry-instrument``.

    Args:
        tracer_provider: where the spans go; ``None``: the global tracer provider.
        meter_provider: where the metrics go; ``None``: the global meter provider.
        spans: record spans (``False``: metrics only).
        lock_names: put lock names in span attributes and export the per-name gauges
            of the hottest names (``False`` if names carry data that must not leave the
            process: no metric then carries a name).
    """

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        spans: bool = True,
        lock_names: bool = True,
    ) -> None:
        self._tracer = trace.get_tracer("aiolock", __version__, tracer_provider=tracer_provider)
        meter = metrics.get_meter("aiolock", __version__, meter_provider=meter_provider)
        self._spans = spans
        self._lock_names = lock_names
        #: (kind, name, fencing token) -> the span of a hold not yet ended
        self._holds: dict[tuple[str, str, int], Span] = {}
        self._managers = WatchedManagers()
        self._wait = meter.create_histogram(
            "aiolock.wait.duration",
            unit="s",
            description="Time from the start of an acquire to its end, by result.",
            explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
        )
        self._hold = meter.create_histogram(
            "aiolock.hold.duration",
            unit="s",
            description="Time a hold lasted, from its acquisition to its release or loss.",
            explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
        )
        self._acquisitions = meter.create_counter(
            "aiolock.acquisitions",
            unit="{acquire}",
            description="Acquires of new holds, by result (acquired, timeout, cancelled, error).",
        )
        self._losses = meter.create_counter(
            "aiolock.losses", unit="{hold}", description="Holds lost while held."
        )
        self._renewals = meter.create_counter(
            "aiolock.renewals", unit="{hold}", description="Holds renewed by the lease watchdog."
        )
        meter.create_observable_gauge(
            "aiolock.held",
            callbacks=[self._observe_held],
            unit="{hold}",
            description="Holds of the watched managers' tasks now, by kind.",
        )
        meter.create_observable_gauge(
            "aiolock.waiters",
            callbacks=[self._observe_waiters],
            unit="{task}",
            description="Tasks of the watched managers waiting for a lock now.",
        )
        if lock_names:
            for attribute, (seconds, what) in NAME_GAUGES.items():
                meter.create_observable_gauge(
                    f"aiolock.name.{attribute}",
                    callbacks=[self._per_name(attribute)],
                    unit="s" if seconds else "1",
                    description=what,
                )

    def attached(self, manager: ObservedManager) -> None:
        self._managers.add(manager)

    # -- events ------------------------------------------------------------------------

    def acquired(self, kind: str, name: str, waited_s: float, token: int) -> None:
        self._waited(kind, name, waited_s, "acquired", token)
        self._hold_started(kind, name, token)

    def acquire_failed(self, kind: str, name: str, waited_s: float, reason: AcquireFailure) -> None:
        self._waited(kind, name, waited_s, reason, None)

    def released(self, kind: str, name: str, held_s: float, token: int) -> None:
        self._hold_ended(kind, name, held_s, token, None)

    def lost(self, kind: str, name: str, held_s: float, token: int, reason: str) -> None:
        self._losses.add(1, {"aiolock.kind": kind})
        self._hold_ended(kind, name, held_s, token, reason)

    def renewed(self, kind: str, count: int, round_trip_s: float) -> None:
        self._renewals.add(count, {"aiolock.kind": kind})

    # -- spans and instruments -----------------------------------------------------------

    def _attributes(self, kind: str, name: str) -> dict[str, str | int]:
        attributes: dict[str, str | int] = {"aiolock.kind": kind}
        if self._lock_names:
            attributes["aiolock.name"] = name
        return attributes

    def _waited(
        self, kind: str, name: str, waited_s: float, result: str, token: int | None
    ) -> None:
        labels = {"aiolock.kind": kind, "aiolock.result": result}
        self._wait.record(waited_s, labels)
        self._acquisitions.add(1, labels)
        if not self._spans:
            return
        # The wait is over: its span is made now, backdated to when the wait began, in
        # the acquiring task (so its parent is the caller's current span).
        now = time.time_ns()
        attributes = self._attributes(kind, name)
        attributes["aiolock.result"] = result
        if token is not None:
            attributes["aiolock.fencing_token"] = token
        span = self._tracer.start_span(
            "aiolock.wait", start_time=now - int(waited_s * 1e9), attributes=attributes
        )
        if result == "error":
            span.set_status(Status(StatusCode.ERROR, "the acquire failed"))
        span.end(end_time=now)

    def _hold_started(self, kind: str, name: str, token: int) -> None:
        if not self._spans:
            return
        attributes = self._attributes(kind, name)
        attributes["aiolock.fencing_token"] = token
        self._holds[(kind, name, token)] = self._tracer.start_span(
            "aiolock.hold", attributes=attributes
        )
        if len(self._holds) > MAX_OPEN_HOLDS:  # a bound, should an end ever go unreported
            del self._holds[next(iter(self._holds))]

    def _hold_ended(
        self, kind: str, name: str, held_s: float, token: int, lost: str | None
    ) -> None:
        result = "released" if lost is None else "lost"
        self._hold.record(held_s, {"aiolock.kind": kind, "aiolock.result": result})
        span = self._holds.pop((kind, name, token), None)
        if span is None:
            return
        span.set_attribute("aiolock.result", result)
        if lost is not None:
            span.set_attribute("aiolock.lost_reason", lost)
            span.set_status(Status(StatusCode.ERROR, f"the hold was lost: {lost}"))
        span.end()

    def _observe_held(self, options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(count, {"aiolock.prefix": prefix, "aiolock.kind": kind})
            for prefix, total in self._managers.totals().items()
            for kind, count in total.held.items()
        ]

    def _per_name(self, attribute: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return [
                Observation(
                    getattr(row, attribute),
                    {"aiolock.prefix": prefix, "aiolock.kind": row.kind, "aiolock.name": row.name},
                )
                for prefix, total in self._managers.totals().items()
                for row in total.names
            ]

        return observe

    def _observe_waiters(self, options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(total.waiters, {"aiolock.prefix": prefix})
            for prefix, total in self._managers.totals().items()
        ]
