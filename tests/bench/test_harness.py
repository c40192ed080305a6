"""The benchmark harness runs end to end in quick mode (correctness only, no timings)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.peers.adapters import BASELINE
from benchmarks.peers.config import BASELINE_REV
from benchmarks.scripts import renewal
from tests._support.paths import REPO_ROOT


def _has_commit(rev: str) -> bool:
    """Whether this checkout's git knows *rev* (not in a source tarball or a shallow clone)."""
    try:
        found = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "cat-file", "-e", f"{rev}^{{commit}}"],
            capture_output=True, timeout=30, check=False,
        )  # fmt: skip
    except OSError:  # no git
        return False
    return found.returncode == 0


# A whole quick run (every workload, two libraries and the baseline's three workloads, one
# process each): about a minute on an idle machine, over 120 s once with CI's suites and
# other jobs loading both cores; its own subprocess time limit (300 s) is the bound that
# matters (issue 25).
@pytest.mark.timeout(330)
def test_quick_benchmark_run_writes_its_reports(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--libs",
         f"aiolock,{BASELINE},redis-py", "--no-plots", "--out", str(tmp_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = (tmp_path / "RESULTS.md").read_text()
    for heading in ("W0", "W1", "W2", "W2 concurrency: 4 processes", "W3", "W4", "W5", "C1"):
        assert heading in report
    for heading in ("C2", "C3"):
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
    # Issue 21: W2 in 4 processes x 64 tasks, and the rows of its targets.
    for lib in ("aiolock", "redis-py"):
        w2mp = data["summary"]["w2mp"][lib]["metrics"]
        assert (w2mp["procs"], w2mp["tasks"]) == (4, 256)
        assert w2mp["cycles"] > 0 and w2mp["min_process_cycles"] > 0
    rows = [(t["workload"], t["target"]) for t in data["targets"]]
    issue21 = [row for row in rows if row[0].endswith("(issue 21)")]
    assert [w for w, _ in issue21] == ["W1 (issue 21)", "W1 (issue 21)", "W2 (issue 21)",
                                       "W2mp (issue 21)"], rows  # fmt: skip
    assert any("3.2x redis-py's Lock" in text for _, text in issue21)
    # W0's floor ran round by round beside W1 (round 0: the floor, then each library), and
    # the W1 vs floor rows are judged on the per-round ratios, the medians' shown beside.
    assert data["meta"]["interleaved"] == [["w0", "w1"]]
    first = [(r["workload"], r["lib"]) for r in data["runs"][:4]]
    assert first == [("w0", "floor"), ("w1", "aiolock"), ("w1", BASELINE), ("w1", "redis-py")]
    floor = data["summary"]["w0"]["floor"]
    assert floor["interleaved_with"] == ["w1"] and len(floor["key_by_repeat"]) == 1
    w1 = data["summary"]["w1"]["aiolock"]
    (vs_floor,) = [t for t in data["targets"] if "0.95x W0 floor" in t["target"]]
    assert vs_floor["figure"] == w1["key_by_repeat"][0] / floor["key_by_repeat"][0]
    assert "median of 1 per-round ratios" in vs_floor["measured"]
    assert "ratio of medians" in vs_floor["measured"]
    # The baseline ran W1, W2 and W2mp only, on the extracted revision's package.
    if not _has_commit(BASELINE_REV):
        assert f"Baseline {BASELINE_REV} skipped" in report
        return
    for workload in ("w1", "w2", "w2mp"):
        entry = data["summary"][workload][BASELINE]
        assert entry["ok"] and entry["metrics"]["cycles"] > 0, entry
    for workload in set(data["summary"]) - {"w1", "w2", "w2mp"}:
        assert BASELINE not in data["summary"][workload]
    runs = [r for r in data["runs"] if r["lib"] == BASELINE]
    assert len(runs) == 3
    for run in runs:
        files = [Path(f) for f in run["aiolock_files"]]
        # the w2mp coordinator does not import aiolock: the parts' one file is reported
        assert len(files) == 1 and files[0].parent.name == "aiolock", files
        assert not files[0].is_relative_to(REPO_ROOT), files
    aiolock_runs = [r for r in data["runs"] if r["lib"] == "aiolock" and r["ok"]]
    for run in aiolock_runs:
        assert run["aiolock_files"] == [str(REPO_ROOT / "aiolock" / "__init__.py")], run
    assert "W2 (issue 21)" in report and data["meta"]["versions"][BASELINE].startswith(
        BASELINE_REV[:12]
    )


def test_paired_ratios_match_rounds_by_position() -> None:
    """benchmarks.common.paired: round k against round k, a round without both figures left out
    (not paired with another round's), the median of those ratios; and the ratio of the
    two medians, which pairs whatever rounds happen to be in the middle."""
    from benchmarks.common.paired import median_ratio, per_round, ratio_of_medians, times

    assert per_round([2.0, None, 3.0, 4.0], [1.0, 2.0, 0.0, 2.0]) == [2.0, 2.0]
    assert per_round([1.0, 2.0, 3.0], [1.0, 4.0]) == [1.0, 0.5]
    assert median_ratio([3.0, 8.0, 4.5], [2.0, 4.0, 5.0]) == 1.5  # 1.5, 2.0, 0.9
    assert ratio_of_medians([3.0, 8.0, 4.5], [2.0, 4.0, 5.0]) == 4.5 / 4.0
    assert median_ratio([None], [1.0]) is None and ratio_of_medians([], [1.0]) is None
    assert (times(1.0449), times(None)) == ("1.04x", "n/a")  # as the floor tables print them


def _w1_summary(w1: list[float], floor: list[float], interleaved: bool) -> dict[str, Any]:
    def entry(values: list[float]) -> dict[str, Any]:
        return {
            "ok": True,
            "metrics": {"cycles_per_s": sorted(values)[len(values) // 2]},
            "key_by_repeat": values,
        }

    summary = {"w0": {"floor": entry(floor)}, "w1": {"aiolock": entry(w1)}}
    if interleaved:
        summary["w0"]["floor"]["interleaved_with"] = ["w1"]
        summary["w1"]["aiolock"]["interleaved_with"] = ["w0"]
    return summary


def test_w1_vs_floor_rows_are_judged_round_by_round() -> None:
    """Issue 21, target 3: the floor drifted down over three rounds while W1 kept at about
    0.96x of it in each; the ratio of the medians (W1's middle round over the floor's,
    other rounds) reads 0.84x. The rows are judged on the per-round median when the floor
    ran interleaved with W1, and on the ratio of medians (as before) when it did not."""
    from benchmarks.peers import report

    floor, w1 = [4800.0, 4400.0, 3600.0], [4600.0, 3700.0, 3500.0]
    rows = report.targets(_w1_summary(w1, floor, interleaved=True))
    by_text = {t.text: t for t in rows if t.workload.startswith("W1") and "floor" in t.text}
    assert len(by_text) == 3
    issue21 = by_text[">= 0.95x W0 floor (two EVALSHA) cycles/s, same run"]
    assert issue21.figure == 4600.0 / 4800.0  # per round 0.958, 0.841, 0.972
    assert issue21.status == "met"
    assert issue21.measured == (
        "0.96x, median of 3 per-round ratios (0.96x, 0.84x, 0.97x); "
        "ratio of medians 3,700 vs floor 4,400 = 0.84x"
    )
    assert by_text[">= 0.9x W0 floor cycles/s"].status == "met"
    assert by_text[">= 1.0x W0 floor cycles/s"].status == "not met"
    assert issue21.to_json()["figure"] == issue21.figure
    lines = report.sections(_w1_summary(w1, floor, interleaved=True))
    assert any("per-round ratios (W1 repeat k / floor repeat k)" in line for line in lines)
    # W0 run on its own, in other minutes: no rounds to pair, the medians decide
    alone = report.targets(_w1_summary(w1, floor, interleaved=False))
    (separate,) = [t for t in alone if t.text.startswith(">= 0.95x W0 floor")]
    assert separate.figure == 3700.0 / 4400.0 and separate.status == "not met"
    assert separate.measured == "3,700 vs floor 4,400 = 0.84x"


class _FakeAdmin:
    """What run_group asks of the harness's connection: FLUSHALL and CLIENT LIST."""

    def flushall(self) -> None:
        pass

    def client_list(self) -> list[dict[str, str]]:
        return []


def test_w0_runs_round_by_round_beside_w1(monkeypatch: pytest.MonkeyPatch) -> None:
    """With both W0 and W1 selected, round k runs the floor and then each library (W1's
    repeat k beside the floor's repeat k); each workload keeps its own summary, and its
    values in repeat order (a failed repeat as None). Alone, each runs as before."""
    import argparse

    from benchmarks.peers import harness

    order: list[tuple[str, str, int]] = []

    def fake_worker(lib: str, workload: str, *_args: Any) -> dict[str, Any]:
        rep = sum(1 for w, name, _ in order if (w, name) == (workload, lib))
        order.append((workload, lib, rep))
        if (workload, lib, rep) == ("w1", "redis-py", 1):
            return {"ok": False, "error": "boom"}
        return {"ok": True, "metrics": {"cycles_per_s": 1000.0 * (rep + 1) + len(lib)}}

    monkeypatch.setattr(harness, "run_worker", fake_worker)
    assert harness.schedule(["w0", "w1", "w2"]) == [["w0", "w1"], ["w2"]]
    assert harness.schedule(["w1", "w2"]) == [["w1"], ["w2"]]
    assert harness.schedule(["w0"]) == [["w0"]]
    args = argparse.Namespace(repeats=2)
    runs: list[dict[str, Any]] = []
    libs = ["aiolock", "redis-py"]
    admin: Any = _FakeAdmin()
    summary = harness.run_group(args, ["w0", "w1"], libs, "quick", "redis://x", admin, None, runs)
    assert order == [
        ("w0", "floor", 0), ("w1", "aiolock", 0), ("w1", "redis-py", 0),
        ("w0", "floor", 1), ("w1", "aiolock", 1), ("w1", "redis-py", 1),
    ]  # fmt: skip
    assert [(r["workload"], r["lib"], r["repeat"]) for r in runs] == order
    assert list(summary) == ["w0", "w1"] and list(summary["w0"]) == ["floor"]
    assert summary["w0"]["floor"]["key_by_repeat"] == [1005.0, 2005.0]
    assert summary["w1"]["aiolock"]["key_by_repeat"] == [1007.0, 2007.0]
    assert summary["w1"]["redis-py"]["key_by_repeat"] == [1008.0, None]
    assert summary["w0"]["floor"]["interleaved_with"] == ["w1"]
    order.clear()
    alone = harness.run_group(args, ["w1"], libs, "quick", "redis://x", admin, None, [])
    assert [w for w, _, _ in order] == ["w1"] * 4 and "interleaved_with" not in alone["w1"][
        "aiolock"
    ]


def test_baseline_result_from_another_aiolock_is_refused(tmp_path: Path) -> None:
    """Issue 21: a baseline worker that imported any aiolock but the extracted copy (this
    checkout's, here: the directory given holds no package) is a failed run, not a row."""
    from aiolock.testing import RedisServer
    from benchmarks.peers.baseline import Baseline
    from benchmarks.peers.harness import run_worker

    fake = Baseline("HEAD", "0" * 40, tmp_path)
    with RedisServer() as server:
        result = run_worker(BASELINE, "w1", server.url, {"cycles": 20, "seconds": 0.2}, 120, fake)
    assert not result["ok"]
    assert result["error"].startswith("baseline result refused: the worker imported aiolock")
    assert result["aiolock_files"] == [str(REPO_ROOT / "aiolock" / "__init__.py")]


def test_baseline_is_extracted_once_and_removed(tmp_path: Path) -> None:
    """``extracted`` gives the revision's own package in a directory it removes at the end,
    and a reason, not an error, for a revision git does not have."""
    from benchmarks.peers.baseline import Baseline, extracted, refusal

    if not _has_commit(BASELINE_REV):
        pytest.skip("not a git checkout with the baseline revision")
    with extracted(REPO_ROOT, BASELINE_REV) as got:
        assert isinstance(got, Baseline), got
        init = got.package / "__init__.py"
        assert init.is_file() and not got.root.is_relative_to(REPO_ROOT)
        assert refusal({"aiolock_files": [str(init)]}, got) is None
        assert refusal({"aiolock_files": [str(init), str(REPO_ROOT / "aiolock/__init__.py")]}, got)
        assert refusal({}, got)
    assert not got.root.exists()
    with extracted(REPO_ROOT, "0" * 40) as missing:
        assert isinstance(missing, str) and "skipped: git does not know it" in missing
    with extracted(tmp_path, "HEAD") as outside:  # not a git checkout
        assert isinstance(outside, str) and "skipped" in outside


async def test_c3_counts_only_its_own_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 25: C3 refused to start ("1 keys named like C3's locks exist before the run")
    when aiolock's manager id, random hex, ended in "c3": the release tombstone of the
    warm-up name, ``aiolock:{c3warm}:rel:<id>:<n>``, then contains "c3:" and matched the
    pattern meant for C3's own names (one run in 256). C3's tags now hold a letter that is
    not a hex digit, so no id can spell them."""
    import secrets

    from aiolock.testing import RedisServer
    from benchmarks.common.metrics import Admin
    from benchmarks.peers.adapters import AiolockAdapter
    from benchmarks.peers.config import LEASE, PROFILES
    from benchmarks.peers.workloads import C3_REUSED_TAG, C3_TAG, c3_memory_left

    for tag in (C3_TAG, C3_REUSED_TAG):
        assert set(tag) - set("0123456789abcdef:"), f"{tag!r} can be spelled by a hex id"
    real_token_hex = secrets.token_hex
    # Every id ends in "c3", as one manager in 256 does by chance.
    monkeypatch.setattr(secrets, "token_hex", lambda n=16: real_token_hex(n)[:-2] + "c3")
    with RedisServer() as server:
        admin = Admin(server.url)
        adapter = AiolockAdapter()
        await adapter.setup(server.url, LEASE)
        try:
            result = await c3_memory_left(adapter, admin, PROFILES["quick"]["c3"])
        finally:
            await adapter.teardown()
            await admin.close()
    assert result["names"] == PROFILES["quick"]["c3"]["names"]
    assert not [shape for shape in result["key_shapes"] if "warm" in shape], result["key_shapes"]


def test_scale_benchmark_quick_run_reports_every_phase(tmp_path: Path) -> None:
    """Issue 24: ``python -m benchmarks.scale.sizes --quick`` measures waiters, holds and
    redis-py's waiters at two small sizes and writes its section with the targets (the
    structure only: timings on a shared machine say nothing here)."""
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.scale.sizes", "--quick", "--out", str(tmp_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    data = json.loads((tmp_path / "scale.json").read_text())
    assert [row["n"] for row in data["rows"]] == data["sizes"]
    assert not data["errors"] and not data["skipped"]
    for row in data["rows"]:
        waiters = row["waiters"]
        assert waiters["setup_cpu_us_per_waiter"] > 0 and waiters["wake_cpu_us_per_waiter"] > 0
        assert waiters["all_held_s"] > 0 and waiters["probe_window_s"] > 0
        assert waiters["held_before_release"] == 0
        holds = row["holds"]
        assert set(holds["by_kind"]) == {"lock", "read lock", "semaphore"}
        for kind in holds["by_kind"].values():
            assert kind["holds"] == row["n"] and kind["calls_per_round"] >= 1
            assert kind["redis_us_per_call"] > 0
        assert holds["full_round_ok"] and holds["round_trips_per_period"] >= 3
        floor = holds["renew_floor"]
        assert floor["holds"] == row["n"] and set(floor["rows"]) == set(renewal.SCRIPTS)
        assert floor["rows"]["lock"]["vs_lock"] == 1.0
        assert all(f["redis_us_per_hold"] > 0 for f in floor["rows"].values())
        assert row["peer_redis_py"]["all_held_s"] > 0
        assert row["peer_aiolock"]["waiting_cpu_us_per_waiter_s"] >= 0
    statuses = {target["status"].split(" (")[0] for target in data["targets"]}
    assert statuses <= {"met", "**not met**"} and len(data["targets"]) >= 4
    report = (tmp_path / "RESULTS.md").read_text()
    assert "<!-- scale-bench:start -->" in report and "<!-- scale-bench:end -->" in report
    assert "Scale: per-waiter and per-hold costs" in report and "redis-py" in report
