"""The lock's scripts against a model of its guarantees (issue 21's one-key state).

Hypothesis drives random sequences of acquire, re-entry, release, resent commands, undo
(before and after the attempt ran), hand-over, lease expiry and force release against
the real scripts (``aiolock/_kinds/lock/*.lua``) on a real server, and checks every reply
and the state left against a model that knows only the guarantees:

* mutual exclusion: a new acquisition is granted exactly when the model has no live hold;
* fencing tokens rise strictly with every grant (a hand-over and a resent new
  acquisition included), across lost leases and force releases;
* a resent release answers as the first run did: "released" while no lease ran out and
  no force release came since (the inverted tombstone's epoch), else "not held"; the
  release of a hold that was lost never answers "released";
* a nested release or a re-entry sent twice counts once;
* an undo that reaches Redis before its attempt voids it (the late attempt does nothing),
  and an undo after it reverts it;
* a final release publishes exactly when another manager's attempt found the hold busy.

A new acquisition sends ARGV 1-2 only, as the client does, or (drawn) all four; a final
release without a successor sends ARGV 1-2 only, as the client with the default keep
does, or (drawn) all nine with an empty successor; a nested one sends 1-5: the scripts
read the ones left out as their defaults (the keep: 60 s; a count of 0 to acquire, 1 to
release; the manager id: the field's beginning).

After the model, tests of an older copy of the state coming back (a promoted replica,
issue 36): every path that gives a new token (a grant, a local hand-over, a resent
acquisition) gives one above every token given before.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from typing import Any

import pytest
import redis
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from redis.asyncio import Redis as AsyncRedis

import aiolock
from aiolock._engine import heed
from aiolock._kinds.lock.kind import DEFAULT_KEEP_MS
from aiolock._redis.scripts import Script
from tests._support.helpers import eventually, within

LEASE_MS = 30_000
KEEP_MS = "60000"
VOID_MS = 60_000
MANAGERS = ("m1", "m2", "m3")

SOURCES = {
    op: Script(f"_kinds/lock/{op}").source for op in ("acquire", "release", "undo", "force_release")
}


class LockScripts(RuleBasedStateMachine):
    """One lock name per run; the model's state beside the server's."""

    client: Any  # redis.Redis (bytes replies)

    def __init__(self) -> None:
        super().__init__()
        self.key = f"model-{uuid.uuid4().hex}:lock:{{x}}"
        self.channel = f"{self.key}:released"
        self.scripts: dict[str, Any] = {
            op: self.client.register_script(src) for op, src in SOURCES.items()
        }
        self.numbers = itertools.count(1)
        #: the live hold per the model: field, count, token, manager; None: free
        self.holder: dict[str, Any] | None = None
        #: the largest token granted so far
        self.issued = 0
        #: epoch number: a lost lease or a force release starts a new one
        self.epoch = 0
        #: holds whose final release was confirmed: field -> (token, manager, epoch)
        self.released: dict[str, tuple[int, str, int]] = {}
        #: holds that ended without a release: field -> (token, manager)
        self.lost: dict[str, tuple[int, str]] = {}
        #: another manager's attempt found the current hold busy
        self.flagged = False
        self.subscriber = self.client.pubsub()

    @initialize()
    def listen(self) -> None:
        # one listener on the channel: a published release is heard by exactly one client
        self.subscriber.subscribe(self.channel)
        deadline = time.monotonic() + 10
        while self.client.pubsub_numsub(self.channel)[0][1] < 1:
            assert time.monotonic() < deadline, "the subscription was not confirmed"
            self.subscriber.get_message(timeout=0.01)

    def teardown(self) -> None:
        self.subscriber.close()
        self.client.delete(self.key)

    # -- commands ------------------------------------------------------------------------

    def _field(self, manager: str) -> str:
        return f"{manager}:{next(self.numbers)}"

    def _attempt(self) -> str:
        """A new attempt's void marker (one per attempt, as the engine's attempt ids)."""
        return f"{self.key}:void:a{next(self.numbers)}"

    def _acquire(
        self, field: str, before: int, manager: str, void: str = "", full: bool = False
    ) -> Any:
        args: list[Any] = [field, LEASE_MS]
        if before or full:  # else ARGV[3..4] left out, as the client does
            args += [before, manager]
        return self.scripts["acquire"](
            keys=[self.key, void or self._attempt(), f"{self.key}:turns"], args=args
        )

    def _release(
        self,
        field: str,
        count: int,
        manager: str,
        token: int,
        successor: str = "",
        full: bool = False,
    ) -> Any:
        args: list[Any] = [f"{field}|1|{token}|", token]
        if successor or full:  # else ARGV[6..9] left out, as the client does
            args += [KEEP_MS, count, manager, successor, LEASE_MS, 1, 0]
        elif count != 1:  # and ARGV[3..5] too for a final release (KEEP_MS: the default)
            args += [KEEP_MS, count, manager]
        return self.scripts["release"](keys=[self.key], args=args)

    def _undo(self, field: str, before: int, manager: str, void: str) -> Any:
        args: list[Any] = [field, before, VOID_MS, self.channel, manager, KEEP_MS]
        return self.scripts["undo"](keys=[self.key, void], args=args)

    def _granted(self, token: int) -> None:
        assert token > self.issued, f"token {token} not above {self.issued}"
        self.issued = token

    def _grant_new(self, field: str, manager: str, token: int) -> None:
        self._granted(token)
        self.holder = {"field": field, "count": 1, "token": token, "manager": manager}
        self.flagged = False

    # -- rules ---------------------------------------------------------------------------

    @rule(manager=st.sampled_from(MANAGERS), resend=st.booleans(), full=st.booleans())
    def acquire(self, manager: str, resend: bool, full: bool) -> None:
        field, void = self._field(manager), self._attempt()
        reply = self._acquire(field, 0, manager, void, full=full)
        if self.holder is None:
            assert isinstance(reply, int), reply
            self._grant_new(field, manager, reply)
            if resend:  # the reply was lost: the resend gets a fresh, larger token
                again = self._acquire(field, 0, manager, void, full=not full)
                assert again[0] == 1, again
                self._granted(again[1])
                assert self.holder is not None
                self.holder["token"] = again[1]
        else:
            assert reply[0] == 0 and reply[1] > 0, reply  # busy, with the holder's lease
            # the waiter flag: set by any busy attempt (the holder's own manager's too)
            self.flagged = True

    @precondition(lambda self: self.holder is not None)
    @rule(resend=st.booleans())
    def reenter(self, resend: bool) -> None:
        assert self.holder is not None
        holder, void = self.holder, self._attempt()
        for _ in range(2 if resend else 1):
            reply = self._acquire(holder["field"], holder["count"], holder["manager"], void)
            assert reply == [2, holder["count"] + 1], reply
        holder["count"] += 1

    @precondition(lambda self: self.holder is not None)
    @rule(resend=st.booleans(), full=st.booleans())
    def release(self, resend: bool, full: bool) -> None:
        assert self.holder is not None
        h = self.holder
        reply = self._release(h["field"], h["count"], h["manager"], h["token"], full=full)
        if h["count"] > 1:
            assert reply == [1, h["count"] - 1], reply
            if resend:
                again = self._release(h["field"], h["count"], h["manager"], h["token"])
                assert again == [1, h["count"] - 1], again
            h["count"] -= 1
            return
        assert isinstance(reply, int), reply
        assert reply == (1 if self.flagged else 0), (reply, self.flagged)
        self.released[h["field"]] = (h["token"], h["manager"], self.epoch)
        self.holder = None
        self.flagged = False
        if resend:
            self._check_resend(h["field"])

    @precondition(lambda self: self.holder is not None and self.holder["count"] == 1)
    @rule(manager=st.sampled_from(MANAGERS))
    def hand_over(self, manager: str) -> None:
        assert self.holder is not None
        h = self.holder
        successor = self._field(manager)
        reply = self._release(h["field"], 1, h["manager"], h["token"], successor)
        assert reply[0] == 4, reply  # its token: above every one given (_granted)
        self._granted(reply[1])
        self.released[h["field"]] = (h["token"], h["manager"], self.epoch)
        flagged = self.flagged  # the waiter flag goes with the hold to the successor
        self.holder = {"field": successor, "count": 1, "token": reply[1], "manager": manager}
        self.flagged = flagged
        # a resend of the release that handed over, naming its successor, says so
        again = self._release(h["field"], 1, h["manager"], h["token"], successor)
        assert again == [4, reply[1]], again

    def _check_resend(self, field: str) -> None:
        if field in self.released:
            token, manager, epoch = self.released[field]
            reply = self._release(field, 1, manager, token)
            assert reply == ([2, 0] if epoch == self.epoch else [0, 0]), (reply, epoch)
        else:
            token, manager = self.lost[field]
            reply = self._release(field, 1, manager, token)
            assert reply == [0, 0], reply  # a lost hold is never "released"

    @precondition(lambda self: bool(self.released or self.lost))
    @rule(data=st.data())
    def resend_release(self, data: st.DataObject) -> None:
        field = data.draw(st.sampled_from(sorted([*self.released, *self.lost])))
        self._check_resend(field)

    @rule()
    def lease_runs_out(self) -> None:
        if not self.client.exists(self.key):
            return
        self.client.pexpire(self.key, 1)
        deadline = time.monotonic() + 10
        while self.client.exists(self.key):  # an access after the ms expires it
            assert time.monotonic() < deadline, "the key did not expire"
            time.sleep(0.002)
        if self.holder is not None:
            self.lost[self.holder["field"]] = (self.holder["token"], self.holder["manager"])
            self.holder = None
        self.epoch += 1  # the whole state is gone: tokens and released range with it
        self.flagged = False

    @rule()
    def force_release(self) -> None:
        reply = self.scripts["force_release"](
            keys=[self.key], args=[self.channel, "admin", KEEP_MS]
        )
        if self.holder is None:
            assert reply == [0, 0], reply
            return
        assert reply == [1, 0], reply
        self.lost[self.holder["field"]] = (self.holder["token"], self.holder["manager"])
        self.holder = None
        self.epoch += 1
        self.flagged = False

    @rule(manager=st.sampled_from(MANAGERS), reentry=st.booleans())
    def undo_before_the_attempt_runs(self, manager: str, reentry: bool) -> None:
        before = self.client.get(self.key)
        if reentry and self.holder is not None:
            field, count, manager = (
                self.holder["field"],
                self.holder["count"],
                self.holder["manager"],
            )
        else:
            field, count = self._field(manager), 0
        void = self._attempt()
        assert self._undo(field, count, manager, void) == 0
        late = self._acquire(field, count, manager, void)  # it arrives after its undo
        assert late == [3, 0], late
        assert self.client.get(self.key) == before  # it did nothing

    @rule(manager=st.sampled_from(MANAGERS))
    def undo_after_the_attempt_ran(self, manager: str) -> None:
        if self.holder is not None:  # a re-entry that ran, then undone
            h, void = self.holder, self._attempt()
            reply = self._acquire(h["field"], h["count"], h["manager"], void)
            assert reply == [2, h["count"] + 1], reply
            assert self._undo(h["field"], h["count"], h["manager"], void) == 1
            return
        field, void = self._field(manager), self._attempt()
        token = self._acquire(field, 0, manager, void)
        assert isinstance(token, int), token
        self._granted(token)
        assert self._undo(field, 0, manager, void) == 1  # the new hold is given back
        self.flagged = False

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def state_matches_the_model(self) -> None:
        raw = self.client.get(self.key)
        if self.holder is None:
            assert raw is None or raw.startswith(b"|"), raw
            return
        h = self.holder
        assert raw is not None
        head = f"{h['field']}|{h['count']}|{h['token']}|".encode()
        assert raw.startswith(head), (raw, head)
        assert (not raw.endswith(b"|")) == self.flagged, raw  # the waiter flag


@pytest.mark.timeout(600)
def test_the_lock_scripts_keep_their_guarantees(sync_redis: redis.Redis) -> None:
    LockScripts.client = sync_redis
    run = LockScripts.TestCase
    run.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
    run().runTest()


def test_a_release_counts_its_own_listener_only_when_told(sync_redis: redis.Redis) -> None:
    """ARGV[9] '1' (the client sends ARGV 4-9 when its manager listens, with no successor)
    takes the releasing manager off the count of who heard; left out, it counts nobody off."""
    client: Any = sync_redis  # (its pubsub() is untyped)
    acquire, release = (client.register_script(SOURCES[op]) for op in ("acquire", "release"))
    key = f"model-{uuid.uuid4().hex}:lock:{{x}}"
    subscriber = client.pubsub()
    subscriber.subscribe(f"{key}:released")
    try:
        deadline = time.monotonic() + 10
        while client.pubsub_numsub(f"{key}:released")[0][1] < 1:
            assert time.monotonic() < deadline, "the subscription was not confirmed"
            subscriber.get_message(timeout=0.01)
        for extra, heard in ([KEEP_MS, 1, "m1", "", 0, 0, 1], 0), ([], 1):
            token = acquire(
                keys=[key, f"{key}:void:{heard}", f"{key}:turns"], args=["m1:1", LEASE_MS]
            )
            busy = acquire(
                keys=[key, f"{key}:void:b{heard}", f"{key}:turns"], args=["m2:1", LEASE_MS]
            )
            assert busy[0] == 0, busy  # the waiter flag is set: the release publishes
            args = [f"m1:1|1|{token}|", token, *extra]
            assert release(keys=[key], args=args) == heard
    finally:
        subscriber.close()
        client.delete(key)


def test_a_release_without_a_keep_keeps_the_free_state_the_default(
    sync_redis: redis.Redis,
) -> None:
    """A final release that leaves ARGV[3] out keeps the free state DEFAULT_KEEP_MS (what
    the client leaves out: the keep of the default fence_ttl), one that names it as long
    as named ('-1': no expiry), on the common path and off it (the waiter flag set)."""
    acquire, release = (sync_redis.register_script(SOURCES[op]) for op in ("acquire", "release"))
    key = f"model-{uuid.uuid4().hex}:lock:{{x}}"
    default = int(DEFAULT_KEEP_MS)
    try:
        for n, (keep, low, high) in enumerate(
            [(None, default - 10_000, default), ("20000", 10_000, 20_000), ("-1", -1, -1)] * 2
        ):
            token = acquire(
                keys=[key, f"{key}:void:{n}", f"{key}:turns"], args=[f"m1:{n}", LEASE_MS]
            )
            if n >= 3:  # the waiter flag set: the release's path after the prelude
                busy = acquire(
                    keys=[key, f"{key}:void:b{n}", f"{key}:turns"], args=[f"m2:{n}", LEASE_MS]
                )
                assert busy[0] == 0, busy
            args = [f"m1:{n}|1|{token}|", token, *([keep] if keep else [])]
            assert release(keys=[key], args=args) == 0
            pttl = sync_redis.pttl(key)
            assert low < pttl <= high if low >= 0 else pttl == low, (keep, pttl)
    finally:
        sync_redis.delete(key)


# -- an older copy of the state (issue 36 item 2) -------------------------------------
#
# A replica promoted after its primary died may hold an older copy of a name's state
# than the one clients last saw; so may a server restarted from an older file. These
# tests make that copy with DUMP before more grants and put it back with RESTORE REPLACE
# (they touch the key itself: its layout is what they are about). Every token a copy
# leads to must still be above every token given before: tokens are the server's clock,
# forced above the state's last token, never the state's last token plus one alone.


async def test_a_grant_on_an_older_copy_of_the_state_gets_a_larger_token(
    locks: aiolock.LockManager, admin: AsyncRedis
) -> None:
    lock = locks.lock("promoted")
    seen: list[int] = []
    for _ in range(3):
        async with lock:
            assert lock.fencing_token is not None
            seen.append(lock.fencing_token)
    copy = await admin.dump(lock.key)  # the free state: the epoch and the last token
    assert copy is not None
    for _ in range(5):  # grants the copy lacks, whose tokens clients saw
        async with lock:
            assert lock.fencing_token is not None
            seen.append(lock.fencing_token)
    await admin.restore(lock.key, 60_000, copy, replace=True)  # the promotion
    for _ in range(2):
        async with lock:
            assert lock.fencing_token is not None
            assert lock.fencing_token > max(seen), (lock.fencing_token, seen)
            seen.append(lock.fencing_token)


async def test_a_hand_over_on_an_older_copy_of_the_hold_gets_a_larger_token(
    redis: AsyncRedis,
    admin: AsyncRedis,
    redis_url: str,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The copy has the hold of a task that still holds: on the old primary its hold
    ended unseen (deleted: nothing is published) and another client took the name with a
    later token; the promoted copy brings the task's hold back, and its release hands
    the lock to a second task of its manager."""
    # Not listened for (the check on subscribing could find the hold gone meanwhile)
    monkeypatch.setattr(heed, "LISTEN_AFTER", 3600.0)
    async with aiolock.LockManager(redis, prefix=prefix) as locks:
        lock = locks.lock("handed")
        tokens: list[int] = []

        async def second() -> None:
            async with lock:
                assert lock.fencing_token is not None
                tokens.append(lock.fencing_token)

        async with lock:
            assert lock.fencing_token is not None
            tokens.append(lock.fencing_token)
            copy = await admin.dump(lock.key)  # the held state: this task's hold
            assert copy is not None
            lease_left = await admin.pttl(lock.key)
            await admin.delete(lock.key)
            other_client = AsyncRedis.from_url(redis_url)
            try:
                other = aiolock.LockManager(other_client, prefix=prefix)
                async with other, other.lock("handed") as theirs:
                    assert theirs.fencing_token is not None
                    tokens.append(theirs.fencing_token)
            finally:
                await other_client.aclose()
            await admin.restore(lock.key, lease_left, copy, replace=True)  # the promotion
            waiter = asyncio.create_task(second())
            await eventually(lambda: locks.statistics().hub.waiters == 1, what="the waiter")
        # the release handed the lock to the waiting task
        await within(waiter, what="the hand-over")
    first, theirs_token, handed = tokens
    assert first < theirs_token < handed, tokens


def test_a_resent_acquisition_on_an_older_copy_of_its_hold_gets_a_larger_token(
    sync_redis: redis.Redis,
) -> None:
    """The first copy of an attempt ran and replicated; on the old primary the hold
    ended and another owner took the name; the promoted copy has the first grant, and
    the attempt resent there (its reply was lost) gets a fresh token."""
    acquire = sync_redis.register_script(SOURCES["acquire"])
    key = f"model-{uuid.uuid4().hex}:lock:{{x}}"
    void = f"{key}:void:a1"
    try:
        first = acquire(keys=[key, void, f"{key}:turns"], args=["m1:1", LEASE_MS])
        copy = sync_redis.dump(key)
        assert copy is not None
        sync_redis.delete(key)
        theirs = acquire(keys=[key, f"{key}:void:a2", f"{key}:turns"], args=["m2:1", LEASE_MS])
        sync_redis.restore(key, LEASE_MS, copy, replace=True)
        again = acquire(keys=[key, void, f"{key}:turns"], args=["m1:1", LEASE_MS])  # the resend
        assert again[0] == 1, again
        assert first < theirs < again[1], (first, theirs, again)
    finally:
        sync_redis.delete(key)
