"""The daemon's own logic without a broker: config errors, schemas, snapshots, replay
suppression after a restart (in-memory source and sink)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import shutil
import threading
import time
from importlib.resources import files
from pathlib import Path

import jsonschema
import numpy as np
import orjson
import pytest

from tests.oracle import largest_ratios, witness_sets
from vigil.connectors.events import BadEvent, Record, dead_letter, decode_decision, encode
from vigil.connectors.memory import MemorySink, MemorySource
from vigil.daemon.adapters import IorRule
from vigil.daemon.cli import main
from vigil.daemon.config import ConfigError, load_config, parse_config
from vigil.daemon.decoding import READ_AHEAD_BATCHES, Decoded, DecodeWorker
from vigil.daemon.metrics import Metrics
from vigil.daemon.pipeline import Pipeline, PipelineSettings
from vigil.daemon.service import _shutdown
from vigil.daemon.state import FileStore
from vigil.rules.reach.network import Network

CONTRACT = """
[kafka]
bootstrap_servers = "127.0.0.1:9092"
group_id = "vigil"
exactly_once = true

[outputs]
alerts_topic = "vigil.alerts"
dead_letter_topic = "vigil.dead-letters"

[metrics]
port = 9464

[[rules]]
name = "compas-fairness"
kind = "ior"
topic = "decisions"
model = "compas"
metric = "linf"
eps = 0.16
backend = "auto"
"""


def schema(name: str) -> dict:
    return json.loads((files("vigil.connectors") / "schemas" / f"{name}.json").read_text())


def test_the_contract_configuration_is_accepted(tmp_path):
    path = tmp_path / "vigil.toml"
    path.write_text(CONTRACT)
    config = load_config(path)
    assert config.kafka.exactly_once and config.rules[0].eps == 0.16
    assert main(["check-config", str(path)]) == 0


@pytest.mark.parametrize(
    ("change", "key"),
    [
        (("eps = 0.16", "eps = -1"), "rules.0.eps"),
        (('backend = "auto"', 'backend = "annoy"'), "rules.0"),
        (("port = 9464", "port = 99999"), "metrics.port"),
        (('metric = "linf"', 'metric = "cosine"'), "rules.0.metric"),
        (('group_id = "vigil"', 'group_id = "vigil"\ncolour = 1'), "kafka.colour"),
        (("exactly_once = true", 'exactly_once = "maybe"'), "kafka.exactly_once"),
        (
            ('group_id = "vigil"', 'group_id = "vigil"\nmax_partition_fetch_bytes = 4096'),
            "kafka.max_partition_fetch_bytes",
        ),
        (("eps = 0.16", "eps = true"), "rules.0: Value error, eps: expected a number"),
        (("port = 9464", "port = false"), "metrics: Value error, port: expected a number"),
        (('backend = "auto"', 'backend = "parallel:2:parallel"'), "rules.0"),
    ],
)
def test_config_errors_name_the_key(tmp_path, change, key, capsys):
    path = tmp_path / "vigil.toml"
    path.write_text(CONTRACT.replace(*change))
    with pytest.raises(ConfigError, match="(?m)^  " + re.escape(key) + r"\b"):
        load_config(path)
    assert main(["check-config", str(path)]) == 2
    assert key in capsys.readouterr().err


def test_check_config_loads_the_rules_models(tmp_path, capsys):
    """check-config answers what `run` would: a missing model or one whose outputs do not
    fit the spec is an error, not "ok"."""
    net = Network.from_arrays([(np.eye(2), np.zeros(2))])
    (tmp_path / "m.onnx").write_bytes(net.to_onnx())
    for onnx, spec, message in (
        ("m.onnx", "C = [[1.0, 0.0]]\nd = [1.0]", "ok (1 rules"),
        ("gone.onnx", "C = [[1.0, 0.0]]\nd = [1.0]", "cannot read onnx"),
        ("m.onnx", "C = [[1.0, 0.0, 0.0]]\nd = [1.0]", "the spec C has 3 columns"),
        ("m.onnx", "C = [[1.0, 0.0]]\nd = [nan]", "C and d must be finite"),
    ):
        path = tmp_path / "vigil.toml"
        path.write_text(
            '[kafka]\nbootstrap_servers = "unused:9092"\n'
            f'[[rules]]\nname = "v"\nkind = "reach"\ntopic = "t"\nmodel = "m"\n'
            f'onnx = "{onnx}"\n{spec}\n'
        )
        code = main(["check-config", str(path)])
        out = capsys.readouterr()
        assert message in out.out + out.err
        assert code == (0 if message.startswith("ok") else 2)


def test_config_needs_exactly_one_source():
    with pytest.raises(ConfigError, match="exactly one source"):
        parse_config({"rules": [{"name": "r", "kind": "ior", "topic": "t", "eps": 0.1}]})


def test_decoder_agrees_with_the_decision_schema():
    validator = jsonschema.Draft202012Validator(schema("decision"))
    samples = [
        {"id": "a", "model": "m", "x": [0.1, 2], "y": 1},
        {"id": 7, "model": "m", "x": [0.5], "y": [0.2, 0.8]},
        {"id": "a", "model": "m", "x": [0.1]},
        {"id": True, "model": "m", "x": [0.1], "y": 1},
        {"id": "a", "model": 3, "x": [0.1], "y": 1},
        {"id": "a", "model": "m", "x": "0.1", "y": 1},
        {"id": "a", "model": "m", "x": [0.1], "y": "yes"},
        {"id": "a", "model": "m", "features": {"age": 0.3, "income": 1}, "y": 1},
        {"id": "a", "model": "m", "features": [0.3], "y": 1},
        {"id": "a", "model": "m", "y": 1, "embedding": [0.1]},
        [1, 2],
    ]
    for sample in samples:
        record = Record("t", 0, 0, orjson.dumps(sample))
        try:
            decode_decision(record)
            accepted = True
        except BadEvent:
            accepted = False
        assert accepted == validator.is_valid(sample), sample


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b'{"id": 1, "model": "m", "x": [NaN], "y": 1}', "non_finite"),
        (b'{"id": 1, "model": "m", "x": [-Infinity], "y": 1}', "non_finite"),
        (b'{"id": "\\ud800", "model": "m", "x": [0.1], "y": 1}', "undecodable"),
        (b'{"id": 1, "model": "m", "x": [1e999], "y": 1}', "non_finite"),
        (b'{"id": 1, "model": "m", "x": [NaN], "y": 1', "undecodable"),
        (b"[" * 5000 + b"]" * 5000, "undecodable"),
    ],
)
def test_undecodable_events_are_told_from_non_finite_numbers(value, reason):
    with pytest.raises(BadEvent) as caught:
        decode_decision(Record("t", 0, 0, value))
    assert caught.value.reason == reason


def test_dead_letters_match_their_schema():
    validator = jsonschema.Draft202012Validator(schema("dead_letter"))
    for value in (b"\xff\x00", b'{"id": 1}'):
        event = dead_letter(Record("t", 3, 41, value), "undecodable", "bad", "now")
        validator.validate(event)
        assert event["source"] == {"topic": "t", "partition": 3, "offset": 41}


def test_a_huge_dead_letter_keeps_a_bounded_prefix_and_the_payloads_digest():
    """A dead letter must fit a Kafka message, or producing it would stop the daemon."""
    validator = jsonschema.Draft202012Validator(schema("dead_letter"))
    for value in (b"\xff" * 800_000, b"x" * 800_000):
        event = dead_letter(Record("t", 0, 7, value), "undecodable", "bad", "now")
        validator.validate(event)
        assert len(encode(event)) < 2**20 * 0.9
        assert event["payload_bytes"] == len(value) and event["payload_truncated"] is True
        assert event["payload_sha256"] == hashlib.sha256(value).hexdigest()
    small = dead_letter(Record("t", 0, 8, b"x" * 1000), "undecodable", "bad", "now")
    assert small["payload"] == "x" * 1000 and "payload_truncated" not in small


def _decisions(x: np.ndarray, y: np.ndarray) -> list[bytes]:
    return [
        orjson.dumps({"id": i, "model": "m", "x": x[i].tolist(), "y": int(y[i])})
        for i in range(len(x))
    ]


def _pipeline(values, store, sink=None, every=50, source=None, **options):
    """An ior rule (eps 0.25, ``options`` added) over a memory source (``source``, or one
    serving ``values``) in batches of 37."""
    rule = IorRule(
        parse_config(
            {
                "files": {"decisions": "unused", "topic": "t"},
                "outputs": {"alerts_file": "a", "dead_letter_file": "d"},
                "rules": [{"name": "r", "kind": "ior", "topic": "t", "eps": 0.25, **options}],
            }
        ).rules[0]
    )
    source = source or MemorySource("t", values)
    settings = PipelineSettings("dead", max_batch=37, snapshot_every_events=every)
    pipeline = Pipeline([rule], source, sink or MemorySink(), store, Metrics(), settings)
    return pipeline, source, rule


def test_restart_replays_between_snapshot_and_commit_without_re_emitting(tmp_path):
    rng = np.random.default_rng(2)
    x = rng.integers(0, 8, size=(400, 3)) / 8
    y = rng.integers(0, 2, size=400)
    values = _decisions(x, y)
    values[123] = b"garbage"
    keep = [i for i in range(400) if i != 123]
    truth = witness_sets(x[keep], y[keep], 0.25)
    expected = {keep[n]: [keep[j] for j, _ in ws] for n, ws in enumerate(truth) if ws}
    store, sink = FileStore(tmp_path, keep=3), MemorySink()

    async def run(limit: int, source_commits):
        pipeline, source, _ = _pipeline(values[:limit], store, sink)
        source.commits = source_commits
        await source.start(pipeline.on_assign, pipeline.on_revoke)
        await pipeline.run(asyncio.Event(), until_idle=True)
        return source.commits  # no final snapshot: as if the process died here

    commits = asyncio.run(run(260, []))
    assert commits[-1] == {("t", 0): 260}
    newest, _ = asyncio.run(store.load("r", ("t", 0)))
    assert newest.offset < 260  # the snapshot lags the commit: a replay is needed
    asyncio.run(run(400, commits))
    alerts = [orjson.loads(m.value) for m in sink.messages if m.topic == "vigil.alerts"]
    dead = [orjson.loads(m.value) for m in sink.messages if m.topic == "dead"]
    assert {a["decision"]["id"]: [w["id"] for w in a["witnesses"]] for a in alerts} == expected
    assert len(alerts) == len(expected)
    assert [d["source"]["offset"] for d in dead] == [123]
    validator = jsonschema.Draft202012Validator(schema("alert"))
    for alert in alerts:
        validator.validate(alert)


def test_a_dead_letter_in_the_replay_does_not_stop_the_restart(tmp_path):
    """A bad decision between the snapshot and the commit is replayed (and not dead-lettered
    again); counting it as replayed once drove a counter negative and crashed every restart."""
    rng = np.random.default_rng(2)
    values = _decisions(rng.uniform(0, 1, (150, 3)), np.ones(150, dtype=int))
    values[90] = orjson.dumps({"id": 90, "model": "m", "x": [0.1, 0.2], "y": 1})
    store, sink = FileStore(tmp_path), MemorySink()

    async def run(limit: int, commits: list) -> list:
        pipeline, source, _ = _pipeline(values[:limit], store, sink)
        source.commits = commits
        await source.start(pipeline.on_assign, pipeline.on_revoke)
        await pipeline.run(asyncio.Event(), until_idle=True)
        await pipeline._flush_snapshots()
        return source.commits  # no final snapshot: as if the process died here

    commits = asyncio.run(run(111, []))
    assert asyncio.run(store.load("r", ("t", 0)))[0].offset < 90 < commits[-1][("t", 0)]
    asyncio.run(run(150, commits))
    dead = [orjson.loads(m.value) for m in sink.messages if m.topic == "dead"]
    assert [(d["source"]["offset"], d["reason"]) for d in dead] == [(90, "dimension")]


def test_a_restart_restores_the_newest_snapshot_the_commit_covers(tmp_path):
    """A snapshot past the commit (its records' alerts were never delivered) is passed over
    for an older one, not for a replay of the whole partition."""
    rng = np.random.default_rng(4)
    x = rng.integers(0, 8, size=(300, 3)) / 8
    y = rng.integers(0, 2, size=300)
    values = _decisions(x, y)
    truth = witness_sets(x, y, 0.25)
    expected = {n: [j for j, _ in ws] for n, ws in enumerate(truth) if ws}
    store, sink = FileStore(tmp_path, keep=3), MemorySink()
    pipeline, source, _ = _pipeline(values[:200], store, sink)

    async def first_run():
        await source.start(pipeline.on_assign, pipeline.on_revoke)
        await pipeline.run(asyncio.Event(), until_idle=True)
        await pipeline.snapshot_all()

    asyncio.run(first_run())
    saved = sorted(int(p.stem) for p in (tmp_path / "r" / "t.0").glob("*.snap"))
    assert len(saved) == 3 and saved[-1] == 200
    commit = (saved[0] + saved[1]) // 2  # as if the last batches' alerts were never delivered
    sink.messages = [
        m
        for m in sink.messages
        if m.topic != "vigil.alerts" or orjson.loads(m.value)["decision"]["id"] < commit
    ]
    pipeline, source, _ = _pipeline(values, store, sink)
    source.commits = [{("t", 0): commit}]

    async def second_run():
        await source.start(pipeline.on_assign, pipeline.on_revoke)
        assert source._next == saved[0]  # the newest snapshot at or before the commit
        await pipeline.run(asyncio.Event(), until_idle=True)

    asyncio.run(second_run())
    alerts = [orjson.loads(m.value) for m in sink.messages if m.topic == "vigil.alerts"]
    assert {a["decision"]["id"]: [w["id"] for w in a["witnesses"]] for a in alerts} == expected
    assert len(alerts) == len(expected)


def test_a_rule_without_decisions_on_a_partition_resumes_where_it_stood(tmp_path):
    """A rule whose model has no decision on a partition has no state to snapshot there; it
    records where its state begins instead, so a restart resumes at the snapshot rather
    than re-reading the partition (or reporting its deleted head as a gap) for that rule."""
    rng = np.random.default_rng(6)
    values = _decisions(rng.integers(0, 8, size=(200, 3)) / 8, rng.integers(0, 2, size=200))
    store = FileStore(tmp_path)

    def pipeline(source: MemorySource) -> Pipeline:
        config = parse_config(
            {
                "files": {"decisions": "unused", "topic": "t"},
                "outputs": {"alerts_file": "a", "dead_letter_file": "d"},
                "rules": [
                    {"name": name, "kind": "ior", "topic": "t", "model": model, "eps": 0.25}
                    for name, model in (("r", "m"), ("q", "other"))
                ],
            }
        )
        rules = [IorRule(rule) for rule in config.rules]
        settings = PipelineSettings("dead", max_batch=37, snapshot_every_events=50)
        return Pipeline(rules, source, MemorySink(), store, Metrics(), settings)

    async def run(commits: list) -> MemorySource:
        source = MemorySource("t", values)
        source.commits = commits
        daemon = pipeline(source)
        await source.start(daemon.on_assign, daemon.on_revoke)
        if not commits:
            await daemon.run(asyncio.Event(), until_idle=True)
            await daemon.snapshot_all()
        return source

    source = asyncio.run(run([]))
    assert source.commits[-1] == {("t", 0): 200}
    assert asyncio.run(store.load("q", ("t", 0)))[0] is None
    assert store.origin("q", ("t", 0)) == 200
    assert asyncio.run(run(source.commits))._next == 200


@pytest.mark.parametrize("second", ["b", None])
def test_each_rule_checks_the_decisions_of_its_model_in_stream_order(tmp_path, second):
    """Decisions of several models interleaved in one topic: each rule's history holds
    exactly its model's decisions (every model's, for a rule without one) in stream order,
    and the decisions no rule serves are counted as unrouted."""
    rng = np.random.default_rng(8)
    models = rng.choice(["a", "b", "c"], size=300)
    x = rng.integers(0, 8, size=(300, 3)) / 8
    values = [
        orjson.dumps({"id": i, "model": str(m), "x": x[i].tolist(), "y": int(i % 2)})
        for i, m in enumerate(models)
    ]
    values[17] = b"garbage"
    config = parse_config(
        {
            "files": {"decisions": "unused", "topic": "t"},
            "outputs": {"alerts_file": "a", "dead_letter_file": "d"},
            "rules": [
                {"name": name, "kind": "ior", "topic": "t", "eps": 0.25}
                | ({"model": model} if model else {})
                for name, model in (("first", "a"), ("second", second))
            ],
        }
    )
    rules = [IorRule(rule) for rule in config.rules]
    metrics = Metrics()
    source = MemorySource("t", values)
    settings = PipelineSettings("dead", max_batch=37, snapshot_every_events=10**6)
    pipeline = Pipeline(rules, source, MemorySink(), FileStore(tmp_path), metrics, settings)

    async def run() -> None:
        await source.start(pipeline.on_assign, pipeline.on_revoke)
        await pipeline.run(asyncio.Event(), until_idle=True)

    asyncio.run(run())
    valid = [i for i in range(300) if i != 17]
    for rule, model in zip(rules, ("a", second), strict=True):
        expected = [i for i in valid if model is None or models[i] == model]
        assert rule.monitors[("t", 0)].history.ids == expected
    unrouted = [i for i in valid if models[i] not in ("a", second) and second is not None]
    assert metrics.events.labels("", "unrouted")._value.get() == len(unrouted)


class _LaggingCommits(MemorySource):
    """A source whose committed offsets read back as the commit before for ``lag`` asks
    after each commit, as a broker answers until a transaction's markers are written."""

    def __init__(self, topic: str, values: list[bytes], lag: int) -> None:
        super().__init__(topic, values)
        self.lag, self.stale, self.asked = lag, 0, 0

    async def commit(self, offsets) -> None:
        await super().commit(offsets)
        self.stale = self.lag

    async def committed(self, tp) -> int | None:
        self.asked += 1
        if self.stale and len(self.commits) > 1:
            self.stale -= 1
            return self.commits[-2].get(tp)
        return await super().committed(tp)


def test_a_partition_is_let_go_only_once_its_commit_reads_back(tmp_path):
    """Its next owner reads the committed offset at once: before the broker answers this
    instance's commit, it would get the one before and answer those records again."""
    rng = np.random.default_rng(5)
    values = _decisions(rng.random((100, 3)), rng.integers(0, 2, 100))
    source = _LaggingCommits("t", values, lag=3)
    pipeline, source, _ = _pipeline([], FileStore(tmp_path), source=source)

    async def run() -> int:
        await source.start(pipeline.on_assign, pipeline.on_revoke)
        await pipeline.run(asyncio.Event(), until_idle=True)
        asked = source.asked
        await source.stop()  # revokes the partition
        return source.asked - asked

    assert asyncio.run(run()) == 4  # three answers with the commit before, then this one
    assert source.commits[-1] == {("t", 0): 100}


class _AtTheEnd(MemorySource):
    """A source whose reset policy starts a partition without a commit at ``start``."""

    def __init__(self, topic: str, values: list[bytes], start: int) -> None:
        super().__init__(topic, values)
        self.start_at = start

    async def start_offset(self, tp) -> int:
        return self.start_at


def test_a_group_starting_at_the_end_keeps_its_origin_across_a_restart(tmp_path):
    """``auto_offset_reset = "latest"``: the backlog before the start is neither checked nor
    part of the history, also when a restart before the first snapshot replays."""
    rng = np.random.default_rng(5)
    x = rng.integers(0, 8, size=(300, 3)) / 8
    y = rng.integers(0, 2, size=300)
    values = _decisions(x, y)
    origin = 120
    truth = witness_sets(x[origin:], y[origin:], 0.25)
    expected = {origin + n: [origin + j for j, _ in ws] for n, ws in enumerate(truth) if ws}
    store, sink = FileStore(tmp_path, keep=3), MemorySink()

    async def run(limit: int, commits: list) -> list:
        source = _AtTheEnd("t", values[:limit], origin)
        source.commits = commits
        pipeline, _, _ = _pipeline(values, store, sink, every=10**9, source=source)
        await source.start(pipeline.on_assign, pipeline.on_revoke)
        await pipeline.run(asyncio.Event(), until_idle=True)
        return source.commits  # no snapshot was taken: the restart must replay

    commits = asyncio.run(run(200, []))
    assert commits[-1] == {("t", 0): 200}
    assert not list(tmp_path.rglob("*.snap"))
    asyncio.run(run(300, commits))
    alerts = [orjson.loads(m.value) for m in sink.messages if m.topic == "vigil.alerts"]
    assert {a["decision"]["id"]: [w["id"] for w in a["witnesses"]] for a in alerts} == expected
    assert len(alerts) == len(expected)

    # an operator resets the group's offsets back before the origin: those records count now
    sink.messages.clear()
    asyncio.run(run(300, [{("t", 0): 50}]))
    truth = witness_sets(x[50:], y[50:], 0.25)
    expected = {50 + n: [50 + j for j, _ in ws] for n, ws in enumerate(truth) if ws}
    alerts = [orjson.loads(m.value) for m in sink.messages if m.topic == "vigil.alerts"]
    assert {a["decision"]["id"]: [w["id"] for w in a["witnesses"]] for a in alerts} == expected


def test_example_configs_are_valid(tmp_path):
    """Each example, where its comments say it runs: demo-files.toml after `vigil demo`,
    vigil.toml with the systemd credential it names."""
    examples = tmp_path / "ops" / "examples"
    shutil.copytree(Path(__file__).parents[1] / "ops" / "examples", examples)
    (tmp_path / "vigil-demo").mkdir()
    (tmp_path / "vigil-demo" / "decisions.jsonl").write_bytes(b"")
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "kafka-sasl-password").write_text("a-password\n")
    production = examples / "vigil.toml"
    text = production.read_text()
    assert "/run/credentials/vigil.service/kafka-sasl-password" in text
    production.write_text(text.replace("/run/credentials/vigil.service", str(credentials)))
    paths = sorted(examples.glob("*.toml"))
    assert len(paths) >= 3
    for path in paths:
        load_config(path)


def _config(rules: list[dict], **outputs) -> dict:
    return {
        "kafka": {"bootstrap_servers": "unused:9092"},
        "outputs": outputs,
        "rules": rules,
    }


REACH = {
    "name": "v",
    "kind": "reach",
    "topic": "t",
    "model": "m",
    "onnx": "m.onnx",
    "C": [[1.0, 0.0]],
    "d": [1.0],
}


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ([{**REACH, "d": [1.0, 2.0]}], "rules.0: Value error, C needs one non-empty row per"),
        ([{**REACH, "accelerations": "bmw+turbo"}], "unknown accelerations ['turbo']"),
        ([{**REACH, "onnx": None}], "set onnx (a starting model) or models_topic"),
        (
            [
                {"name": "c", "kind": "certify", "job": "knn", "topic": "t"},
                {"name": "i", "kind": "ior", "topic": "t", "eps": 0.1},
            ],
            "rule 'i' reads a certify rule's requests topic",
        ),
        ([{"name": "c", "kind": "certify", "job": "svm", "topic": "q"}], "rules.0.job"),
    ],
)
def test_new_rule_kinds_are_validated(rules, message):
    with pytest.raises(ConfigError) as e:
        parse_config(_config(rules))
    assert message in str(e.value)


def test_files_mode_needs_outputs_and_one_topic():
    files = {"decisions": "d.jsonl", "topic": "t"}
    base = {"alerts_file": "a", "dead_letter_file": "b"}
    with pytest.raises(ConfigError, match=r"outputs\.verifications_file"):
        parse_config({"files": files, "outputs": base, "rules": [REACH]})
    with pytest.raises(ConfigError, match="models_topic and other topics need"):
        parse_config(
            {
                "files": files,
                "outputs": {**base, "verifications_file": "v"},
                "rules": [{**REACH, "models_topic": "models"}],
            }
        )


def test_a_missing_model_file_is_named(tmp_path):
    from vigil.daemon.service import build_pipeline

    config = parse_config(_config([{**REACH, "onnx": str(tmp_path / "gone.onnx")}]))
    with pytest.raises(ValueError, match=r"rule 'v': cannot read onnx .*gone.onnx"):
        build_pipeline(config, Metrics())


def test_history_limit_bounds_each_partitions_history(tmp_path):
    rng = np.random.default_rng(5)
    x = rng.integers(0, 4, size=(400, 2)) / 4
    y = rng.integers(0, 2, size=400)
    sink = MemorySink()
    pipeline, source, rule = _pipeline(
        _decisions(x, y), FileStore(tmp_path), sink, history_limit=60
    )

    async def run():
        await source.start(pipeline.on_assign, pipeline.on_revoke)
        await pipeline.run(asyncio.Event(), until_idle=True)

    asyncio.run(run())
    monitor = rule.monitors[("t", 0)]
    assert monitor.size <= 60 and monitor.evicted + monitor.size == 400
    truth = witness_sets(x, y, 0.25)
    alerts = [orjson.loads(m.value) for m in sink.messages if m.topic == "vigil.alerts"]
    assert alerts
    for a in alerts:
        n, found = a["decision"]["id"], [w["id"] for w in a["witnesses"]]
        assert set(found) <= {j for j, _ in truth[n]}  # real witnesses only
        assert min(found) >= n - 60 - 37  # and only from the window
    with pytest.raises(ConfigError, match="history_limit"):
        parse_config(
            {
                "files": {"decisions": "unused", "topic": "t"},
                "outputs": {"alerts_file": "a", "dead_letter_file": "d"},
                "rules": [{"name": "r", "kind": "ior", "topic": "t", "eps": 1, "history_limit": 0}],
            }
        )


def test_a_batch_fetched_before_the_assignments_seek_is_read_again_in_order(tmp_path):
    """On restart the consumer may fetch from the committed offset while the assignment
    callback is still restoring an older snapshot and seeking back to it. Processing that
    batch first would put later decisions into the history before the replayed ones and
    skip those."""
    rng = np.random.default_rng(7)
    x = rng.integers(0, 8, size=(300, 3)) / 8
    y = rng.integers(0, 2, size=300)
    truth = witness_sets(x, y, 0.25)
    store, sink = FileStore(tmp_path, keep=3), MemorySink()

    async def first_run():  # up to offset 150, then the process dies
        pipeline, source, _ = _pipeline(_decisions(x, y), store, sink, every=100)
        await source.start(pipeline.on_assign, pipeline.on_revoke)
        while source._next < 150:
            await pipeline.process(await source.fetch(min(37, 150 - source._next), 0))
        await pipeline._flush_snapshots()
        return source.commits

    async def second_run(commits):
        pipeline, source, _ = _pipeline(_decisions(x, y), store, sink, every=100)
        source.commits, source._next = commits, 150
        fetched_at = dict(pipeline._seeks)
        early = await source.fetch(37, 0)  # offsets 150..186, before the callback's seek
        await source.start(pipeline.on_assign, pipeline.on_revoke)
        snapshot, _ = await store.load("r", source.tp)
        assert source._next == snapshot.offset < 150  # restored an older snapshot
        await pipeline.process(early, fetched_at)
        assert source._next == snapshot.offset  # dropped, and sought back to read again
        await pipeline.run(asyncio.Event(), until_idle=True)

    asyncio.run(second_run(asyncio.run(first_run())))
    alerts = [orjson.loads(m.value) for m in sink.messages if m.topic == "vigil.alerts"]
    got = {a["decision"]["id"]: [w["id"] for w in a["witnesses"]] for a in alerts}
    assert got == {n: [j for j, _ in ws] for n, ws in enumerate(truth) if ws}


class _HoldingReader:
    """Takes every batch to read, as the decode worker takes a backlog's, and leaves its
    events to the loop (the pipeline's own logic, without a process)."""

    def start(self) -> None:
        pass

    def read(self, records: list[Record]) -> asyncio.Future:
        done = asyncio.get_running_loop().create_future()
        done.set_result(Decoded())
        return done


class _AssignedInFirstFetch(MemorySource):
    """The assignment (its seek) comes while the first fetch is under way, and the fetch
    still returns records: as the Kafka client's can."""

    async def start(self, on_assign, on_revoke) -> None:
        self._on_assign, self._on_revoke = on_assign, on_revoke

    async def fetch(self, max_records: int, timeout_ms: int) -> list[Record]:
        if self._on_assign is not None:
            on_assign, self._on_assign = self._on_assign, None
            await on_assign([self.tp])
        return await super().fetch(max_records, timeout_ms)


def test_batches_held_for_their_read_ahead_survive_a_seek_in_order(tmp_path):
    """The batch fetched across the assignment is dropped and read again; the one fetched
    while it was held, before that re-read's seek, must be dropped too, not checked ahead
    of the records read again."""
    rng = np.random.default_rng(11)
    x = rng.integers(0, 8, size=(200, 3)) / 8
    y = rng.integers(0, 2, size=200)
    truth = witness_sets(x, y, 0.25)
    source = _AssignedInFirstFetch("t", _decisions(x, y))
    sink = MemorySink()
    pipeline, _, _ = _pipeline(None, FileStore(tmp_path, keep=3), sink, source=source)
    pipeline.reader = _HoldingReader()

    async def run() -> None:
        await source.start(pipeline.on_assign, pipeline.on_revoke)
        await pipeline.run(asyncio.Event(), until_idle=True)

    asyncio.run(run())
    alerts = [orjson.loads(m.value) for m in sink.messages if m.topic == "vigil.alerts"]
    got = {a["decision"]["id"]: [w["id"] for w in a["witnesses"]] for a in alerts}
    assert got == {n: [j for j, _ in ws] for n, ws in enumerate(truth) if ws}
    assert source.commits[-1] == {source.tp: 200}


class _LoggedSource(MemorySource):
    """Logs each fetch, beside the sink's deliveries in the same log."""

    def __init__(self, topic: str, values: list[bytes], log: list[str]) -> None:
        super().__init__(topic, values)
        self.log = log

    async def fetch(self, max_records: int, timeout_ms: int) -> list[Record]:
        self.log.append("fetch")
        return await super().fetch(max_records, timeout_ms)

    async def commit(self, offsets) -> None:
        self.log.append("commit")
        await super().commit(offsets)


class _SlowSink(MemorySink):
    """Acknowledges each delivery after a pause, as a broker does after a round trip."""

    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log

    async def deliver(self, messages, offsets) -> None:
        self.log.append("deliver")
        await asyncio.sleep(0.005)
        await super().deliver(messages, offsets)
        self.log.append("acknowledged")


def _run_logged(tmp_path, seed: int, log: list[str], reader) -> tuple:
    """300 decisions from a ``_LoggedSource`` to a ``_SlowSink``, logging to ``log``, read
    ahead by ``reader`` if one is given: (pipeline, source, sink, brute-force witnesses)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 8, size=(300, 3)) / 8
    y = rng.integers(0, 2, size=300)
    source, sink = _LoggedSource("t", _decisions(x, y), log), _SlowSink(log)
    pipeline, _, _ = _pipeline(None, FileStore(tmp_path), sink, source=source)
    pipeline.reader = reader

    async def run() -> None:
        await source.start(pipeline.on_assign, pipeline.on_revoke)
        await pipeline.run(asyncio.Event(), until_idle=True)

    asyncio.run(run())
    return pipeline, source, sink, witness_sets(x, y, 0.25)


@pytest.mark.parametrize("backlog", [False, True])
def test_a_backlogs_next_batch_is_fetched_while_a_delivery_is_acknowledged(tmp_path, backlog):
    """Live batches wait for the delivery before them to be acknowledged before the next
    fetch (a batch fetched meanwhile would wait for both); a backlog's batches, held while
    the worker reads them, do not, and the loop's wait is counted. Every commit still
    follows its answers' delivery, and the alerts are the brute-force ones."""
    log: list[str] = []
    reader = _HoldingReader() if backlog else None
    pipeline, source, sink, truth = _run_logged(tmp_path, 13, log, reader)
    fetched_meanwhile, delivering = 0, False
    for entry in log:
        delivering = entry == "deliver" or (delivering and entry != "acknowledged")
        fetched_meanwhile += delivering and entry == "fetch"
    assert (fetched_meanwhile > 0) == backlog
    deliveries = [e for e in log if e != "fetch"]
    assert deliveries.count("commit") >= 300 // 37
    assert all(
        deliveries[i - 1] == "acknowledged" for i, e in enumerate(deliveries) if e == "commit"
    )
    alerts = [orjson.loads(m.value) for m in sink.messages if m.topic == "vigil.alerts"]
    got = {a["decision"]["id"]: [w["id"] for w in a["witnesses"]] for a in alerts}
    assert got == {n: [j for j, _ in ws] for n, ws in enumerate(truth) if ws}
    assert source.commits[-1] == {source.tp: 300}
    assert pipeline.metrics.delivery_wait._value.get() > 0


class _SlowCommitSource(_LoggedSource):
    """Commits after a pause, as the group coordinator answers after a round trip; logs the
    commit's start and end."""

    async def commit(self, offsets) -> None:
        self.log.append(f"commit {offsets[self.tp]}")
        await asyncio.sleep(0.01)
        await MemorySource.commit(self, offsets)
        self.log.append("committed")


def test_at_least_once_the_next_answers_go_out_while_a_commit_is_under_way(tmp_path):
    """At least once, a delivery's answers go out while the commit before them is under
    way; yet each commit starts after its own answers are acknowledged and after the
    commit before it has ended, the offsets only grow, and the alerts are brute force's."""
    rng = np.random.default_rng(16)
    x = rng.integers(0, 8, size=(300, 3)) / 8
    y = rng.integers(0, 2, size=300)
    log: list[str] = []
    source, sink = _SlowCommitSource("t", _decisions(x, y), log), _SlowSink(log)
    pipeline, _, _ = _pipeline(None, FileStore(tmp_path), sink, source=source)
    pipeline.reader = _HoldingReader()

    async def run() -> None:
        await source.start(pipeline.on_assign, pipeline.on_revoke)
        await pipeline.run(asyncio.Event(), until_idle=True)

    asyncio.run(run())
    overlapped, committing, acknowledged, offsets = 0, False, 0, []
    for entry in log:
        if entry.startswith("commit "):
            assert not committing, "a commit started before the one before it ended"
            assert acknowledged > len(offsets), "a commit started before its answers' ack"
            committing = True
            offsets.append(int(entry.split()[1]))
        elif entry == "committed":
            committing = False
        elif entry == "deliver":
            overlapped += committing
        elif entry == "acknowledged":
            acknowledged += 1
    assert overlapped > 0
    assert offsets == sorted(offsets) and offsets[-1] == 300
    assert source.commits[-1] == {source.tp: 300}
    alerts = [orjson.loads(m.value) for m in sink.messages if m.topic == "vigil.alerts"]
    got = {a["decision"]["id"]: [w["id"] for w in a["witnesses"]] for a in alerts}
    truth = witness_sets(x, y, 0.25)
    assert got == {n: [j for j, _ in ws] for n, ws in enumerate(truth) if ws}


class _LoggedReader(_HoldingReader):
    """Logs each batch it takes by its first offset; a batch shorter than ``full`` it
    leaves to the loop, as the decode worker leaves live traffic's."""

    def __init__(self, log: list[str], full: int) -> None:
        self.log, self.full = log, full

    def read(self, records: list[Record]) -> asyncio.Future | None:
        if len(records) < self.full:
            return None
        self.log.append(f"read {records[0].offset}")
        return super().read(records)


def test_a_backlogs_batches_are_read_ahead_of_the_check_and_checked_in_order(tmp_path):
    """While a backlog's batch is checked, the worker already has the next
    ``READ_AHEAD_BATCHES``; the batches are still checked and committed in fetch order, the
    held ones before a batch the worker leaves to the loop, and the alerts are the
    brute-force ones."""
    log: list[str] = []
    reader = _LoggedReader(log, full=37)  # the last batch, of 4, is not read
    _, source, sink, truth = _run_logged(tmp_path, 14, log, reader)
    batches = -(-300 // 37)
    read = [e for e in log if e.startswith("read")]
    assert read == [f"read {37 * k}" for k in range(batches - 1)]
    deliveries = [i for i, e in enumerate(log) if e == "deliver"]
    assert len(deliveries) >= batches
    for k, at in enumerate(deliveries[: batches - 1]):  # the k-th batch's delivery
        ahead = sum(e.startswith("read") for e in log[:at])
        assert ahead == min(k + 1 + READ_AHEAD_BATCHES, batches - 1)
    commits = [c[source.tp] for c in source.commits]
    assert commits == sorted(commits) and commits[-1] == 300
    alerts = [orjson.loads(m.value) for m in sink.messages if m.topic == "vigil.alerts"]
    got = {a["decision"]["id"]: [w["id"] for w in a["witnesses"]] for a in alerts}
    assert got == {n: [j for j, _ in ws] for n, ws in enumerate(truth) if ws}


class _SlowReader(_HoldingReader):
    """Finishes each reading ``seconds`` after it was asked for, as a busy worker does."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def read(self, records: list[Record]) -> asyncio.Future:
        done = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(self.seconds, done.set_result, Decoded())
        return done


def test_the_loops_wait_for_the_decode_worker_is_counted(tmp_path):
    """``vigil_decode_wait_seconds`` holds the time the loop waited for readings that were
    not done when their batch's turn came, and next to nothing for readings that were."""
    rng = np.random.default_rng(15)
    x = rng.integers(0, 8, size=(300, 3)) / 8
    y = rng.integers(0, 2, size=300)
    truth = witness_sets(x, y, 0.25)
    waited = {}
    for name, reader in (("slow", _SlowReader(0.05)), ("ready", _HoldingReader())):
        sink = MemorySink()
        pipeline, source, _ = _pipeline(_decisions(x, y), FileStore(tmp_path / name), sink)
        pipeline.reader = reader

        async def run(pipeline=pipeline, source=source) -> None:
            await source.start(pipeline.on_assign, pipeline.on_revoke)
            await pipeline.run(asyncio.Event(), until_idle=True)

        asyncio.run(run())
        waited[name] = pipeline.metrics.decode_wait._value.get()
        alerts = [orjson.loads(m.value) for m in sink.messages if m.topic == "vigil.alerts"]
        got = {a["decision"]["id"]: [w["id"] for w in a["witnesses"]] for a in alerts}
        assert got == {n: [j for j, _ in ws] for n, ws in enumerate(truth) if ws}
    assert waited["slow"] > 0.05  # the first reading alone is waited for whole
    assert waited["ready"] < waited["slow"] / 10


def test_a_backlog_decoded_in_the_worker_gives_the_loops_alerts_and_dead_letters(tmp_path):
    rng = np.random.default_rng(12)
    x = rng.integers(0, 8, size=(4000, 3)) / 8
    y = rng.integers(0, 2, size=4000)
    values = _decisions(x, y)
    bad = {  # offsets in the stream: each kind in the worker's batches and in the loop's;
        # the first batch has none (the worker read all of it: one run of decisions)
        1500: b'{"id": "b", "model": "m", "x": [0.5], "y": 1}',
        2500: b'{"id": "c", "model": "m", "x": [0.5, "a", 1], "y": 1}',
        3500: b"{not json",
        3999: b'{"id": "d", "model": "m", "x": [0.5, 1e999, 1], "y": 1}',
    }
    for at, value in sorted(bad.items()):
        values.insert(at, value)
    truth = witness_sets(x, y, 0.25)

    def outputs(reader) -> tuple[list, list]:
        sink, source = MemorySink(), MemorySource("t", values)
        store = FileStore(tmp_path / str(id(sink)), keep=3)
        pipeline, _, _ = _pipeline(None, store, sink, source=source)
        pipeline.settings = PipelineSettings("dead", max_batch=1500, snapshot_every_events=10**6)
        pipeline.reader = reader

        async def run() -> None:
            await source.start(pipeline.on_assign, pipeline.on_revoke)
            await pipeline.run(asyncio.Event(), until_idle=True)

        try:
            asyncio.run(run())
        finally:
            if reader is not None:
                reader.close()
        out = {"vigil.alerts": [], "dead": []}
        for m in sink.messages:
            out[m.topic].append(orjson.loads(m.value))
        return out["vigil.alerts"], out["dead"]

    metrics = Metrics()
    alerts, dead = outputs(DecodeWorker({"t"}, metrics))
    assert metrics.decode_worker_events._value.get() >= 2900  # two batches of 1,500
    got = {a["decision"]["id"]: [w["id"] for w in a["witnesses"]] for a in alerts}
    assert got == {n: [j for j, _ in ws] for n, ws in enumerate(truth) if ws}
    assert [d["source"]["offset"] for d in dead] == sorted(bad)
    loop_alerts, loop_dead = outputs(None)
    assert [a["decision"] for a in alerts] == [a["decision"] for a in loop_alerts]
    assert [(d["reason"], d["error"]) for d in dead] == [
        (d["reason"], d["error"]) for d in loop_dead
    ]


def test_a_bad_model_file_stops_the_daemon_at_startup(tmp_path):
    from tests.onnx_models import mlp
    from vigil.daemon.service import build_pipeline

    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"\x08garbage")
    config = parse_config(_config([{**REACH, "onnx": str(corrupt)}]))
    with pytest.raises(ValueError, match=r"rule 'v': onnx .*corrupt.onnx: not an ONNX model"):
        build_pipeline(config, Metrics())
    three = tmp_path / "three.onnx"  # 3 outputs, the spec's C has 2 columns
    three.write_bytes(mlp([(np.ones((2, 4)), np.zeros(4)), (np.ones((4, 3)), np.zeros(3))]))
    config = parse_config(_config([{**REACH, "onnx": str(three)}]))
    with pytest.raises(ValueError, match="has 3 outputs, the spec C has 2 columns"):
        build_pipeline(config, Metrics())


def _run_rule(tmp_path, events: list[dict], **options) -> tuple[dict, list[dict]]:
    """Alerts (decision id -> witness ids) and dead letters of one ior rule over ``events``."""
    sink = MemorySink()
    values = [orjson.dumps(e) for e in events]
    pipeline, source, _ = _pipeline(values, FileStore(tmp_path), sink, **options)

    async def run():
        await source.start(pipeline.on_assign, pipeline.on_revoke)
        await pipeline.run(asyncio.Event(), until_idle=True)

    asyncio.run(run())
    alerts = [orjson.loads(m.value) for m in sink.messages if m.topic == "vigil.alerts"]
    dead = [orjson.loads(m.value) for m in sink.messages if m.topic == "dead"]
    return {a["decision"]["id"]: [w["id"] for w in a["witnesses"]] for a in alerts}, dead


def test_named_features_are_read_in_the_rules_order(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.integers(0, 8, size=(200, 3)) / 8
    y = rng.integers(0, 2, size=200)
    names = ["income", "age", "debt"]
    rows = [dict(zip(names, row, strict=True)) for row in x.tolist()]
    events = [{"id": i, "model": "m", "features": rows[i], "y": int(y[i])} for i in range(200)]
    events[50]["features"].pop("debt")
    order = ["debt", "age", "income"]  # reversed: the scale below makes the order matter
    got, dead = _run_rule(tmp_path, events, features=order, scale=[1.0, 1.0, 4.0])
    keep = [i for i in range(200) if i != 50]
    truth = witness_sets(x[keep][:, ::-1], y[keep], 0.25, scale=np.array([1.0, 1.0, 4.0]))
    assert got == {keep[n]: [keep[j] for j, _ in ws] for n, ws in enumerate(truth) if ws}
    assert [(d["source"]["offset"], d["reason"]) for d in dead] == [(50, "schema")]
    assert "'debt'" in dead[0]["error"]


def test_an_embedding_rule_compares_the_embeddings(tmp_path):
    rng = np.random.default_rng(4)
    e = rng.integers(0, 8, size=(150, 2)) / 8
    y = rng.integers(0, 2, size=150)
    events = [
        {"id": i, "model": "m", "x": [9.0, float(i)], "embedding": e[i].tolist(), "y": int(y[i])}
        for i in range(150)
    ]
    del events[7]["embedding"]
    got, dead = _run_rule(tmp_path, events, input="embedding")
    keep = [i for i in range(150) if i != 7]
    truth = witness_sets(e[keep], y[keep], 0.25)
    assert got == {keep[n]: [keep[j] for j, _ in ws] for n, ws in enumerate(truth) if ws}
    assert [d["source"]["offset"] for d in dead] == [7] and "no embedding" in dead[0]["error"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"features": ["a", "b"], "input": "embedding"}, "exclude each other"),
        ({"features": ["a", "a"]}, "distinct"),
        ({"features": ["a", "b"], "dim": 3}, "dim is 3"),
        ({"features": ["a", "b"], "ignore": [2]}, "ignore"),
    ],
)
def test_input_options_are_validated(options, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(
            {
                "files": {"decisions": "unused", "topic": "t"},
                "outputs": {"alerts_file": "a", "dead_letter_file": "d"},
                "rules": [{"name": "r", "kind": "ior", "topic": "t", "eps": 1, **options}],
            }
        )


def test_a_quantitative_rule_reports_and_filters_by_the_largest_ratio(tmp_path):
    rng = np.random.default_rng(6)
    x = rng.integers(0, 8, size=(200, 2)) / 8
    y = rng.integers(0, 3, size=200)
    events = [{"id": i, "model": "m", "x": x[i].tolist(), "y": int(y[i])} for i in range(200)]
    sink = MemorySink()
    pipeline, source, _ = _pipeline(
        [orjson.dumps(e) for e in events], FileStore(tmp_path), sink, ratio_threshold=5.0
    )

    async def run():
        await source.start(pipeline.on_assign, pipeline.on_revoke)
        await pipeline.run(asyncio.Event(), until_idle=True)

    asyncio.run(run())
    alerts = [orjson.loads(m.value) for m in sink.messages if m.topic == "vigil.alerts"]
    truth, ratios = witness_sets(x, y, 0.25), largest_ratios(x, y, 0.25)
    above = {n for n, (r, _) in enumerate(ratios) if truth[n] and r > 5.0}
    assert {a["decision"]["id"] for a in alerts} == above and above
    validator = jsonschema.Draft202012Validator(schema("alert"))
    for a in alerts:
        validator.validate(a)
        r, j = ratios[a["decision"]["id"]]
        assert a["lipschitz"] == {"ratio": r if np.isfinite(r) else None, "witness": j}


def _linear_embedding(tmp_path: Path) -> tuple[Path, np.ndarray]:
    """An ONNX model y = W x whose outputs are exact in float32 on a 1/8 grid."""
    w = np.array([[1.0, 1.0, 0.0], [0.0, 1.0, -1.0]]) / 2
    path = tmp_path / "embed.onnx"
    path.write_bytes(Network.from_arrays([(w, np.zeros(2))]).to_onnx())
    return path, w


def test_an_embedding_model_maps_the_inputs_before_they_are_compared(tmp_path):
    rng = np.random.default_rng(7)
    x = rng.integers(0, 8, size=(200, 3)) / 8
    y = rng.integers(0, 2, size=200)
    path, w = _linear_embedding(tmp_path)
    events = [{"id": i, "model": "m", "x": x[i].tolist(), "y": int(y[i])} for i in range(200)]
    events[9]["x"] = [0.5, 0.5]  # the model takes three features
    got, dead = _run_rule(tmp_path, events, embedding_onnx=str(path))
    keep = [i for i in range(200) if i != 9]
    truth = witness_sets(x[keep] @ w.T, y[keep], 0.25)
    expected = {keep[n]: [keep[j] for j, _ in ws] for n, ws in enumerate(truth) if ws}
    raw = witness_sets(x[keep], y[keep], 0.25)
    assert expected != {keep[n]: [keep[j] for j, _ in ws] for n, ws in enumerate(raw) if ws}
    assert got == expected
    assert [d["source"]["offset"] for d in dead] == [9]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"input": "embedding"}, "input = 'embedding'"),
        ({"ignore": [0]}, "ignore and scale"),
    ],
)
def test_embedding_onnx_options_are_validated(tmp_path, options, message):
    path, _ = _linear_embedding(tmp_path)
    with pytest.raises(ConfigError, match=message):
        _pipeline([], FileStore(tmp_path), embedding_onnx=str(path), **options)


def test_a_bad_embedding_model_is_named_at_startup(tmp_path):
    path, _ = _linear_embedding(tmp_path)
    with pytest.raises(ValueError, match=r"rule 'r': cannot read embedding_onnx .*gone.onnx"):
        _pipeline([], FileStore(tmp_path), embedding_onnx=str(tmp_path / "gone.onnx"))
    with pytest.raises(ValueError, match=r"rule 'r': embedding_onnx .* takes 3 features"):
        _pipeline([], FileStore(tmp_path), embedding_onnx=str(path), dim=4)
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    with pytest.raises(ValueError, match=r"rule 'r': embedding_onnx .*junk.onnx"):
        _pipeline([], FileStore(tmp_path), embedding_onnx=str(tmp_path / "junk.onnx"))


@pytest.mark.parametrize(
    ("first", "then", "stale"),
    [
        ({}, {"eps": 0.125}, True),
        ({}, {"metric": "l1"}, True),
        ({"backend": "bruteforce"}, {"backend": "kdtree"}, False),
    ],
)
def test_a_snapshot_taken_under_another_comparison_is_not_restored(tmp_path, first, then, stale):
    """After a restart with a changed comparison, the partition is replayed from its start,
    so decisions after the commit get the witnesses the new configuration defines; a new
    backend only re-indexes the restored history."""
    rng = np.random.default_rng(8)
    x = rng.integers(0, 8, size=(300, 2)) / 8
    y = rng.integers(0, 2, size=300)
    values = _decisions(x, y)
    store, sink = FileStore(tmp_path), MemorySink()

    async def run(limit: int, commits, options):
        pipeline, source, _ = _pipeline(values[:limit], store, sink, **options)
        source.commits = commits
        await source.start(pipeline.on_assign, pipeline.on_revoke)
        await pipeline.run(asyncio.Event(), until_idle=True)
        await pipeline._flush_snapshots()
        return source.commits, pipeline.metrics

    commits, _ = asyncio.run(run(200, [], first))
    sink.messages.clear()
    _, metrics = asyncio.run(run(300, commits, {**first, **then}))
    options = {"eps": 0.25, "metric": "linf", **then}
    truth = witness_sets(x, y, options["eps"], metric=options["metric"])
    expected = {n: [j for j, _ in ws] for n, ws in enumerate(truth) if ws and n >= 200}
    alerts = [orjson.loads(m.value) for m in sink.messages if m.topic == "vigil.alerts"]
    assert {a["decision"]["id"]: [w["id"] for w in a["witnesses"]] for a in alerts} == expected
    ignored = metrics.snapshots.labels("ignored_stale")._value.get()
    assert ignored == (1 if stale else 0)


class _FailingSink(MemorySink):
    """Refuses its second delivery that carries messages, as a broker outage would."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    async def deliver(self, messages, offsets) -> None:
        self.calls += messages != []
        if self.calls == 2 and messages:
            raise ConnectionError("broker unavailable")
        await super().deliver(messages, offsets)


def test_a_failed_delivery_is_not_committed_by_the_shutdown(tmp_path):
    """After a delivery fails, shutdown neither commits nor snapshots past it, so the restart
    re-emits the alerts that never went out: every alert is delivered at least once."""
    values = [
        orjson.dumps({"id": i, "model": "m", "x": [0.0, 0.0], "y": i % 2}) for i in range(80)
    ]  # batches of 37: the second one's delivery fails
    store, sink = FileStore(tmp_path), _FailingSink()

    async def first_run():
        pipeline, source, _ = _pipeline(values, store, sink, every=1)
        await source.start(pipeline.on_assign, pipeline.on_revoke)
        running = asyncio.ensure_future(pipeline.run(asyncio.Event(), until_idle=True))
        with pytest.raises(ConnectionError):
            await running
        pending = await _shutdown(pipeline, running, time.monotonic() + 1.0, 1.0)
        assert pending == ["a failed delivery (its records are read again after the restart)"]
        return source.commits

    commits = asyncio.run(first_run())
    delivered = {orjson.loads(m.value)["decision"]["id"] for m in sink.messages}
    assert delivered == set(range(1, 37)) and commits[-1] == {("t", 0): 37}
    newest, _ = asyncio.run(store.load("r", ("t", 0)))
    # the first batch's snapshot is written only if its write ran before the failure
    assert newest is None or newest.offset <= 37

    async def restart():
        pipeline, source, _ = _pipeline(values, store, sink)
        source.commits = list(commits)
        await source.start(pipeline.on_assign, pipeline.on_revoke)
        await pipeline.run(asyncio.Event(), until_idle=True)

    asyncio.run(restart())
    alerts = [orjson.loads(m.value) for m in sink.messages if m.topic == "vigil.alerts"]
    assert {a["decision"]["id"] for a in alerts} == set(range(1, 80))


def test_decisions_numpy_cannot_hold_are_dead_letters(tmp_path):
    """Empty inputs on a fresh partition and labels beyond 64 bits used to stop the daemon;
    they are dead letters and the decisions after them are still checked."""
    bad = [
        orjson.dumps({"id": "empty", "model": "m", "x": [], "y": 0}),
        orjson.dumps({"id": "huge", "model": "m", "x": [0.0, 0.0], "y": 2**63}),
    ]
    good = _decisions(np.zeros((3, 2)), np.array([0, 1, 0]))
    sink = MemorySink()

    async def run(values):
        pipeline, source, _ = _pipeline(values, FileStore(tmp_path / str(len(values))), sink)
        await source.start(pipeline.on_assign, pipeline.on_revoke)
        await pipeline.run(asyncio.Event(), until_idle=True)

    asyncio.run(run(bad[:1]))  # alone in its batch: no width known yet
    asyncio.run(run(bad + good))
    dead = [orjson.loads(m.value) for m in sink.messages if m.topic == "dead"]
    assert [(d["source"]["offset"], d["reason"]) for d in dead] == [
        (0, "schema"),
        (0, "schema"),
        (1, "schema"),
    ]
    alerts = [orjson.loads(m.value) for m in sink.messages if m.topic == "vigil.alerts"]
    assert sorted(a["decision"]["id"] for a in alerts) == [1, 2]


def test_a_large_witness_set_keeps_its_nearest_members_and_says_so(tmp_path):
    rng = np.random.default_rng(5)
    x = rng.integers(0, 8, size=(120, 2)) / 16
    y = rng.integers(0, 2, size=120)
    truth = witness_sets(x, y, 0.25)
    sink = MemorySink()

    async def run():
        values = _decisions(x, y)
        pipeline, source, _ = _pipeline(values, FileStore(tmp_path), sink, max_witnesses=3)
        await source.start(pipeline.on_assign, pipeline.on_revoke)
        await pipeline.run(asyncio.Event(), until_idle=True)

    asyncio.run(run())
    alerts = {orjson.loads(m.value)["decision"]["id"]: orjson.loads(m.value) for m in sink.messages}
    validator = jsonschema.Draft202012Validator(schema("alert"))
    assert len(alerts) == sum(1 for ws in truth if ws)
    cut = 0
    for n, ws in enumerate(truth):
        if not ws:
            continue
        alert = alerts[n]
        validator.validate(alert)
        distances = sorted(d for _, d in ws)
        got = [(w["id"], w["distance"]) for w in alert["witnesses"]]
        assert [j for j, _ in got] == sorted(j for j, _ in got)  # history order
        assert len(got) == min(3, len(ws))
        assert {j for j, _ in got} <= {j for j, _ in ws}
        assert max(d for _, d in got) <= distances[min(3, len(ws)) - 1] + 1e-12
        if len(ws) > 3:
            cut += 1
            assert alert["witness_count"] == len(ws) and alert["witnesses_truncated"] is True
        else:
            assert "witness_count" not in alert
    assert cut > 10


def test_a_failing_lag_query_does_not_stop_the_pipeline(tmp_path):
    class Rebalancing(MemorySource):
        async def lag(self):
            raise AssertionError("Partition is not assigned")

    values = _decisions(np.zeros((3, 2)), np.array([0, 1, 0]))
    sink = MemorySink()

    async def run():
        pipeline, source, _ = _pipeline(
            [], FileStore(tmp_path), sink, source=Rebalancing("t", values)
        )
        await source.start(pipeline.on_assign, pipeline.on_revoke)
        await pipeline.run(asyncio.Event(), until_idle=True)
        return source.commits

    assert asyncio.run(run())[-1] == {("t", 0): 3}
    assert sorted(orjson.loads(m.value)["decision"]["id"] for m in sink.messages) == [1, 2]


def test_every_configurable_rule_kind_has_one_adapter():
    from vigil.daemon.adapters import KINDS
    from vigil.daemon.config import RULE_KINDS

    assert sorted(KINDS) == sorted(RULE_KINDS)
    assert all(KINDS[kind].kind == kind for kind in RULE_KINDS)


class _RecordingStore(FileStore):
    """Saves slowly and records how many saves of one (rule, partition) overlap; the first
    ``failures`` saves raise."""

    def __init__(self, root, failures: int = 0) -> None:
        super().__init__(root)
        self.failures = failures
        self.active: dict[tuple, int] = {}
        self.most = 0
        self.lock = threading.Lock()

    def _save(self, rule, tp, offset, blob, committed):
        with self.lock:
            self.active[(rule, tp)] = self.active.get((rule, tp), 0) + 1
            self.most = max(self.most, self.active[(rule, tp)])
            fail = self.failures > 0
            self.failures -= fail
        try:
            time.sleep(0.05)
            if fail:
                raise OSError("disk full")
            return super()._save(rule, tp, offset, blob, committed)
        finally:
            with self.lock:
                self.active[(rule, tp)] -= 1


def test_snapshot_writes_of_one_partition_never_overlap_and_failures_are_counted(tmp_path):
    rng = np.random.default_rng(5)
    values = _decisions(rng.integers(0, 8, size=(300, 3)) / 8, rng.integers(0, 2, size=300))
    store = _RecordingStore(tmp_path, failures=2)

    async def run():
        pipeline, source, _ = _pipeline(values, store, every=10)  # a snapshot every batch
        await source.start(pipeline.on_assign, pipeline.on_revoke)
        await pipeline.run(asyncio.Event(), until_idle=True)
        await pipeline.snapshot_all()
        return pipeline

    pipeline = asyncio.run(run())
    assert store.most == 1
    text = pipeline.metrics.render().decode()
    assert 'vigil_snapshots_total{outcome="failed"} 2.0' in text
    assert 'vigil_snapshots_total{outcome="written"}' in text
    newest, _ = asyncio.run(store.load("r", ("t", 0)))
    assert newest.offset == 300


def test_atomic_writes_of_one_path_from_two_threads_never_collide(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from vigil.connectors.files import atomic_write

    path = tmp_path / "x.snap"
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: atomic_write(path, str(i).encode() * 1000), range(200)))
    assert path.read_bytes() in {str(i).encode() * 1000 for i in range(200)}  # one, whole
    assert [p.name for p in tmp_path.iterdir()] == ["x.snap"]


def test_the_default_transactional_id_differs_between_hosts_and_not_between_restarts():
    kafka = parse_config(
        {
            "kafka": {"bootstrap_servers": "b:9092", "exactly_once": True},
            "rules": [{"name": "r", "kind": "ior", "topic": "t", "eps": 0.1}],
        }
    ).kafka
    assert kafka.instance_transactional_id("a") == kafka.instance_transactional_id("a")
    assert kafka.instance_transactional_id("a") != kafka.instance_transactional_id("b")
    fixed = kafka.model_copy(update={"transactional_id": "mine"})
    assert fixed.instance_transactional_id("a") == fixed.instance_transactional_id("b") == "mine"


def test_a_new_group_never_restores_a_snapshot_past_where_it_starts(tmp_path):
    """A broker reset (or a new group id) with the old state dir kept: the old snapshots are
    ahead of where the new group starts, and using them would skip every record."""
    rng = np.random.default_rng(4)
    x = rng.integers(0, 8, size=(300, 3)) / 8
    y = rng.integers(0, 2, size=300)
    store = FileStore(tmp_path)

    async def run(values, sink):
        pipeline, source, _ = _pipeline(values, store, sink)
        await source.start(pipeline.on_assign, pipeline.on_revoke)
        await pipeline.run(asyncio.Event(), until_idle=True)
        await pipeline.snapshot_all()

    asyncio.run(run(_decisions(x, y), MemorySink()))
    assert asyncio.run(store.load("r", ("t", 0)))[0].offset == 300
    x2, y2 = x[::-1].copy(), y[::-1].copy()  # another stream in the new cluster
    sink = MemorySink()
    asyncio.run(run(_decisions(x2, y2), sink))
    alerts = [orjson.loads(m.value) for m in sink.messages if m.topic == "vigil.alerts"]
    truth = witness_sets(x2, y2, 0.25)
    expected = {n: [j for j, _ in ws] for n, ws in enumerate(truth) if ws}
    assert {a["decision"]["id"]: [w["id"] for w in a["witnesses"]] for a in alerts} == expected


async def test_the_daemon_runs_with_one_blas_thread_and_restores_the_callers(tmp_path, monkeypatch):
    from threadpoolctl import threadpool_info

    from vigil.daemon import service

    def blas_threads() -> set[int]:
        return {p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"}

    before = blas_threads()
    if before == {1}:
        pytest.skip("numpy's BLAS runs one thread here already (one core, or set so)")
    during: list[set[int]] = []
    real_run = service._run

    async def recording(*args, **kwargs):
        during.append(blas_threads())
        return await real_run(*args, **kwargs)

    monkeypatch.setattr(service, "_run", recording)
    (tmp_path / "d.jsonl").write_bytes(b'{"id": "a", "model": "m", "x": [0, 1], "y": 1}\n')
    config = parse_config(
        {
            "files": {"decisions": str(tmp_path / "d.jsonl")},
            "outputs": {
                "alerts_file": str(tmp_path / "alerts.jsonl"),
                "dead_letter_file": str(tmp_path / "dead.jsonl"),
            },
            "metrics": {"enabled": False},
            "state": {"dir": str(tmp_path / "state")},
            "rules": [{"name": "r", "kind": "ior", "topic": "decisions", "eps": 0.1}],
        }
    )
    await service.run_daemon(config, until_idle=True)
    assert during == [{1}]
    assert blas_threads() == before
