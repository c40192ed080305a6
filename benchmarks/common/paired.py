"""Ratios of two series measured round by round, side by side.

A benchmark that interleaves two subjects (A, B, A, B, ...) takes each round's pair in
the same minute of the machine's load. The median of the per-round ratios then follows
what the two do relative to each other, while the ratio of the two medians compares A's
middle round with B's middle round, which may lie minutes apart: on a machine whose load
drifts (CI runs beside the benchmark), the latter swung by more than the gaps to the
targets (issue 21's third measurement, benchmarks/NOTES.md). Targets that compare two
subjects of one run are judged on :func:`median_ratio`; :func:`ratio_of_medians` is
shown beside it.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TypeGuard

__all__ = ["median_ratio", "per_round", "ratio_of_medians", "times", "usable"]


def usable(value: object) -> TypeGuard[float]:
    """A measured figure a ratio can use: a positive finite number (a failed round: None)."""
    return (
        isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")
    )


def per_round(mine: Sequence[float | None], theirs: Sequence[float | None]) -> list[float]:
    """``mine[k] / theirs[k]`` for every round *k* where both have a figure, in round order.

    Rounds are matched by position: index *k* of each series must be the same round. A
    round missing on either side (a failed run, or a shorter series) is left out rather
    than paired with another round's figure.
    """
    return [
        float(a) / float(b) for a, b in zip(mine, theirs, strict=False) if usable(a) and usable(b)
    ]


def median_ratio(mine: Sequence[float | None], theirs: Sequence[float | None]) -> float | None:
    """The median of :func:`per_round`'s ratios; None when no round has both figures."""
    ratios = per_round(mine, theirs)
    return statistics.median(ratios) if ratios else None


def ratio_of_medians(mine: Sequence[float | None], theirs: Sequence[float | None]) -> float | None:
    """Each series' median over its own rounds, one divided by the other (None if empty)."""
    a = [float(v) for v in mine if usable(v)]
    b = [float(v) for v in theirs if usable(v)]
    if not a or not b:
        return None
    return statistics.median(a) / statistics.median(b)


def times(value: float | None) -> str:
    """A ratio as the floor benchmarks' tables print it ("1.04x"); "n/a" for None."""
    return "n/a" if value is None else f"{value:.2f}x"
