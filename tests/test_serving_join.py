"""The join of requests and responses against an obviously correct oracle: every side is
paired, expired or still waiting, exactly once, and a snapshot taken anywhere resumes to
the same outcome."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from vigil.connectors.events import Record
from vigil.connectors.serving.message import Inference
from vigil.daemon.join import Join


def inference_of(record: Record) -> Inference:
    """A stand-in decode: the key names the request, the topic the side."""
    key = record.key.decode()
    role = "request" if record.topic.endswith(".inputs") else "response"
    return Inference(key, key, role, "m", [])


def stream(events: list[tuple[int, bool]]) -> list[Record]:
    """Records of (request number, is a request), offsets in order."""
    return [
        Record(
            "s.inputs" if is_request else "s.outputs", 0, i, b"v", f"k{n}".encode(), (("h", b"1"),)
        )
        for i, (n, is_request) in enumerate(events)
    ]


def feed(join: Join, records: list[Record], start: int = 0) -> tuple[list, list]:
    """The keys paired, in order, and the (key, side, why) of what expired, in order."""
    pairs, expired = [], []
    for r in records:
        pair, gone = join.add(inference_of(r), r, start + r.offset)  # timestamps = offsets
        if pair is not None:
            request, response = pair
            assert (request.inference.role, response.inference.role) == ("request", "response")
            assert request.inference.join_key == response.inference.join_key
            pairs.append(request.inference.join_key)
        expired += [(e.waiting.inference.join_key, e.waiting.inference.role, e.why) for e in gone]
    return pairs, expired


events = st.lists(st.tuples(st.integers(0, 15), st.booleans()), max_size=60)


@settings(max_examples=200, deadline=None)
@given(events)
def test_without_expiry_each_request_meets_its_response_once(evs):
    # the oracle: with no timeout, keys seen on both sides are paired, and a
    # side seen again before its partner supersedes the earlier one
    join = Join(timeout_ms=10**9)
    pairs, expired = feed(join, stream(evs))
    expected_pairs, waiting, superseded = [], {}, []
    for n, is_request in evs:
        key, role = f"k{n}", "request" if is_request else "response"
        other = "response" if is_request else "request"
        if (key, other) in waiting:
            del waiting[(key, other)]
            expected_pairs.append(key)
        else:
            if (key, role) in waiting:
                superseded.append((key, role, "superseded"))
            waiting[(key, role)] = True
    assert pairs == expected_pairs
    assert expired == superseded
    assert {(w.inference.join_key, w.inference.role) for w in join.waiting()} == set(waiting)


@settings(max_examples=200, deadline=None)
@given(events, st.integers(1, 20))
def test_every_side_is_paired_expired_or_waiting_exactly_once(evs, timeout):
    join = Join(timeout_ms=timeout)
    records = stream(evs)
    paired = expired_count = 0
    for r in records:
        pair, gone = join.add(inference_of(r), r, r.offset)
        paired += 2 * (pair is not None)
        expired_count += len(gone)
        assert all(w.timestamp_ms >= join.stream_time - timeout for w in join.waiting()[:1])
    assert paired + expired_count + len(join) == len(records)


@settings(max_examples=150, deadline=None)
@given(events, st.integers(1, 20), st.data())
def test_a_snapshot_anywhere_resumes_to_the_same_outcome(evs, timeout, data):
    records = stream(evs)
    cut = data.draw(st.integers(0, len(records)))
    whole = Join(timeout)
    expected = feed(whole, records)
    first = Join(timeout)
    before = feed(first, records[:cut])
    resumed = Join.restore(first.snapshot(), inference_of, timeout)
    assert [(w.record, w.timestamp_ms) for w in resumed.waiting()] == [
        (w.record, w.timestamp_ms) for w in first.waiting()
    ]
    after = feed(resumed, records[cut:])
    assert before[0] + after[0] == expected[0]
    assert before[1] + after[1] == expected[1]
    assert [w.record for w in resumed.waiting()] == [w.record for w in whole.waiting()]
