"""The baseline library: aiolock at an older revision, run side by side with this one.

``python -m benchmarks --baseline REV`` extracts that revision's ``aiolock/`` package with
``git archive`` into a temporary directory, once per run, and runs the aiolock adapter in
worker processes that find that copy first (as the library ``aiolock-pre21``). Without
git, outside a git checkout (a source tarball) or without the revision, the baseline is
skipped and the report says why. A worker's result names the ``aiolock`` files it imported;
:func:`refusal` rejects a baseline result that did not run the extracted copy.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Baseline:
    """An extracted revision: *root* holds its ``aiolock/`` package."""

    rev: str
    commit: str
    root: Path

    @property
    def package(self) -> Path:
        return self.root / "aiolock"

    def label(self) -> str:
        return f"{self.rev[:12]} (commit {self.commit[:12]}, extracted with git archive)"

    def worker_env(self, repo: Path) -> tuple[Path, dict[str, str]]:
        """The working directory and environment of a worker running the baseline.

        ``python -m`` puts its working directory first on ``sys.path``, so the worker runs
        in *root* (which holds nothing but ``aiolock/``); ``PYTHONPATH`` then gives *root*
        again and *repo* for the ``benchmarks`` package, ahead of site-packages (where an
        installed or editable ``aiolock`` would be found).
        """
        paths = [str(self.root), str(repo)]
        if os.environ.get("PYTHONPATH"):
            paths.append(os.environ["PYTHONPATH"])
        return self.root, {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    git = shutil.which("git")
    if git is None:
        raise LookupError("git is not installed")
    return subprocess.run(
        [git, "-C", str(repo), *args], capture_output=True, timeout=60, check=False
    )


@contextmanager
def extracted(repo: Path, rev: str) -> Iterator[Baseline | str]:
    """The revision *rev* of *repo*'s ``aiolock/`` in a temporary directory (removed on
    exit), or, when it cannot be had, the reason as a string."""
    try:
        found = _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except (LookupError, OSError, subprocess.TimeoutExpired) as exc:
        yield f"Baseline {rev} skipped: {exc}"
        return
    if found.returncode != 0:
        yield (
            f"Baseline {rev} skipped: git does not know it in {repo} (not a git checkout, "
            "e.g. a source tarball, or a clone without that commit)"
        )
        return
    commit = found.stdout.decode().strip()
    archive = _git(repo, "archive", "--format=tar", commit, "aiolock")
    if archive.returncode != 0:
        reason = archive.stderr.decode(errors="replace").strip()
        yield f"Baseline {rev} skipped: git archive failed: {reason}"
        return
    root = Path(tempfile.mkdtemp(prefix="aiolock-baseline-"))
    try:
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            # The "data" filter (no links out, no devices) where this Python has it.
            if hasattr(tarfile, "data_filter"):
                tar.extractall(root, filter="data")
            else:  # pragma: no cover - Pythons before the filters (3.10.11 and older)
                tar.extractall(root)  # our own repository's archive
        if not (root / "aiolock" / "__init__.py").is_file():
            yield f"Baseline {rev} skipped: it has no aiolock/__init__.py"
            return
        yield Baseline(rev, commit, root.resolve())
    finally:
        shutil.rmtree(root, ignore_errors=True)


def refusal(result: dict[str, Any], baseline: Baseline) -> str | None:
    """Why a worker's *result* is not a baseline measurement, or None if it is: every
    ``aiolock`` file it and its part processes imported must lie in the extracted copy."""
    files = result.get("aiolock_files") or []
    if not files:
        return "the worker did not report which aiolock it imported"
    package = baseline.package.resolve()
    wrong = [f for f in files if not Path(f).resolve().is_relative_to(package)]
    if wrong:
        return f"the worker imported aiolock from {', '.join(wrong)}, not from {package}"
    return None
