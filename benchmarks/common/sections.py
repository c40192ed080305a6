"""Sections of ``RESULTS.md`` that benchmarks other than the main harness write.

Each such benchmark owns the text between its two markers; the main harness
(:mod:`benchmarks.peers.report`) rewrites the rest of the file and keeps every marked section,
so one file holds all the figures without any tool erasing another's.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["MARKERS", "kept_sections", "write_section"]

#: (start, end) markers of each benchmark's section, by benchmark.
MARKERS = {
    "service": ("<!-- service-bench:start -->", "<!-- service-bench:end -->"),
    "redlock": ("<!-- redlock-bench:start -->", "<!-- redlock-bench:end -->"),
    "cluster": ("<!-- cluster-bench:start -->", "<!-- cluster-bench:end -->"),
    "script-floor": ("<!-- script-floor:start -->", "<!-- script-floor:end -->"),
    "client-floor": ("<!-- client-floor:start -->", "<!-- client-floor:end -->"),
    "scale": ("<!-- scale-bench:start -->", "<!-- scale-bench:end -->"),
    "w1-gap": ("<!-- w1-gap:start -->", "<!-- w1-gap:end -->"),
    # Written by hand from what the failover tests print (tests/unit/_redis/test_cluster.py,
    # tests/unit/_redis/test_sentinel.py): kept like the others.
    "failover": ("<!-- failover:start -->", "<!-- failover:end -->"),
}


def write_section(path: Path, bench: str, section: str) -> None:
    """Put *section* between *bench*'s markers in *path*, appending them if absent."""
    start_mark, end_mark = MARKERS[bench]
    block = f"{start_mark}\n{section}\n{end_mark}"
    text = path.read_text() if path.exists() else ""
    start, end = text.find(start_mark), text.find(end_mark)
    if start != -1 and end > start:
        text = text[:start] + block + text[end + len(end_mark) :]
    else:
        text = (text.rstrip("\n") + "\n\n" if text else "") + block + "\n"
    path.write_text(text)


def kept_sections(path: Path) -> str:
    """The marked sections of the RESULTS.md being replaced, to append to the new one."""
    if not path.exists():
        return ""
    old = path.read_text()
    kept = ""
    for start_mark, end_mark in MARKERS.values():
        start, end = old.find(start_mark), old.find(end_mark)
        if start != -1 and end > start:
            kept += "\n" + old[start : end + len(end_mark)] + "\n"
    return kept
