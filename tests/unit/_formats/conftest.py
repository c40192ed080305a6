"""Fixtures shared by the tests of the string formats shared with other clients
(``wire="token"``, ``wire="timestamp"``), whose locks live at the raw name."""

from __future__ import annotations

import pytest

from tests._support.wire_fleet import Polls


@pytest.fixture
def name(prefix: str) -> str:
    """A raw lock name of this test's own (these formats use no prefix)."""
    return f"{prefix}-job"


@pytest.fixture
def polls(monkeypatch: pytest.MonkeyPatch) -> Polls:
    return Polls(monkeypatch)
