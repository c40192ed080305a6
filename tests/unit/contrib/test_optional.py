"""The optional integrations stay optional: not imported by default, named when missing."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest

from tests._support.paths import REPO_ROOT


def test_import_aiolock_imports_no_optional_package() -> None:
    # redis-py itself may import OpenTelemetry when it is installed: only what importing
    # aiolock adds on top of redis counts.
    code = (
        "import sys, redis.asyncio\n"
        "before = set(sys.modules)\n"
        "import aiolock\n"
        "added = [m for m in set(sys.modules) - before if m.split('.')[0] in "
        "('opentelemetry', 'prometheus_client') or m.startswith('aiolock.contrib')]\n"
        "assert not added, added\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)


@pytest.mark.parametrize(
    ("module", "missing", "extra"),
    [
        ("aiolock.contrib.opentelemetry", "opentelemetry", "aiolock[otel]"),
        ("aiolock.contrib.prometheus", "prometheus_client", "aiolock[prometheus]"),
    ],
)
def test_a_missing_extra_is_named(
    monkeypatch: pytest.MonkeyPatch, module: str, missing: str, extra: str
) -> None:
    monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.setitem(sys.modules, missing, None)  # makes "import missing" fail
    with pytest.raises(ImportError, match=f"pip install '{extra}'".replace("[", r"\[")):
        importlib.import_module(module)
