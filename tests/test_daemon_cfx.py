"""The cfx rule in the full pipeline (file source and sink, real worker pool): counterfactuals
that arrive with decisions get their APΔS delta_max, as computing it directly gives."""

from __future__ import annotations

import asyncio
import json
import re
from importlib.resources import files

import jsonschema
import numpy as np
import orjson

from tests.delivery import answers_within_commits
from tests.oracle import witness_sets
from vigil.connectors.memory import MemorySink, MemorySource
from vigil.daemon.adapters import CfxRule, IorRule, RuleContext
from vigil.daemon.config import parse_config
from vigil.daemon.metrics import Metrics
from vigil.daemon.offload import OffloadPool, process_executor
from vigil.daemon.pipeline import Pipeline, PipelineSettings
from vigil.daemon.service import run_daemon
from vigil.daemon.state import FileStore
from vigil.rules.certify.cfx.certify import certify_rows
from vigil.rules.reach.network import Network


async def test_counterfactuals_with_decisions_are_certified(tmp_path):
    rng = np.random.default_rng(3)
    net = Network.from_arrays(
        [(rng.normal(size=(8, 3)), rng.normal(size=8)), (rng.normal(size=(1, 8)), np.zeros(1))],
        output="sigmoid",
    )
    (tmp_path / "model.onnx").write_bytes(net.to_onnx())
    x = rng.uniform(0, 1, size=(40, 3))
    accepted = x[net.logits(x)[:, 0] >= 0.5][:4]  # counterfactuals: accepted with a margin
    events = []
    for i in range(12):
        event = {"id": f"d{i}", "model": "credit", "x": x[i].tolist(), "y": 0}
        if i < len(accepted):
            event["cfx"] = accepted[i].tolist()
        events.append(orjson.dumps(event))
    events.append(
        orjson.dumps({"id": "bad", "model": "credit", "x": [0, 0, 0], "y": 0, "cfx": [1]})
    )
    (tmp_path / "decisions.jsonl").write_bytes(b"\n".join(events) + b"\n")
    config = parse_config(
        {
            "files": {"decisions": str(tmp_path / "decisions.jsonl")},
            "outputs": {
                "alerts_file": str(tmp_path / "alerts.jsonl"),
                "dead_letter_file": str(tmp_path / "dead.jsonl"),
                "certifications_file": str(tmp_path / "certs.jsonl"),
            },
            "metrics": {"enabled": False},
            "state": {"dir": str(tmp_path / "state")},
            "offload": {"workers": 2},
            "rules": [
                {
                    "name": "cfx",
                    "kind": "cfx",
                    "topic": "decisions",
                    "model": "credit",
                    "onnx": str(tmp_path / "model.onnx"),
                    "min_delta": 0.01,
                }
            ],
        }
    )
    await run_daemon(config, until_idle=True)
    certs = [orjson.loads(line) for line in (tmp_path / "certs.jsonl").read_bytes().splitlines()]
    schema = json.loads((files("vigil.connectors") / "schemas" / "certification.json").read_text())
    assert sorted(c["decision"]["id"] for c in certs) == [f"d{i}" for i in range(len(accepted))]
    for c in certs:
        jsonschema.validate(c, schema)
        i = int(c["decision"]["id"][1:])
        (want,) = certify_rows(net, accepted[i : i + 1], 1, 0.999, 0.995)
        (got,) = c["result"]["results"]
        assert c["status"] == "ok" and got["delta_max"] == want["delta_max"]
        assert c["robust"] == (want["delta_max"] >= 0.01)
    dead = [orjson.loads(line) for line in (tmp_path / "dead.jsonl").read_bytes().splitlines()]
    assert [(d["reason"], "expects 3" in d["error"]) for d in dead] == [("schema", True)]


async def test_exactly_once_alerts_behind_a_running_cfx_job_wait_for_its_commit(tmp_path):
    """A cfx job holds its decision's commit; the ior alerts of later decisions of the same
    partition go out in the transaction that commits them, and the job no longer blocks the
    batch it came in."""
    rng = np.random.default_rng(4)
    net = Network.from_arrays(
        [(rng.normal(size=(8, 3)), rng.normal(size=8)), (rng.normal(size=(1, 8)), np.zeros(1))],
        output="sigmoid",
    )
    (tmp_path / "model.onnx").write_bytes(net.to_onnx())
    x = rng.integers(0, 4, size=(60, 3)) / 4
    y = rng.integers(0, 2, size=60)
    candidates = rng.uniform(0, 1, size=(200, 3))
    cfx = candidates[np.argmax(net.logits(candidates)[:, 0])]
    values = []
    for i in range(60):
        event = {"id": i, "model": "credit", "x": x[i].tolist(), "y": int(y[i])}
        if i == 5:
            event["cfx"] = cfx.tolist()
        values.append(orjson.dumps(event))
    config = parse_config(
        {
            "files": {"decisions": "unused", "topic": "t"},
            "outputs": {"alerts_file": "a", "dead_letter_file": "d", "certifications_file": "c"},
            "rules": [
                {"name": "fair", "kind": "ior", "topic": "t", "eps": 0.3},
                {"name": "cfx", "kind": "cfx", "topic": "t", "onnx": str(tmp_path / "model.onnx")},
            ],
        }
    )
    metrics = Metrics()
    pool = OffloadPool(lambda: process_executor(1), 1, metrics, 8, 60.0, "default")
    context = RuleContext(metrics, pool, lambda *a: pool, "v", "certs", "dead")
    rules = [IorRule(config.rules[0]), CfxRule(config.rules[1], context)]
    source, sink = MemorySource("t", values), MemorySink(commits_offsets=True)
    settings = PipelineSettings("dead", fetch_timeout_ms=10)
    pipeline = Pipeline(rules, source, sink, FileStore(tmp_path), metrics, settings)
    try:
        await source.start(pipeline.on_assign, pipeline.on_revoke)
        await pipeline.process(await source.fetch(100, 0))
        assert rules[1].hold(("t", 0)) == 5  # the batch returned with the job still running
        assert sink.deliveries[-1][1] == {("t", 0): 5}
        assert _outbox(metrics) > 0  # the later decisions' alerts
        await pipeline.run(asyncio.Event(), until_idle=True)
        assert _outbox(metrics) == 0
    finally:
        pool.shutdown()
    events, committed = answers_within_commits(sink, ("t", 0))
    answered = [(topic, event.get("decision", {}).get("id")) for topic, event in events]
    assert committed == 60
    truth = witness_sets(x, y, 0.3)
    flagged = [n for n, ws in enumerate(truth) if ws]
    assert any(n > 5 for n in flagged)
    assert sorted(a for a in answered if a[0] == "vigil.alerts") == [
        ("vigil.alerts", n) for n in flagged
    ]
    assert [a for a in answered if a[0] == "certs"] == [("certs", 5)]


def _outbox(metrics: Metrics) -> float:
    return float(re.search(rb"^vigil_outbox_messages (\S+)$", metrics.render(), re.M)[1])
