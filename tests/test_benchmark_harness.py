"""The benchmark harness runs end to end in quick mode (correctness only, no timings)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_quick_benchmark_run_writes_its_reports(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--libs", "aiolock,redis-py",
         "--no-plots", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = (tmp_path / "RESULTS.md").read_text()
    for heading in ("W0", "W1", "W2", "W3", "W4", "W5", "C1", "C2", "C3"):
        assert heading in report
    assert "Redis-side cost per operation" in report
    data = json.loads((tmp_path / "results.json").read_text())
    assert data  # every workload ran for aiolock and redis-py
    assert "aiolock" in json.dumps(data)
    # The Redis-side cost workloads produced numbers for both libraries.
    for lib in ("aiolock", "redis-py"):
        c1 = data["summary"]["c1"][lib]["metrics"]
        c2 = data["summary"]["c2"][lib]["metrics"]
        c3 = data["summary"]["c3"][lib]["metrics"]
        assert c1["sent_us_per_op"] > 0 and c1["server_cpu_us_per_op"] > 0
        assert c2["acquisitions"] > 0 and c2["server_cpu_us_per_op"] > 0
        assert c3["names"] > 0 and c3["bytes_left_per_name"] >= 0
