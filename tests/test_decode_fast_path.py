"""decode_decision's fast path (one exact-type test for the common shape) must agree with
the field-by-field check: the same Decision for every valid event, the same BadEvent
(reason and message) for every damaged one."""

from __future__ import annotations

from collections.abc import Callable

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from vigil.connectors.events import BadEvent, Decision, Record, _check_envelope, decode_decision

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
)
values = st.one_of(
    scalars,
    st.lists(st.one_of(st.integers(-10, 10), st.floats(-1, 1), st.booleans()), max_size=4),
    st.dictionaries(st.text(max_size=3), scalars, max_size=2),
)
valid = st.fixed_dictionaries(
    {
        "id": st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=5)),
        "model": st.text(max_size=5),
        "x": st.lists(st.floats(-1, 1), max_size=4),
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
    record = Record("t", 0, 7, orjson.dumps(event))
    try:
        d = decode(record)
    except BadEvent as e:
        return ("bad", e.reason, str(e))
    return ("ok", d.record, d.id, d.model, d.x, d.y, d.event)


@settings(max_examples=600, deadline=None)
@given(events())
def test_the_fast_path_decodes_as_the_checked_path(event):
    assert outcome(decode_decision, event) == outcome(checked, event)


@given(valid)
def test_valid_events_take_the_fast_path_and_keep_every_field(event):
    record = Record("t", 0, 7, orjson.dumps(event))
    d = decode_decision(record)
    assert (d.id, d.model, d.x, d.y, d.event) == (
        event["id"],
        event["model"],
        event["x"],
        event["y"],
        orjson.loads(record.value),
    )
