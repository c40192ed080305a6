"""RESULTS.md sections: each benchmark rewrites its own, the main harness keeps them all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.common.sections import MARKERS, kept_sections, write_section
from tests._support.paths import REPO_ROOT


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
    results = REPO_ROOT / "benchmarks" / "results" / "RESULTS.md"
    kept = kept_sections(results)
    for start, end in MARKERS.values():
        assert kept.count(start) == 1 and kept.count(end) == 1, start


def test_script_cycle_time_runs_every_pair_and_writes_its_section(tmp_path: Path) -> None:
    """A short run of the script-floor benchmark: every pair acquires and releases each
    cycle (the benchmark raises otherwise), and the ratios are against redis-py's row;
    the family's rows, the pipelined rows (every reply checked) and issue 21's target
    rows are there (structure only: a run this short says nothing about the figures)."""
    from benchmarks.scripts import cycle_time, pairs
    from benchmarks.scripts import family as family_rows

    argv = ["--cycles", "20", "--repeats", "1", "--pipe-cycles", "20", "--out", str(tmp_path)]
    assert cycle_time.main(argv) == 0
    result = json.loads((tmp_path / "script_floor.json").read_text())
    rows = {row["pair"]: row for row in result["rows"]}
    assert list(rows) == [pair.name for pair in pairs.pairs()]
    assert rows["redis-py's Lock"]["vs_redis_py"] == 1.0
    assert all(row["server_us_per_cycle"] > 0 for row in rows.values())
    family = {row["kind"]: row for row in result["family"]}
    assert list(family) == list(family_rows.KINDS)
    assert family[family_rows.LOCK]["vs_lock"] == 1.0
    # the client sent the acquire and the release, nothing else (a renewal could add one)
    assert all(2 <= row["script_calls_per_cycle"] < 2.5 for row in family.values())
    # what the scripts ran, by name (Redis counts each redis.call under its own name)
    assert all(row["redis_calls_per_cycle"] > 0 for row in family.values())
    assert "evalsha" not in family[family_rows.LOCK]["redis_calls_by_name"]
    piped = {row["pair"]: row for row in result["pipelined"]}
    assert list(piped) == list(pairs.PIPED)
    assert all(row["error_replies"] == row["wrong_replies"] == 0 for row in piped.values())
    assert piped[pairs.AIOLOCK_V0]["vs_frozen"] == 1.0
    assert piped[pairs.AIOLOCK_V0]["vs_frozen_paired"] == 1.0
    assert all(len(row["cycles_per_s_by_round"]) == 1 for row in piped.values())
    # the pipelined target: one round, so its per-round median is the medians' ratio
    shipped = piped[pairs.AIOLOCK]
    pipe_target = result["targets"][2]
    assert pipe_target["per_round"] == [shipped["vs_frozen_paired"]] == [shipped["vs_frozen"]]
    assert pipe_target["measured"] == pipe_target["ratio_of_medians"] == shipped["vs_frozen"]
    targets = [row["target"] for row in result["targets"]]
    assert len(targets) == 3 + len(family_rows.KINDS) - 1
    assert all(row["met"] in (True, False) for row in result["targets"])
    text = (tmp_path / "RESULTS.md").read_text()
    assert MARKERS["script-floor"][0] in text
    for heading in ("The lock family", "Fully pipelined", "Issue 21's targets"):
        assert heading in text
    assert all(target in text for target in targets)


def test_script_cycle_time_targets_say_not_met_failed_and_see_notes() -> None:
    """The target rows: a ratio over its limit is not met (a family kind's points to
    NOTES.md), and a pipelined run with bad replies fails its row instead of judging it."""
    from benchmarks.scripts import cycle_time as sf
    from benchmarks.scripts import pairs

    rows = [
        {"pair": pairs.REDIS_PY, "server_us_per_cycle": 5.0},
        {"pair": pairs.AIOLOCK_V0, "server_us_per_cycle": 50.0},
        {"pair": pairs.AIOLOCK, "server_us_per_cycle": 30.0},
    ]
    family = [
        {"kind": "lock", "vs_lock": 1.0},
        {"kind": "fair lock", "vs_lock": 1.4},
        {"kind": "semaphore, one permit", "vs_lock": 2.0},
    ]
    # The pipelined rounds: the third ran slow for the frozen pair's neighbours too; the
    # ratio of medians (100 / 80) pairs the shipped pair's third round with the frozen
    # pair's first, the per-round ratios are 1.60x, 1.58x, 1.25x.
    frozen_rounds, shipped_rounds = [80.0, 60.0, 100.0], [128.0, 95.0, 125.0]
    piped = [
        {"pair": pairs.AIOLOCK_V0, "vs_frozen": 1.0, "cycles_per_s_by_round": frozen_rounds},
        {"pair": pairs.AIOLOCK, "vs_frozen": 125.0 / 80.0, "cycles_per_s_by_round": shipped_rounds},
    ]
    for one in piped:
        one.update(error_replies=0, wrong_replies=0)
    result = {"rows": rows, "family": family, "pipelined": piped}
    met = [row["met"] for row in sf.targets(result)]
    # 0.60x the frozen pair, 6.0x redis-py's, 1.58x pipelined, fair 1.4x, semaphore 2.0x
    assert met == [True, False, True, True, False]
    pipe = sf.targets(result)[2]
    assert pipe["measured"] == 95.0 / 60.0 and pipe["per_round"] == [1.6, 95.0 / 60.0, 1.25]
    assert pipe["ratio_of_medians"] == 125.0 / 80.0
    text = "\n".join(sf._render_targets({**result, "targets": sf.targets(result)}))
    row = "| semaphore, one permit: script time <= 1.5x the lock's | 2.00x |"
    assert f"{row} **not met** (see NOTES.md) |" in text
    assert (
        "| 1.58x, median of per-round ratios (1.60x, 1.58x, 1.25x); ratio of medians 1.56x | met |"
    ) in text
    # and the other way: per round 1.88x, 1.48x, 1.40x, not met, though the medians
    # (140 / 80, the shipped pair's third round against the frozen pair's first) read 1.75x
    piped[1]["cycles_per_s_by_round"] = [150.0, 89.0, 140.0]
    piped[1]["vs_frozen"] = 140.0 / 80.0
    pipe = sf.targets(result)[2]
    assert pipe["measured"] == 89.0 / 60.0 and pipe["met"] is False
    piped[1]["error_replies"] = 1
    failed = sf.targets(result)[2]
    assert failed["measured"] is None and failed["met"] is None
    assert "**failed run**" in "\n".join(
        sf._render_targets({**result, "targets": sf.targets(result)})
    )


def test_a_pipelined_run_counts_error_and_wrong_replies() -> None:
    """Every pipelined reply is checked: an error reply and a release that did not
    release are each counted, and the row names the first."""
    from benchmarks.scripts import pipelined
    from benchmarks.scripts.pairs import Pair

    def release_input(i: int) -> tuple[list[str], list[str]]:
        return ["sp:{lock}"], [str(i)]

    pair = Pair(
        "faulty",
        "return 1",
        # cycle 0: an error reply; cycle 1: 'not released'; the others (and the first
        # cycle, -1, sent one command at a time) release
        "if ARGV[1] == '0' then return redis.error_reply('boom') end\n"
        "if ARGV[1] == '1' then return 0 end\nreturn 1",
        lambda i: (["sp:{lock}"], [str(i)]),
        release_input,
    )
    row = pipelined.measure(pair, 5)
    assert (row["error_replies"], row["wrong_replies"]) == (1, 1)
    assert row["first_bad"].startswith("cycle 0: ERR boom")


def test_client_layers_runs_every_client_and_writes_its_section(tmp_path: Path) -> None:
    """A short run of the client-floor benchmark: every client completes its cycles (each
    checks that its acquire was granted and its release released), ratios against the
    minimal client and redis-py's Lock."""
    from benchmarks.client import layers

    argv = ["--seconds", "0.2", "--repeats", "1", "--tasks", "4", "--out", str(tmp_path)]
    assert layers.main(argv) == 0
    result = json.loads((tmp_path / "client_floor.json").read_text())
    rows = {row["client"]: row for row in result["rows"]}
    assert list(rows) == list(layers.ROWS)
    assert rows["minimal batching client"]["cpu_vs_minimal"] == 1.0
    assert rows["redis-py's Lock"]["rate_vs_redis_py"] == 1.0
    assert all(row["cycles_per_s"] > 0 and row["cpu_us_per_cycle"] > 0 for row in rows.values())
    text = (tmp_path / "RESULTS.md").read_text()
    assert MARKERS["client-floor"][0] in text
    # issue 21's target 2 (client CPU), judged on the LockManager's row: one round, so its
    # per-round median is the medians' ratio
    (target,) = result["targets"]
    manager = rows["aiolock's LockManager"]
    assert target["measured"] == manager["cpu_vs_minimal_paired"] == manager["cpu_vs_minimal"]
    assert target["per_round"] == [target["measured"]] and len(manager["cpu_by_round"]) == 1
    assert target["ratio_of_medians"] == manager["cpu_vs_minimal"]
    assert f"| {layers.TARGET} |" in text


def test_client_layers_target_is_judged_on_the_per_round_ratios() -> None:
    """Target 2: the minimal client's CPU per cycle swung between rounds (18-22 us) and
    the LockManager's with it; the ratio of medians (41 / 20 us: other rounds) reads
    2.05x, the per-round ratios 1.89x, 1.95x, 2.05x. The target is judged on their
    median and the render shows both."""
    from benchmarks.client import layers

    minimal, manager = [18.0, 22.0, 20.0], [34.0, 43.0, 41.0]
    samples = {name: [(1000.0, 10.0)] * 3 for name in layers.ROWS}
    samples[layers.ROWS[0]] = [(1000.0, cpu) for cpu in minimal]
    samples[layers.MANAGER] = [(500.0, cpu) for cpu in manager]
    result = layers.summarize(samples, 64, 2.0, 3)
    (target,) = result["targets"]
    assert target["per_round"] == [34.0 / 18.0, 43.0 / 22.0, 41.0 / 20.0]
    assert target["measured"] == 43.0 / 22.0 and target["met"] is True
    assert target["ratio_of_medians"] == 41.0 / 20.0
    rows = {row["client"]: row for row in result["rows"]}
    assert rows[layers.MANAGER]["cpu_vs_minimal_paired"] == 43.0 / 22.0
    assert rows[layers.MANAGER]["cpu_by_round"] == manager
    text = layers.render(result)
    assert f"| {layers.TARGET} | 1.95x (1.89x, 1.95x, 2.05x) | 2.05x | met |" in text


def test_the_benchmarks_count_aiolocks_own_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """aiolock writes to redis-py's connections itself: the round-trip counters must wrap
    that write where it lives, or every aiolock row would count nothing (a module move
    once made the patch skip silently)."""
    from aiolock._redis import transport
    from benchmarks.common import metrics

    monkeypatch.setattr(transport, "write", transport.write)  # restored after the test
    monkeypatch.setattr(transport, "_bench_patched", False, raising=False)
    original = transport.write
    metrics.install_client_counters()
    assert transport.write is not original
    assert getattr(transport, "_bench_patched", False) is True


def test_client_instructions_children_run_each_client() -> None:
    """The measured child of ``benchmarks.client.instructions`` (run here without
    valgrind): each client makes the given number of cycles, spread over the tasks, each
    checked granted and released; bad cycle counts are refused before valgrind runs."""
    from aiolock.testing import RedisServer
    from benchmarks.client import instructions

    with RedisServer() as server:
        for client in instructions.CLIENTS:
            argv = ["--child", client, "--port", str(server.port), "--tasks", "4"]
            assert instructions.main([*argv, "--cycles", "8"]) == 0
    for cycles in ("1920", "5760,1920", "100,200"):
        with pytest.raises(SystemExit):
            instructions.main(["--cycles", cycles])


def test_client_sequential_runs_every_client_and_writes_its_section(tmp_path: Path) -> None:
    """A short run of the W1-gap benchmark: every client completes its cycles (the
    replay and the LockManager check each grant and release), the floor's row is 1.0x
    itself (structure only: a run this short says nothing about the figures)."""
    from benchmarks.client import sequential

    assert sequential.main(["--cycles", "30", "--repeats", "1", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "w1_gap.json").read_text())
    rows = {row["client"]: row for row in result["rows"]}
    assert list(rows) == list(sequential.ROWS)
    assert rows[sequential.FLOOR]["vs_floor_paired"] == 1.0
    assert all(row["cycles_per_s"] > 0 and row["cpu_us_per_cycle"] > 0 for row in rows.values())
    # (Redis's time per cycle is a figure, not compared here: under CI's load one
    # preempted command made 30 cycles of `return 1` read 231 us each.)
    assert all(row["server_us_per_cycle"] >= 0 for row in rows.values())
    assert [len(row["per_round"]) for row in result["comparisons"]] == [1, 1, 1]
    text = (tmp_path / "RESULTS.md").read_text()
    assert MARKERS["w1-gap"][0] in text
    assert all(f"| {name} |" in text for name in sequential.ROWS)


def test_client_sequential_ratios_are_per_round() -> None:
    """x floor is the median of each round's ratio, not the ratio of the medians: round
    2's floor was slow, and its replay with it."""
    from benchmarks.client import sequential

    floor, replay = [1000.0, 500.0, 900.0], [900.0, 450.0, 720.0]
    samples = {name: [(800.0, 10.0, 5.0)] * 3 for name in sequential.ROWS}
    samples[sequential.FLOOR] = [(rate, 10.0, 2.0) for rate in floor]
    samples[sequential.REPLAY] = [(rate, 10.0, 20.0) for rate in replay]
    result = sequential.summarize(samples, 100, 3)
    rows = {row["client"]: row for row in result["rows"]}
    assert rows[sequential.REPLAY]["vs_floor_per_round"] == [0.9, 0.9, 0.8]
    assert rows[sequential.REPLAY]["vs_floor_paired"] == 0.9
    assert rows[sequential.REPLAY]["vs_floor"] == 720.0 / 900.0
    assert rows[sequential.REPLAY]["server_us_per_cycle"] == 20.0
    # the LockManager (800 every round) beside the floor's client sending the same scripts
    assert result["comparisons"][2]["per_round"] == [800.0 / 900.0, 800.0 / 450.0, 800.0 / 720.0]
    assert "0.90x (0.90x, 0.90x, 0.80x)" in sequential.render(result)
