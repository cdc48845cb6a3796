"""decode_decision's fast path (the typed envelope decoder for the common shape) must agree
with the field-by-field check of the whole parsed event: the same Decision for every valid
event, the same BadEvent (reason and message) for every damaged one, and for every stray
byte string."""

from __future__ import annotations

import json
from collections.abc import Callable

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from vigil.connectors.events import (
    BadEvent,
    Decision,
    Record,
    _check_envelope,
    _classify_undecodable,
    decode_decision,
)

wide = st.one_of(  # orjson reads integers beyond 64 bits as floats
    st.integers(-(2**63), 2**64 - 1),
    st.integers(2**64, 2**70),
    st.integers(-(2**70), -(2**63) - 1),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    wide,
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
)
values = st.one_of(
    scalars,
    st.lists(st.one_of(st.integers(-10, 10), wide, st.floats(-1, 1), st.booleans()), max_size=4),
    st.dictionaries(st.text(max_size=3), scalars, max_size=2),
)
valid = st.fixed_dictionaries(
    {
        "id": st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=5)),
        "model": st.text(max_size=5),
        "x": st.lists(st.one_of(st.floats(-1, 1), st.integers(-10, 10)), max_size=4),
        "y": st.one_of(st.integers(0, 3), st.floats(0, 1), st.lists(st.floats(0, 1))),
    }
)


@st.composite
def events(draw) -> object:
    """A valid decision, or one with fields dropped, retyped or added (features, extras),
    or not an object at all."""
    event = dict(draw(valid))
    for key in draw(st.lists(st.sampled_from(["id", "model", "x", "y"]), max_size=2)):
        event.pop(key, None)
    for key, value in draw(
        st.dictionaries(st.sampled_from(["id", "model", "x", "y", "features", "z"]), values)
    ).items():
        event[key] = value
    return draw(st.one_of(st.just(event), values))


def checked(record: Record) -> Decision:
    return _check_envelope(record, orjson.loads(record.value))


def outcome(decode: Callable[[Record], Decision], event: object) -> tuple:
    return decoded(decode, json.dumps(event).encode())  # orjson cannot write wide integers


def decoded(decode: Callable[[Record], Decision], value: bytes) -> tuple:
    record = Record("t", 0, 7, value)
    try:
        d = decode(record)
    except BadEvent as e:
        return ("bad", e.reason, str(e))
    # every rule reads x and a y array as float64, so their numbers compare as floats; a
    # scalar y is a label (int) or a probability (float), and an id's type is its identity
    return ("ok", d.record, typed(d.id), d.model, floats(d.x), typed(d.y), d.event)


def typed(value: object) -> object:
    if isinstance(value, list):
        return floats(value)
    return (type(value).__name__, value)


def floats(value: object) -> object:
    if isinstance(value, list) and all(type(v) in (int, float) for v in value):
        return [float(v).hex() for v in value]
    return value


def checked_bytes(record: Record) -> Decision:
    try:
        event = orjson.loads(record.value)
    except orjson.JSONDecodeError as e:
        raise _classify_undecodable(record.value, e) from None
    return _check_envelope(record, event)


@settings(max_examples=600, deadline=None)
@given(events())
def test_the_fast_path_decodes_as_the_checked_path(event):
    assert outcome(decode_decision, event) == outcome(checked, event)


@given(valid)
def test_valid_events_take_the_fast_path_and_keep_every_field(event):
    record = Record("t", 0, 7, json.dumps(event).encode())
    d = decode_decision(record)
    assert d.parsed is None  # the envelope alone was read: no dict built for the event
    assert (d.id, d.model, d.x, d.y, d.event) == (
        event["id"],
        event["model"],
        event["x"],
        event["y"],
        orjson.loads(record.value),
    )


texts = st.sampled_from(
    [
        b'{"id":1,"model":"m","x":[1e400],"y":0}',
        b'{"id":1,"model":"m","x":[NaN],"y":0}',
        b'{"id":1,"model":"m","x":[1],"y":-1e999}',
        b'{"id":123456789012345678901234567890,"model":"m","x":[1],"y":0}',
        b'{"id":1,"model":"m","x":[123456789012345678901234567890],"y":0}',
        b'{"id":1,"model":"m","x":[1],"y":18446744073709551616}',
        b'{"id":1,"model":"m","x":"a","x":[1],"y":0}',
        b'{"id":1,"model":"m","x":[1],"x":"a","y":0}',
        b'{"id":1,"model":"m","x":[1],"y":0}x',
        b'\xef\xbb\xbf{"id":1,"model":"m","x":[1],"y":0}',
        b'{"id":"\\ud800","model":"m","x":[1],"y":0}',
        b'{"id":1,"model":"m\xff","x":[1],"y":0}',
        b'{"id":1,"model":"m","x":[1],"y":0,"features":null}',
        b'{"id":1,"model":"m","x":[-0.0,1E2,5e-324],"y":[1,2.5]}',
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(texts, st.binary(max_size=40)))
def test_any_bytes_decode_as_the_checked_path(value):
    assert decoded(decode_decision, value) == decoded(checked_bytes, value)


number_texts = st.builds(
    lambda sign, whole, fraction, exponent: f"{sign}{whole}{fraction}{exponent}",
    st.sampled_from(["", "-"]),
    st.one_of(st.just("0"), st.from_regex(r"[1-9][0-9]{0,25}", fullmatch=True)),
    st.one_of(st.just(""), st.from_regex(r"\.[0-9]{1,30}", fullmatch=True)),
    st.one_of(st.just(""), st.from_regex(r"[eE][+-]?[0-9]{1,3}", fullmatch=True)),
)


@settings(max_examples=500, deadline=None)
@given(st.lists(number_texts, min_size=1, max_size=4))
def test_numbers_as_written_read_to_the_same_bits(numbers):
    """Long mantissas, exponents and wide integers in ``x``: the typed decoder's floats are
    the checked path's to the bit (a witness at distance exactly eps depends on them)."""
    value = b'{"id":1,"model":"m","x":[' + ",".join(numbers).encode() + b'],"y":0}'
    assert decoded(decode_decision, value) == decoded(checked_bytes, value)
