"""The join's way for one-row Seldon records read by layout (no record, inference or
``Waiting`` built for a side that pairs at once) gives exactly what reading every record
with ``seldon.decode`` and pairing it with ``Join.add`` gives: the same decisions answered
by the same join-topic records, the same dead letters in the same order, the same waiting
state, over streams that mix it with every record it leaves to ``decode``."""

from __future__ import annotations

import asyncio

import numpy as np
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_serving_kafka import request_bytes, response_bytes
from vigil.connectors.events import Record
from vigil.connectors.serving.layouts import BLOCK_FROM
from vigil.connectors.serving.rows import RowReader
from vigil.daemon.adapters.base import RuleContext, RuleResult
from vigil.daemon.adapters.serving import ServingJoin, serving_rules
from vigil.daemon.config import parse_config
from vigil.daemon.forwarded import PACK_HEADER, frame
from vigil.daemon.metrics import Metrics

PREFIX = "seldon.t.model.m"
TIMEOUT_MS = 40

# How one request's records look: both sides by layout (the response later, or first), or
# one side missing, repeated, failed, JSON, keyless (paired by header), two rows, or
# unreadable.
KINDS = (
    "plain",
    "plain",
    "plain",
    "response-first",
    "no-response",
    "no-request",
    "request-twice",
    "response-twice",
    "error",
    "json-request",
    "keyless",
    "two-rows",
    "typed-response-on-inputs",
    "garbage",
)


def join_stage() -> ServingJoin:
    config = parse_config(
        {
            "kafka": {"bootstrap_servers": "127.0.0.1:9092", "group_id": "g"},
            "rules": [
                {"name": "r", "kind": "ior", "format": "seldon", "seldon_namespace": "t"}
                | {"model": "m", "eps": 0.2, "metric": "linf", "join_timeout_seconds": 0.04}
            ],
        }
    )
    context = RuleContext(Metrics(), None, lambda *a: None, dead_letter_topic="dead")
    (join,) = [
        r
        for r in serving_rules(config.rules[0], config.seldon, "g", context)
        if isinstance(r, ServingJoin)
    ]
    return join


def sides(
    i: int, kind: str, rng: np.random.Generator, at: int, delay: int
) -> list[tuple[int, Record]]:
    """(timestamp, record) of request ``i``'s traffic, its request at ``at`` ms, its response
    up to ``delay`` ms later."""
    rows = 2 if kind == "two-rows" else 1
    x = rng.integers(0, 4, size=(rows, 3)) / 4
    y = rng.integers(0, 2, size=rows)
    key = f"0.m.r{i}".encode()
    request = request_bytes(x)
    response = response_bytes(y)
    req_headers: tuple = ()
    res_headers: tuple = ()
    req_key = res_key = key
    if kind == "error":
        response, res_headers = b"model failed", (("seldon-pipeline-errors", b"1"),)
    elif kind == "json-request":
        request = orjson.dumps(
            {
                "inputs": [
                    {"name": "predict", "datatype": "FP64", "shape": [1, 3]}
                    | {"data": x[0].tolist()}
                ]
            }
        )
    elif kind == "keyless":
        req_key = res_key = None
        req_headers = res_headers = (("x-request-id", key),)
    elif kind == "garbage":
        request = b"\x0a\xff\xff"
    delay = int(rng.integers(0, delay + 1)) * (-1 if kind == "response-first" else 1)
    out = []
    if kind != "no-request":
        out.append((at, Record(f"{PREFIX}.inputs", 0, 0, request, req_key, req_headers)))
    if kind == "request-twice":
        out.append((at + 1, Record(f"{PREFIX}.inputs", 0, 0, request, req_key, req_headers)))
    if kind == "typed-response-on-inputs":
        typed = (("seldon-infer-type", b"proto/InferModelResponse"),)
        out.append((at + delay, Record(f"{PREFIX}.inputs", 0, 0, response, key, typed)))
    elif kind != "no-response":
        out.append((at + delay, Record(f"{PREFIX}.outputs", 0, 0, response, res_key, res_headers)))
    if kind == "response-twice":
        out.append((at + delay + 1, Record(f"{PREFIX}.outputs", 0, 0, response, key)))
    return out


def packs(kinds: list[str], seed: int, per: list[int], delay: int = 60) -> list[Record]:
    """The stream as join-topic records: the sides in time order (ties as made), packed
    ``per[k]`` to the k-th join-topic record (responses up to ``delay`` ms late: past the
    timeout, some)."""
    rng = np.random.default_rng(seed)
    timed = []
    for i, kind in enumerate(kinds):
        timed += sides(i, kind, rng, 1000 + 7 * i, delay)
    timed.sort(key=lambda t: t[0])
    offsets = {"inputs": 0, "outputs": 0}
    sources = []
    for ts, r in timed:
        side = r.topic.rpartition(".")[2]
        sources.append(Record(r.topic, 0, offsets[side], r.value, r.key, r.headers, ts))
        offsets[side] += 1
    out, at, k = [], 0, 0
    while at < len(sources):
        group = sources[at : at + per[k % len(per)]]
        value = b"".join(frame(r, r.topic.encode()) for r in group)
        out.append(Record("g.r.join", 0, len(out), value, b"m", ((PACK_HEADER, b"1"),)))
        at, k = at + len(group), k + 1
    return out


def outcome(join: ServingJoin, records: list[Record], emit_from: int) -> list:
    """Every handle's decisions and events, then the waiting state."""
    tp = ("g.r.join", 0)
    seen = []
    for record in records:
        result: RuleResult = asyncio.run(join.handle(tp, [record], emit_from))
        decisions = [
            (d.record.offset, d.id, d.model, np.asarray(d.x).tolist(), d.y, d.event)
            for d in result.decisions
        ]
        events = []
        for answer in result.events:
            body = orjson.loads(answer.message.value)
            body.pop("detected_at")
            events.append((answer.offset, answer.message.topic, answer.message.key, body))
        seen.append((decisions, events))
    return [seen, join.joins[tp].snapshot()]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from(KINDS), min_size=1, max_size=40),
    st.integers(0, 2**16),
    st.lists(st.integers(1, 40), min_size=1, max_size=4),
    st.integers(0, 6),
)
def test_reading_by_layout_gives_what_decoding_every_record_gives(kinds, seed, per, emit_from):
    records = packs(kinds, seed, per)
    fast = join_stage()
    general = join_stage()
    general._layout_rows = lambda carried: [None] * len(carried)  # all by ``seldon.decode``
    # both learn the layouts from the same first messages
    assert outcome(fast, records, emit_from) == outcome(general, records, emit_from)


def test_the_layout_way_is_taken_for_one_row_traffic(monkeypatch):
    """Else the property above would compare the general way with itself: records read by
    layout, a pack's messages of one size as a block."""
    records = packs(["plain"] * 40, 0, [5, 30], delay=TIMEOUT_MS - 1)
    join = join_stage()
    took, blocks = [], []
    inner = join._take_row
    join._take_row = lambda *args: took.append(inner(*args))
    many = RowReader.many
    monkeypatch.setattr(
        RowReader, "many", lambda self, block: blocks.append(len(block)) or many(self, block)
    )
    tp = ("g.r.join", 0)
    decisions = [d for r in records for d in asyncio.run(join.handle(tp, [r], 0)).decisions]
    assert len(decisions) == 40
    assert len(took) == 75  # all but the first pack's, read before any layout was learned
    assert sum(blocks) >= 2 * BLOCK_FROM
