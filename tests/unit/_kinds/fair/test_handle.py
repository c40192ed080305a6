"""Unit tests of :mod:`aiolock._kinds.fair.handle`: the fair lock's handle is a
:class:`~aiolock.Lock` (:mod:`aiolock._engine.lockhandle`) with its own repr; what makes it
fair is its kind (``test_kind.py``)."""

from __future__ import annotations

import aiolock


async def test_the_handle(locks: aiolock.LockManager) -> None:
    fair = locks.fair_lock("fair", timeout=3, lease=7)
    assert repr(fair) == "<FairLock 'fair' timeout=3.0 lease=7.0>"
    assert isinstance(fair, aiolock.FairLock) and isinstance(fair, aiolock.Lock)
    assert fair.name == "fair" and fair.key != locks.lock("fair").key
    async with fair as entered:
        assert entered is fair
        assert await fair.owned() and fair.fencing_token is not None
    assert not await fair.locked()
