"""The task-queue examples run end to end: a real arq worker and a taskiq broker, real Redis."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests._support.paths import EXAMPLES


def _run(script: str, redis_url: str) -> str:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        env={**os.environ, "REDIS_URL": redis_url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("script", ["arq_singleton.py", "taskiq_singleton.py"])
def test_one_job_per_resource_at_a_time(script: str, redis_url: str) -> None:
    if script.startswith("arq"):
        # Every arq release pins redis < 6: .ci/run installs it in its lowest-versions
        # environment (redis 5.3) and runs this there.
        pytest.importorskip("arq")
    out = _run(script, redis_url)
    kind = "jobs" if script.startswith("arq") else "tasks"
    # Duplicates skipped: one report ran, two were told who held the lock.
    assert f"report {kind}: 1 ran, 2 skipped; at most 1 at once" in out
    assert len(re.findall(r"skipped: report:42 is held by job \S+ on \S+ \(pid \d+\)", out)) == 2
    # Duplicates deferred: all three syncs ran, one after another, after deferrals.
    assert re.search(rf"sync {kind}: 3 ran(, [1-9]\d* deferrals)?; at most 1 at once", out)
    tries = sorted(int(n) for n in re.findall(r"synced acme on try (\d+)", out))
    assert len(tries) == 3 and tries[0] == 1 and tries[1] > 1, out
