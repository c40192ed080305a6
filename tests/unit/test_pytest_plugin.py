"""The pytest plugin: a user's test file that uses the aiolock_* fixtures passes.

Each case runs pytest in a subprocess (``pytester.runpytest_subprocess``), as a user's
project would, with pytest-asyncio in strict or auto mode. Once aiolock is installed the
plugin is loaded from its ``pytest11`` entry point; in a checkout that has not been
reinstalled since the entry point was added it is named with ``-p`` instead.
"""

from __future__ import annotations

import socket
import sys
from importlib.metadata import entry_points
from urllib.parse import urlparse

import pytest

from tests._support.paths import REPO_ROOT

pytest_plugins = ["pytester"]


INI = "[pytest]\nasyncio_mode = {mode}\nasyncio_default_fixture_loop_scope = function\n"

USER_TESTS = """
import os
import pytest
import aiolock

# The project's own fixtures of the names this repository's suite uses: no clash.
@pytest.fixture
def redis_url():
    return "not-a-url"

@pytest.fixture
def locks():
    return "the project's own"

{marker}
async def test_the_manager_is_open_and_uses_the_prefix(aiolock_manager, aiolock_prefix, locks):
    assert locks == "the project's own"
    assert aiolock_manager.is_open and aiolock_manager.prefix == aiolock_prefix
    async with aiolock_manager.lock("report") as lock:
        assert lock.key == aiolock_prefix + ":lock:{{report}}"
        assert await lock.locked()
    assert not await aiolock_manager.lock("report").locked()

{marker}
async def test_two_managers_on_one_url_exclude_each_other(aiolock_manager, aiolock_redis_url,
                                                          aiolock_prefix):
    async with aiolock.LockManager.from_url(aiolock_redis_url, prefix=aiolock_prefix) as other:
        async with aiolock_manager.lock("x"):
            assert not await other.lock("x").try_acquire()

def test_the_url_is_recorded(aiolock_redis_url, redis_url):
    assert redis_url == "not-a-url"
    with open(os.environ["URL_OUT"], "w") as out:
        out.write(aiolock_redis_url)
"""


def _plugin_args() -> list[str]:
    installed = any(
        ep.name == "aiolock" and ep.value == "aiolock.pytest_plugin"
        for ep in entry_points(group="pytest11")
    )
    return [] if installed else ["-p", "aiolock.pytest_plugin"]


def _run(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, str]:
    """Run the user's tests; return the result and the URL the fixture gave them."""
    out = pytester.path / "url.txt"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("URL_OUT", str(out))
        result = pytester.runpytest_subprocess(
            *_plugin_args(), "-p", "no:cacheprovider", *args, timeout=60
        )
    return result, out.read_text() if out.exists() else ""


def _answers(url: str) -> bool:
    parsed = urlparse(url)
    try:
        with socket.create_connection((parsed.hostname, parsed.port or 6379), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.mark.processes
def test_strict_mode_with_a_given_server(
    pytester: pytest.Pytester, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIOLOCK_REDIS_URL", redis_url)
    pytester.makeini(
        "[pytest]\nasyncio_mode = strict\nasyncio_default_fixture_loop_scope = function\n"
    )
    pytester.makepyfile(test_user=USER_TESTS.format(marker="@pytest.mark.asyncio"))
    result, url = _run(pytester)
    result.assert_outcomes(passed=3)
    assert url == redis_url


@pytest.mark.processes
def test_auto_mode_starts_and_stops_a_throwaway_server(
    pytester: pytest.Pytester, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AIOLOCK_REDIS_URL", raising=False)
    pytester.makeini(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
    )
    pytester.makepyfile(test_user=USER_TESTS.format(marker=""))
    result, url = _run(pytester)
    result.assert_outcomes(passed=3)
    assert url.startswith("redis://127.0.0.1:") and url != redis_url
    assert not _answers(url)  # stopped at the end of the session


@pytest.mark.processes
def test_the_command_line_option_wins_over_the_environment(
    pytester: pytest.Pytester, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIOLOCK_REDIS_URL", "redis://127.0.0.1:1/0")
    pytester.makeini(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
    )
    pytester.makepyfile(test_user=USER_TESTS.format(marker=""))
    result, url = _run(pytester, "--aiolock-redis-url", redis_url)
    result.assert_outcomes(passed=3)
    assert url == redis_url


def test_the_entry_point_is_declared() -> None:
    text = (REPO_ROOT / "pyproject.toml").read_text("utf-8")
    section = text.split("[project.entry-points.pytest11]", 1)[1].split("\n[", 1)[0]
    assert 'aiolock = "aiolock.pytest_plugin"' in section
    __import__("aiolock.pytest_plugin")
    assert "aiolock.pytest_plugin" in sys.modules
