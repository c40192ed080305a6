"""The documentation: its programs run as written, and the site builds in strict mode.

Every ``python`` block of the pages in ``RUNNABLE`` is a complete program; each is run in a
process of its own against a redis-server this module starts, and its output is compared
with the ``text title="Output"`` block under it (``<n>`` stands for a number). A python
block marked ``{.no-run}`` (```` ```python {.no-run title="..."} ````) is shown but not run:
the code of another library that the test environment does not install. A block marked
``{.fragment title="..."}`` is a part of a program, titled to say where it goes; a page
with fragments has complete programs too. The site
itself is built by ``mkdocs build --strict`` in CI (.ci/run); the test here builds it too
when mkdocs is installed (the ``docs`` extra), so a broken link fails the suite locally.
"""

from __future__ import annotations

import contextlib
import html as html_text
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from aiolock.testing import RedisServer
from tests._support.paths import REPO_ROOT

#: pages whose every python block is a complete program, with its output under it
RUNNABLE = (
    "getting-started.md",
    "recipes/workers.md",
    "recipes/handoff.md",
    "leader-election.md",
    "migrating/redis-py.md",
    "migrating/python-redis-lock.md",
    "migrating/pottery.md",
    "migrating/redisson.md",
    "semaphore.md",
    "rw-lock.md",
    "multi-lock.md",
    "fair-lock.md",
    "redlock.md",
    "observability.md",
)
_FENCE = re.compile(r"^```(?P<lang>\w*)(?P<attrs>[^\n]*)\n(?P<body>.*?)^```\s*$", re.M | re.S)


def _examples(page: str) -> list[tuple[str, str, str | None]]:
    """(where, program, expected output or None) for each python block of *page*."""
    text = (REPO_ROOT / "docs" / page).read_text("utf-8")
    found: list[tuple[str, str, str | None]] = []
    for match in _FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        if match["lang"] == "python" and not {".no-run", ".fragment"} & set(
            match["attrs"].strip(" {}").split()
        ):
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


def test_blocks_marked_no_run_are_shown_but_not_run() -> None:
    """Another library's program (not installed here) is marked ``{.no-run}``; the
    aiolock programs of the same page still run."""
    page = "migrating/python-redis-lock.md"
    assert "```python {.no-run" in (REPO_ROOT / "docs" / page).read_text("utf-8")
    programs = [program for _, program, _ in _examples(page)]
    assert programs
    assert not any("import redis_lock" in program for program in programs)
    assert all("import aiolock" in program for program in programs)


@pytest.fixture(scope="module")
def docs_redis_url() -> Iterator[str]:
    """A server of this module's own: the programs use the page's fixed prefix."""
    with RedisServer() as server:
        yield server.url


@pytest.fixture(scope="module")
def docs_redlock_urls() -> Iterator[str]:
    """Three servers of this module's own, as ``$REDLOCK_URLS``: the Redlock programs'
    masters."""
    with contextlib.ExitStack() as stack:
        yield ",".join(stack.enter_context(RedisServer()).url for _ in range(3))


@pytest.mark.parametrize(
    ("where", "program", "expected"), EXAMPLES, ids=[where for where, _, _ in EXAMPLES]
)
def test_example_runs_and_prints_its_output(
    where: str, program: str, expected: str | None, docs_redis_url: str, docs_redlock_urls: str
) -> None:
    env = {"REDIS_URL": docs_redis_url, "REDLOCK_URLS": docs_redlock_urls}
    result = subprocess.run(
        [sys.executable, "-c", program],
        env={**os.environ, **env, "PYTHONPATH": str(REPO_ROOT)},
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
        cwd=REPO_ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    reference = tmp_path / "site" / "reference" / "index.html"
    assert reference.is_file()
    assert (tmp_path / "site" / "benchmarks" / "throughput.png").is_file()
    # Signatures are wrapped, one parameter per line (issue 37: LockManager's was one
    # line, cut off at 1,280 px): no line of a signature block is longer than 80.
    html = reference.read_text("utf-8")
    blocks = re.findall(r'<div class="doc-signature[^"]*">(.*?)</div>', html, re.S)
    assert blocks, "no signature blocks on the reference page"
    text = [html_text.unescape(re.sub(r"<[^>]+>", "", block)) for block in blocks]
    longest = max(len(line) for block in text for line in block.splitlines())
    assert longest <= 90, f"a signature line of {longest} characters: not wrapped"


#: What ships, by the words a page would use for it. A page may describe a limit of one
#: of these, but must never call the feature itself missing (issue 18: four pages said
#: Redis Cluster was not supported, and one that Sentinel and Cluster were planned, after
#: both had shipped).
SHIPPED = {
    "Redis Cluster": r"\bcluster\b",
    "Sentinel": r"\bsentinel\b",
    "Redlock": r"\bredlock\b",
    "replica acknowledgement": r"\breplicas=|\breplica acknowledge?ment",
    "fair lock": r"\bfair[ -_]lock",
    "read-write lock": r"\bread-write lock|\brw_lock",
    "semaphore": r"\bsemaphore",
    "multi-lock": r"\bmulti[-_]lock",
    "fencing tokens": r"\bfencing tokens?\b",
    "wire formats": r"\bwire formats?\b",
    "integrations": r"\b(?:fastapi|aiohttp|taskiq|arq|opentelemetry|prometheus)\b",
}
#: Words that say something does not exist (yet).
MISSING = re.compile(
    r"not (?:yet )?supported|\bunsupported\b|\bplanned\b|\bnot yet\b|\bin (?:the|a) future\b"
    r"|\bfuture (?:release|version)|\bwill (?:be )?(?:supported|added|support|add)\b"
    r"|\bcoming soon\b|\bone Redis deployment\b|\bonly one Redis\b"
    r"|\bnot (?:yet )?(?:available|implemented)\b|\bno support\b|\bdo(?:es)? not support\b"
    r"|\bdoesn't support\b",
    re.I,
)
#: (page, a fragment of the sentence): sentences that match but state a true limit.
TRUE_LIMITS: list[tuple[str, str]] = []


def _sentences(text: str) -> Iterator[str]:
    """The prose of a page, a sentence (or a table cell) at a time; code is left out."""
    text = re.sub(r"^```.*?^```\s*$", "", text, flags=re.M | re.S)
    for block in re.split(r"\n\s*\n|\n(?=\s*[-*|#] )|\n(?=\s*\d+\. )", text):
        paragraph = " ".join(block.split())
        cells = paragraph.split(" | ") if paragraph.startswith("|") else [paragraph]
        for cell in cells:
            yield from re.split(r"(?<=[.;!?])\s+(?=[A-Z`*(\[])", cell)


def _called_missing(sentence: str) -> list[str]:
    """The shipped features *sentence* calls missing (none if it says nothing missing)."""
    if not MISSING.search(sentence):
        return []
    return [name for name, words in SHIPPED.items() if re.search(words, sentence, re.I)]


def test_the_check_for_missing_features_finds_what_the_pages_used_to_say() -> None:
    for said in (
        "- Redis Cluster is not supported yet (the keys of one fair lock share one slot already).",
        "Sentinel and Redis Cluster support, with an option to wait for replica "
        "acknowledgement, are planned.",
        "but Cluster and Sentinel clients are not supported yet",
        "- **pottery's Redlock** spreads a lock over several masters. aiolock uses one Redis "
        "deployment; see semantics for replication.",
    ):
        assert _called_missing(next(_sentences(said))), said
    assert not _called_missing("Every lock kind works on a Redis Cluster.")
    assert not _called_missing("A forced release is not yet known to the holder.")


def test_no_page_calls_a_shipped_feature_missing() -> None:
    pages = [*sorted((REPO_ROOT / "docs").rglob("*.md")), REPO_ROOT / "README.md"]
    found = []
    for page in pages:
        where = str(page.relative_to(REPO_ROOT))
        for sentence in _sentences(page.read_text("utf-8")):
            features = _called_missing(sentence)
            allowed = any(p == where and part in sentence for p, part in TRUE_LIMITS)
            if features and not allowed:
                found.append(f"{where}: {', '.join(features)}: {sentence}")
    assert not found, "pages calling a shipped feature missing:\n" + "\n".join(found)


def test_the_comparison_pages_tests_exist() -> None:
    """docs/comparison.md names the test behind each answer to the peers' users: every
    one must exist (a renamed or deleted test would leave the page citing nothing)."""
    text = (REPO_ROOT / "docs" / "comparison.md").read_text("utf-8")
    cited = re.findall(r"`((?:[\w/]+\.py)?)(?:::(\w+))?`", text)
    checked = 0
    path = ""
    for file, name in cited:
        if not file and not name:
            continue
        if file:
            path = file
            assert (REPO_ROOT / "tests" / path).is_file(), f"tests/{path} does not exist"
        if name:
            source = (REPO_ROOT / "tests" / path).read_text("utf-8")
            assert re.search(rf"def {name}\(", source), f"tests/{path} has no {name}"
        checked += 1
    assert checked >= 15
