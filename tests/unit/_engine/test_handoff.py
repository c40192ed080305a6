"""Unit tests of :mod:`aiolock._engine.handoff`: the hand-off token's codec and the
refusal of a handle that cannot be handed off (no Redis: the scripts and their use are
tested in ``tests/unit/_kinds/lock/test_handoff.py``)."""

from __future__ import annotations

import base64
import json

import pytest

import aiolock
from aiolock._engine.handoff import DETACHED, HandoffToken, refused


def test_a_token_round_trips_as_plain_text() -> None:
    token = HandoffToken("p:lock:{a}", DETACHED + "ab" * 16, 42)
    text = token.encode()
    assert text.startswith("aiolock-hold-1.") and "=" not in text
    assert text.isascii() and not any(c in text for c in " /+\n\"'")
    assert HandoffToken.decode(text) == token


def _made(payload: object) -> str:
    raw = json.dumps(payload).encode()
    return "aiolock-hold-1." + base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize(
    "text",
    [
        "hello",
        "aiolock-hold-1.!!!!",
        _made(["k", DETACHED + "x"]),  # too few parts
        _made(["k", "owner:1", 3]),  # not a detached field
        _made(["k", DETACHED + "x", True]),  # a bool is not a fencing token
        _made(["k", DETACHED + "x", "3"]),
        _made([1, DETACHED + "x", 3]),
    ],
)
def test_what_is_not_a_token_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"not a hand-off token made by Lock\.detach"):
        HandoffToken.decode(text)


def test_a_long_bad_token_is_cut_short_in_the_error() -> None:
    with pytest.raises(ValueError, match=r"…$"):
        HandoffToken.decode("x" * 100)


def test_a_token_is_a_str() -> None:
    with pytest.raises(TypeError, match=r"is a str .* not bytes"):
        HandoffToken.decode(b"aiolock-hold-1.")


def test_the_refusal_names_the_handle_and_what_hands_off() -> None:
    error = refused("FairLock 'x'")
    assert isinstance(error, aiolock.LockError)
    assert str(error) == (
        "FairLock 'x' cannot be handed off: only a plain Lock of aiolock's own wire format "
        "can be detached and adopted (LockManager.lock(name), wire='aiolock')"
    )
