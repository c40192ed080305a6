"""The slot-layout study (benchmarks/scripts/slots.py, issue 40): it runs end to end, and its
prototype scripts keep the rules the study's report relies on."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from benchmarks.scripts import slots


def test_a_short_run_measures_every_row_and_writes_its_figures(tmp_path: Path) -> None:
    """Structure only: a run this short says nothing about the figures."""
    out = tmp_path / "slots.json"
    argv = ["--rounds", "1", "--cycles", "5", "--batches", "1,4", "--limits", "1,3"]
    assert slots.main([*argv, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [batch["holds"] for batch in result["renewal"]] == [1, 4]
    for batch in result["renewal"]:
        assert list(batch["rows"]) == list(slots.RENEW_ROWS)
        assert batch["rows"][slots.LOCK]["vs_lock"] == 1.0
        assert all(row["redis_us_per_hold"] > 0 for row in batch["rows"].values())
    configs = result["cycle"]["configs"]
    assert list(configs) == ["limit 1, 0 held", "limit 3, 0 held", "limit 3, 2 held"]
    for rows in configs.values():
        assert list(rows) == list(slots.CYCLE_ROWS)
        assert all(row["script_us_per_cycle"] > 0 for row in rows.values())


async def _top(admin: Redis, base: str) -> int:
    """The highest slot the meta key says may be live."""
    meta = await admin.get(f"{base}:meta")
    assert isinstance(meta, bytes)
    return int(meta.split(b"|")[1])


class _Sem:
    """One semaphore of the slot prototype, driven by hand."""

    def __init__(self, admin: Redis, base: str, limit: int) -> None:
        self.admin, self.base, self.limit = admin, base, limit

    async def acquire(self, field: str, attempt: str, permits: int = 1, start: int = 1) -> Any:
        b = self.base
        return await self.admin.eval(
            slots.SCRIPTS["slot acquire"], 3, f"{b}:meta", f"{b}:fence", f"{b}:void:{attempt}",
            field, permits, slots.LEASE_MS, self.limit, start, slots.FENCE_MS, slots.VOID_MS,
        )  # fmt: skip

    async def release(self, field: str, token: int, numbers: list[int], permits: int = 1) -> Any:
        b = self.base
        return await self.admin.eval(
            slots.SCRIPTS["slot release"], len(numbers), *(f"{b}:s:{i}" for i in numbers),
            f"{field}|{permits}|{token}|", token, slots.KEEP_MS, "m",
        )  # fmt: skip

    async def renew(self, field: str, numbers: list[int], lease: str = slots.LEASE_MS) -> Any:
        keys = [f"{self.base}:s:{i}" for i in numbers]
        args = [v for _ in numbers for v in (field, lease)]
        return await self.admin.eval(slots.SCRIPTS["lock renew"], len(keys), *keys, *args)


async def test_the_prototype_grants_slots_answers_resends_and_never_revives(
    admin: Redis, prefix: str
) -> None:
    sem = _Sem(admin, f"{prefix}:sem:{{s}}", 2)
    token, slot = await sem.acquire("a", "1")
    assert slot == 1
    assert await sem.acquire("a", "1") == [1, token, 1]  # a resend: the same slot
    token_b, slot_b = await sem.acquire("b", "2", start=1)
    assert slot_b == 2 and token_b > token
    # a resend of a grant past the hinted slot finds it through the attempt's mark
    assert await sem.acquire("b", "2", start=1) == [1, token_b, 2]
    assert await sem.acquire("c", "3") == [0, -1]  # full
    assert await sem.renew("a", [1]) == [1] and await sem.renew("b", [1]) == [0]
    assert await sem.release("a", token, [1]) == 0
    assert await sem.release("a", token, [1]) == [2, 0]  # a resend of the release
    token_c, slot_c = await sem.acquire("c", "4")
    assert slot_c == 1 and token_c > token_b
    assert await sem.release("a", token, [1]) == [2, 0]  # still, under the next holder
    assert await sem.renew("a", [1]) == [0]
    # b's lease ends: its slot is free again, and its renewal never revives it
    await admin.pexpire(f"{sem.base}:s:2", 1)
    await asyncio.sleep(0.01)
    assert await sem.renew("b", [2]) == [0]
    token_d, slot_d = await sem.acquire("d", "5", start=2)
    assert slot_d == 2 and await sem.renew("b", [2]) == [0]
    assert await sem.release("b", token_b, [2]) == [0, 0]  # lost, not released
    # a slot flagged by a claim (what the claim path would write): its release publishes
    async with admin.pubsub() as pubsub:
        await pubsub.subscribe(f"{sem.base}:released")
        await admin.set(f"{sem.base}:s:2", f"d|1|{token_d}|{token_d}|*", px=60000)
        assert await sem.release("d", token_d, [2]) == 1
        assert await admin.get(f"{sem.base}:s:2") == f"|{token_d}|{token_d}".encode()
    # another limit, a voided attempt
    assert await _Sem(admin, sem.base, 3).acquire("e", "6") == [-2, 2]
    await admin.set(f"{sem.base}:void:7", "1")
    assert await sem.acquire("e", "7") == [3, 0]
    assert token_d > token_c


async def test_the_prototype_takes_several_slots_and_counts_above_a_lowered_limit(
    admin: Redis, prefix: str
) -> None:
    sem = _Sem(admin, f"{prefix}:sem:{{m}}", 3)
    token, *numbers = await sem.acquire("a", "1", permits=2)
    assert numbers == [1, 2]
    assert await sem.acquire("b", "2", permits=2) == [0, -1]
    assert await sem.renew("a", numbers) == [1, 1]
    assert await sem.release("a", token, numbers, permits=2) == 0
    # The limit lowered from 4 to 2 while slots 3 and 4 are held (what a set_limit would
    # write): slots 1 and 2 are free, yet nothing may be granted until one above goes.
    low = _Sem(admin, f"{prefix}:sem:{{l}}", 2)
    await admin.set(f"{low.base}:meta", "2|4||0", px=60000)
    for i in (3, 4):
        await admin.set(f"{low.base}:s:{i}", f"x{i}|1|5|5|", px=60000)
    assert await low.acquire("c", "3") == [0, -1]
    await admin.delete(f"{low.base}:s:4")
    token, slot = await low.acquire("c", "4")
    assert slot == 1
    assert await _top(admin, low.base) == 4  # slot 3 still held
    await admin.delete(f"{low.base}:s:3")
    assert (await low.acquire("d", "5"))[1] == 2
    assert await _top(admin, low.base) == 2  # back to the limit
