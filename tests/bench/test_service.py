"""The service benchmark runs end to end on a tiny load (correctness only, no timings)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests._support.paths import REPO_ROOT


def test_a_small_service_benchmark_run_reports_both_libraries(tmp_path: Path) -> None:
    (tmp_path / "RESULTS.md").write_text("# Other results\n\nkept as they are\n")
    command = [
        sys.executable, "-m", "benchmarks.peers.service", "--requests", "40",
        "--concurrency", "8", "--ids", "2", "--repeats", "1", "--out", str(tmp_path),
    ]  # fmt: skip
    result = subprocess.run(
        command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=40, check=False
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    doc = json.loads((tmp_path / "service.json").read_text())
    assert {run["library"] for run in doc["runs"]} == {"aiolock", "redis-py"}
    for run in doc["runs"]:
        assert "error" not in run, run
        assert run["requests"] == run["responses"] == 40, run
        assert run["overlaps"] == 0 and run["lost_updates"] == 0, run
        assert run["checker_left"] == 0, run  # every INCR of the checker was DECRed
        assert run["ok"] == 40, run  # no 423/409/503 on so light a load
    for library in ("aiolock", "redis-py"):
        assert doc["summary"][library]["overlaps"] == 0
    report = (tmp_path / "RESULTS.md").read_text()
    assert report.startswith("# Other results\n\nkept as they are\n")
    assert report.count("<!-- service-bench:start -->") == 1
    assert "| aiolock |" in report and "| redis-py |" in report
