"""A serving-stack rule's second stage, the join and its checker as one, through the
pipeline with in-memory records of the join topic (as the forward stage packs them, or as
older builds copied them):
decisions checked in batches, one state across a restart, and rows the rule cannot read
as dead letters."""

from __future__ import annotations

import asyncio

import numpy as np
import orjson

from tests.oracle import witness_sets
from tests.test_serving_kafka import request_bytes, response_bytes
from vigil.connectors.events import Record
from vigil.connectors.memory import MemorySink, MemorySource
from vigil.daemon.adapters.base import RuleContext
from vigil.daemon.adapters.serving import ServingJoin, serving_rules
from vigil.daemon.config import parse_config
from vigil.daemon.forwarded import PACK_HEADER, frame
from vigil.daemon.metrics import Metrics
from vigil.daemon.pipeline import Pipeline, PipelineSettings
from vigil.daemon.state import FileStore

TOPIC = "g.r.join"


def join_records(
    requests: list[tuple[str, np.ndarray, np.ndarray]],
    order: list[tuple[int, str]],
    per: int | None = None,
):
    """Values and headers of the join topic: ``order`` lists (request index, side), the
    serving stack's record of each at that offset of its topic. The forward stage packs
    them ``per`` to a join-topic record; with ``per`` None, each is a copy of its own with
    its source in headers, as older builds forwarded them."""
    sources = []
    for offset, (i, side) in enumerate(order):
        ident, x, y = requests[i]
        topic = f"seldon.t.model.m.{'inputs' if side == 'request' else 'outputs'}"
        value = request_bytes(x) if side == "request" else response_bytes(y)
        key = f"0.m.{ident}".encode()
        headers = (("x-request-id", ident.encode()),)
        sources.append(Record(topic, 0, offset, value, key, headers, 1000 + offset))
    if per is not None:
        packs = [sources[at : at + per] for at in range(0, len(sources), per)]
        values = [b"".join(frame(r, r.topic.encode()) for r in pack) for pack in packs]
        return values, [((PACK_HEADER, b"1"),)] * len(values)
    copies = [
        (
            *r.headers,
            ("vigil-topic", r.topic.encode()),
            ("vigil-partition", b"0"),
            ("vigil-offset", str(r.offset).encode()),
            ("vigil-key", r.key),
        )
        for r in sources
    ]
    return [r.value for r in sources], copies


def pipeline(values, headers, store, sink=None, **rule):
    """The join stage of a Seldon i.o.r. rule (eps 0.25, linf) over the given records,
    checking 37 decisions at a time, snapshotting only when told."""
    config = parse_config(
        {
            "kafka": {"bootstrap_servers": "127.0.0.1:9092", "group_id": "g"},
            "rules": [
                {"name": "r", "kind": "ior", "format": "seldon", "model": "m", "eps": 0.25}
                | {"metric": "linf", **rule}
            ],
        }
    )
    metrics = Metrics()
    context = RuleContext(metrics, None, lambda *a: None, dead_letter_topic="dead")
    (join,) = [
        r
        for r in serving_rules(config.rules[0], config.seldon, "g", context)
        if isinstance(r, ServingJoin)
    ]
    source = MemorySource(TOPIC, values, headers=headers)
    settings = PipelineSettings("dead", max_batch=37, snapshot_every_events=10**6)
    return Pipeline([join], source, sink or MemorySink(), store, metrics, settings), source, join


def run(p: Pipeline, source: MemorySource, snapshot: bool = False) -> None:
    """Process every record; then, with ``snapshot``, snapshot and wait for the files."""

    async def go() -> None:
        await source.start(p.on_assign, p.on_revoke)
        await p.run(asyncio.Event(), until_idle=True)
        if snapshot:
            await p.snapshot_all()

    asyncio.run(go())


def requests(seed: int, count: int, rows: int):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 6, size=(count * rows, 3)) / 6
    y = rng.integers(0, 2, size=count * rows)
    return (
        [
            (f"q{i}", x[rows * i : rows * (i + 1)], y[rows * i : rows * (i + 1)])
            for i in range(count)
        ],
        x,
        y,
    )


def interleaved(count: int, rng: np.random.Generator) -> list[tuple[int, str]]:
    """Each of ``count`` requests and, some records later, its response, in random order."""
    unsent, waiting, order = [int(i) for i in rng.permutation(count)], [], []
    while unsent or waiting:
        if unsent and (not waiting or rng.random() < 0.5):
            waiting.append(unsent.pop())
            order.append((waiting[-1], "request"))
        else:
            order.append((waiting.pop(int(rng.integers(len(waiting)))), "response"))
    return order


def flagged(sink: MemorySink) -> dict[str, list[str]]:
    return {
        e["decision"]["id"]: sorted(w["id"] for w in e["witnesses"])
        for e in (orjson.loads(m.value) for m in sink.messages if m.topic == "vigil.alerts")
    }


def truth(x, y, names) -> dict[str, list[str]]:
    sets = witness_sets(x, y, 0.25)
    return {names[i]: sorted(names[j] for j, _ in w) for i, w in enumerate(sets) if w}


def test_joined_rows_are_checked_at_most_max_batch_at_a_time_with_exact_witnesses(tmp_path):
    """A fetch of 37 records of 16-row requests holds many more decisions: they are
    checked 37 at a time, in the order the pairs complete, and the witness sets are those
    of the whole stream at once (brute force)."""
    reqs, x, y = requests(4, 40, 16)
    order = [(i, "request") for i in range(40)] + [(i, "response") for i in range(40)]
    values, headers = join_records(reqs, order, per=5)
    p, source, join = pipeline(values, headers, FileStore(tmp_path))
    sizes = []
    check = join.checker.check

    async def recorded(tp, decisions, emit_from):
        sizes.append(len(decisions))
        return await check(tp, decisions, emit_from)

    join.checker.check = recorded
    run(p, source)
    names = [f"q{i // 16}/{i % 16}" for i in range(len(x))]
    assert sum(sizes) == len(x) and max(sizes) == 37
    assert p.metrics.events.labels("r", "checked")._value.get() == len(x)  # each once
    assert join.checker.monitors[(TOPIC, 0)].history.ids == names
    assert flagged(p.sink) == truth(x, y, names) != {}


def test_a_restart_between_requests_and_responses_checks_every_row_once(tmp_path):
    """The requests waiting for their responses and the monitor's history are snapshotted
    together; the process dies after a commit the snapshot lags, with requests waiting. The
    restart replays from the snapshot: every row is checked once and each alert is sent
    once, with the witness sets of brute force over the pairs' order. The join topic holds
    copies as older builds forwarded them: a join topic written before an upgrade is
    still read."""
    reqs, _, _ = requests(9, 60, 3)
    order = interleaved(60, np.random.default_rng(1))
    values, headers = join_records(reqs, order)
    store, sink = FileStore(tmp_path, keep=3), MemorySink()
    snapshot_at, died_at = 40, 70

    p, first_source, first = pipeline(values[:snapshot_at], headers[:snapshot_at], store, sink)
    run(p, first_source, snapshot=True)
    assert len(first.joins[(TOPIC, 0)]) > 0  # the snapshot holds requests still waiting
    p, source, _ = pipeline(values[:died_at], headers[:died_at], store, sink)
    source.commits = first_source.commits
    run(p, source)  # no snapshot after the first: as if the process died here
    newest, _ = asyncio.run(store.load("r", (TOPIC, 0)))
    assert newest is not None and newest.offset == snapshot_at < died_at  # a replay is needed
    commits = source.commits

    p, source, join = pipeline(values, headers, store, sink)
    source.commits = commits
    run(p, source)
    completed = []  # the pairs in the order their later side came
    seen: set[int] = set()
    for i, _ in order:
        if i in seen:
            completed.append(i)
        seen.add(i)
    rows = [(i, r) for i in completed for r in range(3)]
    names = [f"q{i}/{r}" for i, r in rows]
    xs = np.array([reqs[i][1][r] for i, r in rows])
    ys = np.array([reqs[i][2][r] for i, r in rows])
    alerts = [orjson.loads(m.value) for m in sink.messages if m.topic == "vigil.alerts"]
    assert len(alerts) == len(flagged(sink)), "an alert was sent twice"
    assert flagged(sink) == truth(xs, ys, names) != {}
    assert join.checker.monitors[(TOPIC, 0)].history.ids == names


def test_rows_too_narrow_for_the_rule_are_dead_letters(tmp_path):
    reqs = [
        ("a", np.zeros((2, 4)), np.array([0, 1])),
        ("b", np.zeros((3, 3)), np.array([0, 1, 0])),
    ]
    order = [(0, "request"), (0, "response"), (1, "request"), (1, "response")]
    values, headers = join_records(reqs, order, per=2)
    p, source, join = pipeline(values, headers, FileStore(tmp_path), dim=4)
    run(p, source)
    dead = [orjson.loads(m.value) for m in p.sink.messages if m.topic == "dead"]
    # the rule's own check names the join-topic record that completed the pair (b's pack)
    assert [(d["reason"], d["source"]["offset"]) for d in dead] == [("dimension", 1)] * 3
    assert all("x has 3 values, the rule expects 4" in d["error"] for d in dead)
    assert join.checker.monitors[(TOPIC, 0)].history.ids == ["a/0", "a/1"]
