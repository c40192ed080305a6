"""The documentation: its programs run as written, and the site builds in strict mode.

Every ``python`` block of the pages in ``RUNNABLE`` is a complete program; each is run in a
process of its own against a redis-server this module starts, and its output is compared
with the ``text title="Output"`` block under it (``<n>`` stands for a number). The site
itself is built by ``mkdocs build --strict`` in CI (.ci/run); the test here builds it too
when mkdocs is installed (the ``docs`` extra), so a broken link fails the suite locally.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from aiolock.testing import RedisServer

ROOT = Path(__file__).resolve().parent.parent
#: pages whose every python block is a complete program, with its output under it
RUNNABLE = ("getting-started.md", "recipes/workers.md")
_FENCE = re.compile(r"^```(?P<lang>\w*)(?P<attrs>[^\n]*)\n(?P<body>.*?)^```\s*$", re.M | re.S)


def _examples(page: str) -> list[tuple[str, str, str | None]]:
    """(where, program, expected output or None) for each python block of *page*."""
    text = (ROOT / "docs" / page).read_text("utf-8")
    found: list[tuple[str, str, str | None]] = []
    for match in _FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        if match["lang"] == "python":
            found.append((f"docs/{page}:{line}", match["body"], None))
        elif match["lang"] == "text" and 'title="Output"' in match["attrs"]:
            assert found and found[-1][2] is None, f"line {line}: an Output block with no program"
            found[-1] = (found[-1][0], found[-1][1], match["body"])
    return found


def _pattern(expected: str) -> re.Pattern[str]:
    return re.compile(r"\n".join(re.escape(x).replace("<n>", r"\d+") for x in expected.split("\n")))


EXAMPLES = [example for page in RUNNABLE for example in _examples(page)]


def test_every_example_shows_its_output() -> None:
    assert len(EXAMPLES) >= 10
    assert all(expected is not None for _, _, expected in EXAMPLES), [
        where for where, _, expected in EXAMPLES if expected is None
    ]


@pytest.fixture(scope="module")
def docs_redis_url() -> Iterator[str]:
    """A server of this module's own: the programs use the page's fixed prefix."""
    with RedisServer() as server:
        yield server.url


@pytest.mark.parametrize(
    ("where", "program", "expected"), EXAMPLES, ids=[where for where, _, _ in EXAMPLES]
)
def test_example_runs_and_prints_its_output(
    where: str, program: str, expected: str | None, docs_redis_url: str
) -> None:
    result = subprocess.run(
        [sys.executable, "-c", program],
        env={**os.environ, "REDIS_URL": docs_redis_url, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"{where}\n{result.stderr}"
    assert expected is not None
    assert _pattern(expected.rstrip("\n")).fullmatch(result.stdout.rstrip("\n")), (
        f"{where} printed:\n{result.stdout}\nexpected:\n{expected}"
    )


def test_the_site_builds_strict(tmp_path: Path) -> None:
    """The same build as CI's: every warning (a broken link or anchor) is an error."""
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None:
        pytest.skip('mkdocs is not installed (pip install -e ".[docs]")')
    result = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "site" / "reference" / "index.html").is_file()
    assert (tmp_path / "site" / "benchmarks" / "throughput.png").is_file()
