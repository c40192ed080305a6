"""The examples run end to end against the suite's server."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests._support.paths import EXAMPLES


@pytest.mark.parametrize("script", ["quickstart.py", "red_packet.py", "family.py"])
def test_example_runs(script: str, redis_url: str) -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        env={**os.environ, "REDIS_URL": redis_url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    if script == "quickstart.py":
        assert "hold count when re-entered: 2" in result.stdout
        assert "impatient task gave up" in result.stdout
    elif script == "red_packet.py":
        assert "10 users got a share" in result.stdout
    else:
        assert "printer served jobs in order: [0, 1, 2, 3, 4]" in result.stdout
        assert "0 inside during the write" in result.stdout
        assert "still hold 200 in total" in result.stdout


def test_example_starts_its_own_server_without_redis_url() -> None:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py")],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert re.search(r"started a throwaway (Redis|Valkey) [\d.]+ server \(", result.stderr)


def test_leader_example_fails_over_after_sigkill(redis_url: str) -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "leader_scheduler.py")],
        env={**os.environ, "REDIS_URL": redis_url},
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1].startswith("killed worker-")
    took = next(line for line in lines if " took over " in line)
    assert float(took.split()[3]) < 1.0 + 4  # the lease, plus slack for a loaded machine
    assert "stopped with exit code 0" in lines[-1]
