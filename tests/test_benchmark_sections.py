"""RESULTS.md sections: each benchmark rewrites its own, the main harness keeps them all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.sections import MARKERS, kept_sections, write_section


def test_a_section_is_replaced_in_place_and_the_others_kept(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text("# Results\n\nmain harness text\n")
    write_section(results, "cluster", "## Cluster\nfirst run")
    write_section(results, "redlock", "## Redlock\nfigures")
    write_section(results, "cluster", "## Cluster\nsecond run")
    text = results.read_text()
    assert text.startswith("# Results\n\nmain harness text\n")
    assert "first run" not in text
    assert text.count(MARKERS["cluster"][0]) == 1
    assert text.index("second run") < text.index("## Redlock")  # stayed where it was
    kept = kept_sections(results)
    assert "main harness text" not in kept
    assert "second run" in kept and "## Redlock" in kept


def test_the_committed_results_keep_every_marked_section() -> None:
    results = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "RESULTS.md"
    kept = kept_sections(results)
    for start, end in MARKERS.values():
        assert kept.count(start) == 1 and kept.count(end) == 1, start


def test_script_floor_runs_every_pair_and_writes_its_section(tmp_path: Path) -> None:
    """A short run of the script-floor benchmark: every pair acquires and releases each
    cycle (the benchmark raises otherwise), and the ratios are against redis-py's row."""
    from benchmarks import script_floor

    assert script_floor.main(["--cycles", "20", "--repeats", "1", "--out", str(tmp_path)]) == 0
    rows = {
        row["pair"]: row for row in json.loads((tmp_path / "script_floor.json").read_text())["rows"]
    }
    assert list(rows) == [pair.name for pair in script_floor.pairs()]
    assert rows["redis-py's Lock"]["vs_redis_py"] == 1.0
    assert all(row["server_us_per_cycle"] > 0 for row in rows.values())
    assert MARKERS["script-floor"][0] in (tmp_path / "RESULTS.md").read_text()


def test_client_floor_runs_every_client_and_writes_its_section(tmp_path: Path) -> None:
    """A short run of the client-floor benchmark: every client completes its cycles (each
    checks that its acquire was granted and its release released), ratios against the
    minimal client and redis-py's Lock."""
    from benchmarks import client_floor

    argv = ["--seconds", "0.2", "--repeats", "1", "--tasks", "4", "--out", str(tmp_path)]
    assert client_floor.main(argv) == 0
    result = json.loads((tmp_path / "client_floor.json").read_text())
    rows = {row["client"]: row for row in result["rows"]}
    assert list(rows) == list(client_floor.ROWS)
    assert rows["minimal batching client"]["cpu_vs_minimal"] == 1.0
    assert rows["redis-py's Lock"]["rate_vs_redis_py"] == 1.0
    assert all(row["cycles_per_s"] > 0 and row["cpu_us_per_cycle"] > 0 for row in rows.values())
    assert MARKERS["client-floor"][0] in (tmp_path / "RESULTS.md").read_text()


def test_the_benchmarks_count_aiolocks_own_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """aiolock writes to redis-py's connections itself: the round-trip counters must wrap
    that write where it lives, or every aiolock row would count nothing (a module move
    once made the patch skip silently)."""
    from aiolock._redis import transport
    from benchmarks import metrics

    monkeypatch.setattr(transport, "write", transport.write)  # restored after the test
    monkeypatch.setattr(transport, "_bench_patched", False, raising=False)
    original = transport.write
    metrics.install_client_counters()
    assert transport.write is not original
    assert getattr(transport, "_bench_patched", False) is True
