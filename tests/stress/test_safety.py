"""Small runs of the multi-process safety checker (a few seconds each)."""

from __future__ import annotations

import json
from typing import Any

from tests._support.checker import CheckConfig, run_check

#: Acquisitions the network-fault run must make at least, in 45 s, whatever the load (a
#: sixth of its work; alone it makes all 1,200 in 10-16 s)
PROGRESS_FLOOR = 200


def _explain(report: dict[str, Any]) -> str:
    keep = ["requested", "acquisitions", "overlaps", "local_overlaps", "fenced_writes_rejected"]
    keep += ["locks_lost", "missing_tokens", "errors", "violations", "first_errors"]
    keep += ["samples", "server", "workers"]
    return json.dumps({k: report[k] for k in keep}, indent=1)


def _assert_safe(report: dict[str, Any], requested: int) -> None:
    assert report["overlaps"] == 0, _explain(report)
    assert report["local_overlaps"] == 0, _explain(report)
    assert report["fenced_writes_rejected"] == 0, _explain(report)
    assert report["server"]["rejected"] == 0, _explain(report)
    assert report["server"]["inside_nonzero"] == {}, _explain(report)
    assert report["locks_lost"] == 0, _explain(report)
    assert report["errors"] == {}, _explain(report)
    assert report["acquisitions"] == requested, _explain(report)
    # every section wrote twice (entry and exit), and Redis saw exactly those writes
    assert report["fenced_writes_accepted"] == 2 * requested, _explain(report)
    assert report["server"]["accepted"] == 2 * requested, _explain(report)
    assert report["ok"], _explain(report)


def test_checker_catches_missing_exclusion() -> None:
    """Negative control: without a lock the same checks must see overlaps."""
    config = CheckConfig(
        processes=2, tasks=4, names=1, acquisitions=200, hold_ms=(0.5, 2.0), no_lock=True
    )
    report = run_check(config)
    assert report["overlaps"] > 0, _explain(report)
    assert not report["ok"]


def test_mutual_exclusion_across_processes() -> None:
    config = CheckConfig(
        processes=3, tasks=6, names=2, acquisitions=600, max_seconds=90.0, seed=1234
    )
    report = run_check(config)
    _assert_safe(report, 600)


def test_mutual_exclusion_with_renewal() -> None:
    """Short lease; a tenth of the sections outlive it and rely on background renewal."""
    config = CheckConfig.for_mode(
        long=True,
        processes=2,
        tasks=3,
        names=2,
        acquisitions=60,
        lease=0.5,
        long_fraction=0.1,
        max_seconds=90.0,
        seed=99,
    )
    report = run_check(config)
    _assert_safe(report, 60)


def test_safety_under_network_faults() -> None:
    """Resets, latency, blackholes and refused connects between the lock clients and
    Redis: acquisitions may fail, but never two holders, never a stale token.

    A safety test, bounded by time rather than by work: up to 1,200 acquisitions in
    45 s (alone it does them all in 10-16 s). On a machine loaded past its cores the
    faults' timeouts stretch every turn, and a run that stops at its deadline is as
    much a check of safety as one that finishes; how fast the lock makes progress is
    what the starvation and throughput tests measure. Every request is still accounted
    for, and a floor on acquisitions keeps the run from passing while doing nothing.
    """
    config = CheckConfig.for_mode(
        faults=True,
        processes=3,
        tasks=4,
        names=2,
        acquisitions=1200,
        max_seconds=45.0,
        seed=5,
        fault_interval=(0.1, 0.3),
        command_timeout=None,
        socket_timeout=2.0,
    )
    report = run_check(config)
    assert report["safe"], _explain(report)
    assert report["accounted"] == 1200, _explain(report)
    # The workers' deadline stops are expected here (see above); anything else is not.
    unexpected = {k: n for k, n in report["unexpected_errors"].items() if k != "Deadline"}
    assert unexpected == {}, _explain(report)
    assert report["acquisitions"] >= PROGRESS_FLOOR, _explain(report)
