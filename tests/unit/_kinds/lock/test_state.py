"""The lock's state defined once (issue 39): the Lua prelude (``state.lua``, after
``codes.lua``) and the Python codec (:mod:`aiolock._kinds.lock.state`) agree on every state, and
the reply codes and the default keep have the same names and numbers on both sides.

The property tests write random states (fields with ``:`` and any unicode, tokens and
epochs up to 2^53, any flag) with one side into a real server's key and read them with the
other: Python writes, the prelude decodes and re-encodes (the same bytes); the prelude
writes, Python decodes. Strings aiolock did not write are refused by both alike. Then the
common paths of acquire.lua and release.lua, which inline the prelude's encoding (it would
cost every call its functions), are checked to write what the codec reads as expected.
"""

from __future__ import annotations

import re
import uuid
from importlib import resources
from typing import Any

import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiolock._engine.kind import AttemptReply, ChangeReply, ReleaseReply
from aiolock._kinds.lock.state import DEFAULT_KEEP_MS, LockState, format_state, parse_state
from aiolock._redis.scripts import Script


def _lua(name: str) -> str:
    return resources.files("aiolock").joinpath(f"_kinds/lock/{name}.lua").read_text("utf-8")


CODES, STATE = _lua("codes"), _lua("state")

#: test-only scripts: the prelude as the lock scripts have it, then a body
DECODE = f"""{CODES}
{STATE}
local field, count, token, epoch, flag = decode_state(redis.call('get', KEYS[1]))
if not field then
  return false
end
local again
if field == '' then
  again = encode_free(epoch, token)
else
  again = encode_held(field, count, token, epoch, flag)
end
return {{field, format_token(count), format_token(token), format_token(epoch), flag, again}}
"""
ENCODE = f"""{CODES}
{STATE}
local state
if ARGV[1] == '' then
  state = encode_free(tonumber(ARGV[4]), tonumber(ARGV[3]))
else
  state = encode_held(ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5])
end
redis.call('set', KEYS[1], state)
return state
"""

PROPERTY = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

fields = st.text(st.characters(codec="utf-8", exclude_characters="|"), min_size=1) | st.builds(
    lambda manager, serial: f"{manager}:{serial}:1", st.text(min_size=1), st.integers(0, 10**9)
).filter(lambda field: "|" not in field)
numbers = st.integers(0, 2**53)
held_states = st.builds(
    LockState,
    fields,
    st.integers(1, 2**31),
    numbers,
    numbers,
    st.sampled_from(["", "*", "0123456789abcdef", "a|b\nc"]) | st.text(),
)
free_states = st.builds(lambda epoch, last: LockState("", 0, last, epoch, ""), numbers, numbers)
states = held_states | free_states


def _key() -> str:
    return f"state-{uuid.uuid4().hex}:lock:{{x}}"


def _decoded(reply: Any) -> tuple[LockState, bytes] | None:
    """The DECODE script's reply: the state the prelude read, and its re-encoding."""
    if reply is None:
        return None
    field, count, token, epoch, flag, again = reply
    text = field.decode("utf-8")
    state = LockState(text, int(count), int(token), int(epoch), flag.decode("utf-8"))
    return state, again


def test_the_reply_codes_and_the_keep_are_the_same_on_both_sides() -> None:
    lua: dict[str, int] = {}
    for names, values in re.findall(r"^local ([A-Z_, ]+) = ([-\d, ]+)$", CODES, re.MULTILINE):
        pairs = zip(names.split(", "), values.split(", "), strict=True)
        for name, value in pairs:
            assert lua.setdefault(name, int(value)) == int(value), name  # one number a name
    python: dict[str, int] = {}
    for codes in (AttemptReply, ReleaseReply, ChangeReply):
        for code in codes:
            assert python.setdefault(code.name, code.value) == code.value, code
    assert lua == python
    assert re.search(rf"^local KEEP_MS = '{DEFAULT_KEEP_MS}'$", CODES, re.MULTILINE)


@PROPERTY
@given(state=states)
def test_a_state_python_writes_reads_and_writes_back_the_same_in_lua(
    sync_redis: redis.Redis, state: LockState
) -> None:
    key, text = _key(), format_state(state)
    assert parse_state(text.encode()) == state
    try:
        sync_redis.set(key, text)
        decoded = _decoded(sync_redis.eval(DECODE, 1, key))
        assert decoded == (state, text.encode())
    finally:
        sync_redis.delete(key)


@PROPERTY
@given(state=states)
def test_a_state_lua_writes_reads_the_same_in_python(
    sync_redis: redis.Redis, state: LockState
) -> None:
    key = _key()
    try:
        written = sync_redis.eval(ENCODE, 1, key, *state)
        assert written == format_state(state).encode()
        assert parse_state(sync_redis.get(key)) == state
    finally:
        sync_redis.delete(key)


foreign = (
    st.text()
    | st.builds("|".join, st.lists(st.text("0123456789|a:*\n²", max_size=4), max_size=7))
    | st.sampled_from(
        [
            "",
            "|",
            "||",
            "|1|",
            "|1|2|",
            "a|1|2|3",
            "a|1|2|3|x|y",
            "a|²|2|3|",
            "a|1|2|3|\n",
            "\n|1|2|3|",
            "|1|2\n",
        ]
    )
)


@PROPERTY
@given(raw=foreign)
def test_both_sides_refuse_and_read_any_string_alike(sync_redis: redis.Redis, raw: str) -> None:
    key = _key()
    try:
        sync_redis.set(key, raw)
        decoded = _decoded(sync_redis.eval(DECODE, 1, key))
        state = parse_state(raw.encode())
        assert (None if decoded is None else decoded[0]) == state
    finally:
        sync_redis.delete(key)


def test_the_common_paths_write_what_the_codec_reads(sync_redis: redis.Redis) -> None:
    """acquire.lua from no state and from a free one, and release.lua's common path,
    inline the prelude's encoding: what they write decodes to what they said."""
    client: Any = sync_redis
    acquire = client.register_script(Script("_kinds/lock/acquire").source)
    release = client.register_script(Script("_kinds/lock/release").source)
    key = _key()
    try:
        first = acquire(keys=[key, f"{key}:void:1", f"{key}:turns"], args=["m1:1", 30_000])
        assert parse_state(client.get(key)) == LockState("m1:1", 1, first, first, "")
        assert release(keys=[key], args=[f"m1:1|1|{first}|", first]) == 0
        assert parse_state(client.get(key)) == LockState("", 0, first, first, "")
        second = acquire(keys=[key, f"{key}:void:2", f"{key}:turns"], args=["m2:1", 30_000])
        assert second > first
        assert parse_state(client.get(key)) == LockState("m2:1", 1, second, first, "")
        assert release(keys=[key], args=[f"m2:1|1|{second}|", second]) == 0
        assert parse_state(client.get(key)) == LockState("", 0, second, first, "")
    finally:
        client.delete(key, f"{key}:turns")
