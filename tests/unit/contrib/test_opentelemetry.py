"""aiolock.contrib.opentelemetry: spans and metrics of real acquisitions, read back in memory."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from redis.asyncio import Redis

import aiolock
from aiolock.contrib.opentelemetry import METRICS, OpenTelemetryObserver
from tests._support.helpers import eventually


@dataclass
class Telemetry:
    locks: aiolock.LockManager
    tracer_provider: TracerProvider
    spans: InMemorySpanExporter
    reader: InMemoryMetricReader

    def finished(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if s.name == name]

    def points(self, metric: str) -> Iterator[Any]:
        data = self.reader.get_metrics_data()
        assert data is not None
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for found in scope.metrics:
                    if found.name == metric:
                        yield from found.data.data_points

    def value(self, metric: str, **attributes: str) -> Any:
        """The point of *metric* with exactly these attributes (``aiolock.`` left out)."""
        wanted = {f"aiolock.{k}": v for k, v in attributes.items()}
        matching = [p for p in self.points(metric) if dict(p.attributes) == wanted]
        assert len(matching) <= 1
        if not matching:
            return None
        point = matching[0]
        return point.count if hasattr(point, "bucket_counts") else point.value


@pytest.fixture
async def otel(redis: Redis, prefix: str) -> AsyncIterator[Telemetry]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    observer = OpenTelemetryObserver(
        tracer_provider=tracer_provider, meter_provider=MeterProvider(metric_readers=[reader])
    )
    async with aiolock.LockManager(redis, prefix=prefix, observers=[observer]) as locks:
        yield Telemetry(locks, tracer_provider, exporter, reader)


async def test_spans_of_a_wait_and_a_hold(otel: Telemetry) -> None:
    tracer = otel.tracer_provider.get_tracer("test")
    with tracer.start_as_current_span("request") as request:
        async with otel.locks.lock("order:1") as lock:
            token = lock.fencing_token
            assert not otel.finished("aiolock.hold")  # open while held
    (wait,) = otel.finished("aiolock.wait")
    (hold,) = otel.finished("aiolock.hold")
    for span in (wait, hold):
        assert span.parent is not None
        assert span.parent.span_id == request.get_span_context().span_id
        assert span.attributes is not None
        assert span.attributes["aiolock.kind"] == "lock"
        assert span.attributes["aiolock.name"] == "order:1"
        assert span.attributes["aiolock.fencing_token"] == token
    assert wait.attributes is not None and wait.attributes["aiolock.result"] == "acquired"
    assert hold.attributes is not None and hold.attributes["aiolock.result"] == "released"
    assert wait.start_time is not None and wait.end_time is not None
    assert hold.start_time is not None and wait.end_time <= hold.start_time
    assert hold.status.status_code is StatusCode.UNSET


async def test_a_timeout_and_a_loss(otel: Telemetry) -> None:
    locks = otel.locks
    lock = locks.lock("order:2")
    with pytest.raises(aiolock.LockLostError):
        async with lock:
            other = asyncio.create_task(locks.lock("order:2").try_acquire(timeout=0.05))
            assert not await other
            await lock.force_release()
            await asyncio.sleep(1)
    results = [(s.attributes or {}).get("aiolock.result") for s in otel.finished("aiolock.wait")]
    assert sorted(map(str, results)) == ["acquired", "timeout"]
    (hold,) = otel.finished("aiolock.hold")
    assert hold.attributes is not None and hold.attributes["aiolock.result"] == "lost"
    assert "force-released" in str(hold.attributes["aiolock.lost_reason"])
    assert hold.status.status_code is StatusCode.ERROR

    assert otel.value("aiolock.acquisitions", kind="lock", result="acquired") == 1
    assert otel.value("aiolock.acquisitions", kind="lock", result="timeout") == 1
    assert otel.value("aiolock.wait.duration", kind="lock", result="timeout") == 1
    assert otel.value("aiolock.hold.duration", kind="lock", result="lost") == 1
    assert otel.value("aiolock.losses", kind="lock") == 1
    (timeout,) = [
        p
        for p in otel.points("aiolock.wait.duration")
        if p.attributes["aiolock.result"] == "timeout"
    ]
    assert 0.04 <= timeout.sum < 1.0
    assert timeout.explicit_bounds[0] == 0.001  # seconds buckets, not the SDK's defaults


async def test_metrics_of_holds_waiters_and_renewals(redis: Redis, prefix: str) -> None:
    reader = InMemoryMetricReader()
    observer = OpenTelemetryObserver(
        meter_provider=MeterProvider(metric_readers=[reader]), spans=False
    )
    # a 1.5 s lease: a renewal round every 0.5 s, and a loaded machine that delays one
    # does not lose the holds
    async with aiolock.LockManager(redis, prefix=prefix, lease=1.5) as locks:
        locks.add_observer(observer)
        telemetry = Telemetry(locks, TracerProvider(), InMemorySpanExporter(), reader)
        sem = locks.semaphore("api", 2)
        async with locks.lock("a"), sem, sem:
            waiter = asyncio.create_task(locks.lock("a").acquire())

            # a renewal round meanwhile, and the waiter waiting (waited for, not slept on)
            def renewed_and_waiting() -> bool:
                return (
                    (telemetry.value("aiolock.renewals", kind="lock") or 0) >= 1
                    and (telemetry.value("aiolock.renewals", kind="semaphore") or 0) >= 2
                    and locks.statistics().hub.waiters == 1
                )

            await eventually(renewed_and_waiting, what="a renewal round of the holds, a waiter")
            assert telemetry.value("aiolock.held", prefix=prefix, kind="lock") == 1
            assert telemetry.value("aiolock.held", prefix=prefix, kind="semaphore") == 2
            assert telemetry.value("aiolock.waiters", prefix=prefix) == 1
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
        assert telemetry.value("aiolock.held", prefix=prefix, kind="lock") == 0
        assert telemetry.value("aiolock.waiters", prefix=prefix) == 0
        assert telemetry.value("aiolock.renewals", kind="lock") >= 1
        assert telemetry.value("aiolock.renewals", kind="semaphore") >= 2
        assert telemetry.value("aiolock.acquisitions", kind="semaphore", result="acquired") == 2
        assert telemetry.value("aiolock.acquisitions", kind="lock", result="cancelled") == 1
        assert telemetry.value("aiolock.hold.duration", kind="semaphore", result="released") == 2
    assert set(METRICS) >= {"aiolock.held", "aiolock.waiters", "aiolock.renewals"}
    # A closed manager is no longer reported.
    assert telemetry.value("aiolock.waiters", prefix=prefix) is None


async def test_lock_names_can_be_kept_out_of_spans(redis: Redis, prefix: str) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    observer = OpenTelemetryObserver(tracer_provider=provider, lock_names=False)
    locks = aiolock.LockManager(redis, prefix=prefix, observers=[observer])
    async with locks, locks.lock("user:alice@example.com"):
        pass
    spans = exporter.get_finished_spans()
    assert len(spans) == 2
    assert all(s.attributes is not None and "aiolock.name" not in s.attributes for s in spans)


async def test_the_hottest_names_as_gauges_bounded_by_top_k(redis: Redis, prefix: str) -> None:
    """Issue 38: per-name gauges for the top-K names only, and none with lock_names=False."""
    reader, quiet = InMemoryMetricReader(), InMemoryMetricReader()
    observers = [
        OpenTelemetryObserver(meter_provider=MeterProvider(metric_readers=[reader]), spans=False),
        OpenTelemetryObserver(
            meter_provider=MeterProvider(metric_readers=[quiet]), spans=False, lock_names=False
        ),
    ]
    async with aiolock.LockManager(redis, prefix=prefix, top_k=3, observers=observers) as locks:

        async def take(name: str) -> None:
            async with locks.lock(name):
                await asyncio.sleep(0.005)

        await asyncio.gather(*(take("hot") for _ in range(5)))
        for i in range(10):  # more names than top_k, none of them contended
            await take(f"cold{i}")
        telemetry = Telemetry(locks, TracerProvider(), InMemorySpanExporter(), reader)
        waits = telemetry.value("aiolock.name.waits", prefix=prefix, kind="lock", name="hot")
        assert waits == 4  # the first of the five found it free
        assert (
            telemetry.value("aiolock.name.wait_seconds", prefix=prefix, kind="lock", name="hot") > 0
        )
        names = {dict(p.attributes)["aiolock.name"] for p in telemetry.points("aiolock.name.waits")}
        assert "hot" in names and len(names) == 3
        silent = Telemetry(locks, TracerProvider(), InMemorySpanExporter(), quiet)
        assert list(silent.points("aiolock.name.waits")) == []
    assert {f"aiolock.name.{a}" for a in ("waits", "waiting", "wait_p99")} <= set(METRICS)
