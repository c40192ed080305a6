"""The wire-format seam: ``wire=`` per manager and per lock, checked at the call."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._formats import wire_format


def test_the_default_format_is_aiolocks_own() -> None:
    manager = aiolock.LockManager(Redis())
    assert manager.wire == "aiolock"
    assert manager.lock("x")._keys.lock == "aiolock:lock:{x}"


def test_an_unknown_format_is_refused_at_the_call_that_names_it() -> None:
    with pytest.raises(ValueError, match=r"unknown wire format 'redison'.*allowed: 'aiolock'"):
        aiolock.LockManager(Redis(), wire="redison")  # type: ignore[arg-type]
    manager = aiolock.LockManager(Redis())
    for make in (
        lambda: manager.lock("x", wire="nope"),  # type: ignore[arg-type]
        lambda: manager.fair_lock("x", wire="nope"),  # type: ignore[arg-type]
        lambda: manager.rw_lock("x", wire="nope"),  # type: ignore[arg-type]
        lambda: manager.semaphore("x", 2, wire="nope"),  # type: ignore[arg-type]
        lambda: manager.multi_lock(["x", "y"], wire="nope"),  # type: ignore[arg-type]
    ):
        with pytest.raises(ValueError, match="unknown wire format 'nope'"):
            make()
    with pytest.raises(TypeError, match="wire must be a str"):
        manager.lock("x", wire=1)  # type: ignore[arg-type]


def test_from_url_takes_wire_as_a_manager_option() -> None:
    manager = aiolock.LockManager.from_url("redis://127.0.0.1:1", wire="aiolock")
    assert manager.wire == "aiolock"


def test_unsupported_names_the_format_and_the_way_out() -> None:
    error = wire_format("aiolock").unsupported("fair lock", "it keeps no queue")
    assert isinstance(error, aiolock.WireFormatError)
    assert isinstance(error, aiolock.LockError)
    assert "'aiolock' wire format has no fair lock: it keeps no queue" in str(error)
    assert "wire='aiolock'" in str(error)
