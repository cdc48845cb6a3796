"""The join topic's packed records: whatever the serving stack's records hold, unpacking a
pack gives them back exactly, and bytes that are not whole frames are refused."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vigil.connectors.events import Record
from vigil.daemon.forwarded import _HEAD, _HEADER, frame, unpack

records = st.builds(
    Record,
    topic=st.text(min_size=1, max_size=30),
    partition=st.integers(0, 2**31 - 1),
    offset=st.integers(0, 2**63 - 1),
    value=st.none() | st.binary(max_size=300),
    key=st.none() | st.binary(max_size=40),
    headers=st.lists(st.tuples(st.text(max_size=20), st.binary(max_size=40)), max_size=4).map(
        tuple
    ),
    timestamp_ms=st.integers(-1, 2**62),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(records, max_size=12))
def test_a_pack_gives_back_each_record_as_it_came(rs):
    packed = b"".join(frame(r, r.topic.encode()) for r in rs)
    assert [Record(*fields) for fields in unpack(packed)] == rs


@settings(max_examples=200, deadline=None)
@given(st.lists(records, min_size=1, max_size=4), st.data())
def test_a_cut_pack_is_refused(rs, data):
    packed = b"".join(frame(r, r.topic.encode()) for r in rs)
    cut = data.draw(st.integers(1, len(packed) - 1))
    whole = {len(b"".join(frame(r, r.topic.encode()) for r in rs[:i])) for i in range(len(rs))}
    if cut in whole:  # a cut between frames is a shorter pack
        assert [Record(*f) for f in unpack(packed[:cut])] == rs[: sorted(whole).index(cut)]
        return
    with pytest.raises(ValueError, match=r"not packed records|runs past the end"):
        unpack(packed[:cut])


@pytest.mark.parametrize(
    "value",
    [
        _HEAD.pack(0, 0, 0, 0, -1, -1, 1) + _HEADER.pack(0, -38),  # would loop for ever
        _HEAD.pack(0, 0, 0, 0, -1, -1, 1) + _HEADER.pack(0, -3) + b"abcdef",
        _HEAD.pack(0, 0, 0, 0, -2, -1, 0),
        _HEAD.pack(0, 0, 0, 0, -1, -7, 0),
    ],
)
def test_negative_lengths_are_refused(value):
    with pytest.raises(ValueError, match="length is negative"):
        unpack(value)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_unpack_or_are_refused(value):
    """Whatever a join-topic record holds, unpacking ends: records, or ``ValueError``."""
    try:
        out = unpack(value)
    except ValueError:
        return
    assert all(len(fields) == len(Record.__struct_fields__) for fields in out)
