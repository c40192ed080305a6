"""The plain lock's starvation bound as docs/semantics.md states it ("The bound"), from the
engine's constants: the stress test and the robustness suite's checker hold runs to it."""

from __future__ import annotations

from aiolock._engine.release import MAX_LOCAL_STREAK
from aiolock._engine.turns import STARVE_AFTER


def grants_bound(managers: int) -> int:
    """Grants to other managers one waiting manager sees before it is served, counted from
    when it listens for the lock's releases: the runs it loses before it asks for a turn
    (a run: a grant and the local hand-overs that may follow it while the waiter is not
    yet queued in Redis), the run it finds when it asks, and one grant to each manager
    whose turn is ahead of its own."""
    run = 1 + MAX_LOCAL_STREAK
    return STARVE_AFTER * run + run + (managers - 2)
