"""aiolock.contrib.prometheus: a registry scraped after real acquisitions."""

from __future__ import annotations

import ast
import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

import aiolock
from aiolock.contrib.prometheus import METRICS, PrometheusObserver
from tests._support.helpers import eventually

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(registry: CollectorRegistry) -> Samples:
    """Every sample of a scrape: (name, labels) -> value, parsed from the text format."""
    text = generate_latest(registry).decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def sample(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float | None:
    return samples.get((name, frozenset(labels.items())))


async def test_a_scrape_after_real_acquisitions(redis: Redis, prefix: str) -> None:
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry)
    # The 30 s lease: the holds outlive any stall of a loaded machine; the renewal counted
    # below is the watchdog's round, run by the test.
    async with aiolock.LockManager(redis, prefix=prefix, observers=[observer]) as locks:
        async with locks.lock("a"), locks.rw_lock("b").read():
            assert await locks.lock("a").try_acquire(timeout=0)  # a re-entry: not counted
            await locks.lock("a").release()
            other = asyncio.create_task(locks.lock("a").acquire(timeout=0.3))
            await eventually(lambda: locks.statistics().hub.waiters == 1, what="the waiter")
            now = scrape(registry)
            assert sample(now, "aiolock_held", prefix=prefix, kind="lock") == 1
            assert sample(now, "aiolock_held", prefix=prefix, kind="read lock") == 1
            assert sample(now, "aiolock_waiters", prefix=prefix) == 1
            with pytest.raises(aiolock.LockTimeoutError):
                await other
            assert await locks._open_engine().watchdog.renew_all()
            assert (sample(scrape(registry), "aiolock_renewals_total", kind="lock") or 0) >= 1
        lock = locks.lock("c")
        with pytest.raises(aiolock.LockLostError):
            async with lock:
                await lock.force_release()
                await asyncio.sleep(30)  # the loss, not the body's end, must end it
        after = scrape(registry)
    assert sample(after, "aiolock_acquisitions_total", kind="lock", result="acquired") == 2
    assert sample(after, "aiolock_acquisitions_total", kind="read lock", result="acquired") == 1
    assert sample(after, "aiolock_acquisitions_total", kind="lock", result="timeout") == 1
    assert sample(after, "aiolock_wait_seconds_count", kind="lock", result="timeout") == 1
    timed_out = sample(after, "aiolock_wait_seconds_sum", kind="lock", result="timeout")
    # a 0.3 s timeout, raised late on a loaded machine: the buckets agree with the sum
    assert timed_out is not None and 0.25 <= timed_out < 5, timed_out
    assert (
        sample(after, "aiolock_wait_seconds_bucket", kind="lock", result="timeout", le="0.1") == 0
    )
    assert sample(
        after, "aiolock_wait_seconds_bucket", kind="lock", result="timeout", le="0.5"
    ) == (1 if timed_out <= 0.5 else 0)
    assert sample(after, "aiolock_hold_seconds_count", kind="lock", result="released") == 1
    assert sample(after, "aiolock_hold_seconds_count", kind="read lock", result="released") == 1
    assert sample(after, "aiolock_hold_seconds_count", kind="lock", result="lost") == 1
    assert sample(after, "aiolock_losses_total", kind="lock") == 1
    renewals = sample(after, "aiolock_renewals_total", kind="lock")
    assert renewals is not None and renewals >= 1
    assert sample(after, "aiolock_held", prefix=prefix, kind="lock") == 0
    assert sample(after, "aiolock_waiters", prefix=prefix) == 0
    assert sample(after, "aiolock_connection_errors_total", prefix=prefix) == 0
    assert sample(after, "aiolock_released_on_task_exit_total", prefix=prefix) == 0
    names = {name for name, _ in after}
    for family in METRICS:
        assert any(n == family or n.startswith(f"{family}_") for n in names), family
    # Once closed, the manager's statistics leave the scrape; the event metrics stay.
    closed = scrape(registry)
    assert sample(closed, "aiolock_waiters", prefix=prefix) is None
    assert sample(closed, "aiolock_losses_total", kind="lock") == 1


async def test_managers_of_one_prefix_are_added_up(redis: Redis, prefix: str) -> None:
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry, namespace="app_locks")
    async with (
        aiolock.LockManager(redis, prefix=prefix, observers=[observer]) as one,
        aiolock.LockManager(redis, prefix=prefix, observers=[observer]) as two,
        one.lock("x"),
        two.lock("y"),
    ):
        now = scrape(registry)
        assert sample(now, "app_locks_held", prefix=prefix, kind="lock") == 2
    assert sample(now, "app_locks_acquisitions_total", kind="lock", result="acquired") == 2


def test_one_observer_per_registry() -> None:
    registry = CollectorRegistry()
    PrometheusObserver(registry)
    with pytest.raises(ValueError, match="Duplicated"):
        PrometheusObserver(registry)


_MULTIPROCESS_CHILD = """
import asyncio, sys
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
import aiolock
from aiolock.contrib.prometheus import PrometheusObserver

async def main(url: str) -> None:
    observer = PrometheusObserver()
    async with aiolock.LockManager.from_url(url, prefix="mp", observers=[observer]) as locks:
        async with locks.lock("a"):
            shared = CollectorRegistry()
            MultiProcessCollector(shared)
            own = CollectorRegistry()
            own.register(observer.collector)
            for registry in (shared, own):
                print(repr(generate_latest(registry).decode()))

asyncio.run(main(sys.argv[1]))
"""


@pytest.mark.processes
def test_multiprocess_mode_serves_the_statistics_from_each_workers_collector(
    redis_url: str, tmp_path: Path
) -> None:
    """docs/observability.md: with PROMETHEUS_MULTIPROC_DIR the statistics families are
    missing from MultiProcessCollector's scrape (issue 18), and a registry of the worker's
    own holding ``observer.collector`` serves them. prometheus_client picks its
    multiprocess mode at import, hence the child process."""
    result = subprocess.run(
        [sys.executable, "-c", _MULTIPROCESS_CHILD, redis_url],
        env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    shared, own = (ast.literal_eval(line) for line in result.stdout.splitlines())
    assert 'aiolock_acquisitions_total{kind="lock",result="acquired"} 1.0' in shared
    assert "aiolock_held" not in shared
    assert 'aiolock_held{kind="lock",prefix="mp"} 1.0' in own


async def test_the_hottest_names_as_labels_bounded_by_top_k(redis: Redis, prefix: str) -> None:
    """Issue 38: per-name gauges carry names for the managers' top-K names only, merged
    across the managers of a prefix."""
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry)
    async with (
        aiolock.LockManager(redis, prefix=prefix, top_k=4, observers=[observer]) as one,
        aiolock.LockManager(redis, prefix=prefix, top_k=4, observers=[observer]) as two,
    ):

        async def take(locks: aiolock.LockManager, name: str) -> None:
            async with locks.lock(name):
                await asyncio.sleep(0.005)

        await asyncio.gather(*(take(m, "hot") for m in (one, two) for _ in range(4)))
        for i in range(12):
            await take(one, f"cold{i}")
            await take(two, f"other{i}")
        now = scrape(registry)
        labels = frozenset({"prefix": prefix, "kind": "lock", "name": "hot"}.items())
        hot = now.get(("aiolock_name_waits", labels))
        assert hot is not None and hot >= 6  # both managers' waits, added up
        assert now.get(("aiolock_name_wait_p99_seconds", labels), 0) > 0
        named = {dict(labels)["name"] for (metric, labels) in now if metric == "aiolock_name_waits"}
        assert "hot" in named and len(named) == 4  # 25 names used, 4 exported
    assert "aiolock_name_wait_seconds" in METRICS and "aiolock_name_waiting" in METRICS
