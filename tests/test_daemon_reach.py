"""The reach rule on the real broker: decisions and model updates in, verification events out."""

from __future__ import annotations

import base64
import json
import signal
from importlib.resources import files

import jsonschema
import numpy as np
import orjson

from tests.daemon_harness import Daemon, consume_all, produce
from tests.milp_oracle import max_violation
from vigil.rules.reach.network import Network, OnnxRunner
from vigil.rules.reach.sets import InputSet, OutputSpec

EPS = 0.05


def networks() -> tuple[Network, Network, OutputSpec]:
    """v1 satisfies the spec on [0, 1]^3 widened by EPS; v2 (output bias + 1) violates it."""
    rng = np.random.default_rng(8)
    v1 = Network.from_arrays(
        [(rng.normal(size=(8, 3)), rng.normal(size=8)), (rng.normal(size=(2, 8)), np.zeros(2))]
    )
    box = InputSet(np.full(3, -EPS), np.full(3, 1 + EPS))
    c = np.eye(2)
    worst, _ = max_violation(v1, box, OutputSpec(c, np.zeros(2)))
    spec = OutputSpec(c, np.full(2, worst + 0.1))
    v2 = Network(v1.weights, (v1.biases[0], v1.biases[1] + 1.0))
    return v1, v2, spec


def rule_toml(spec: OutputSpec, branches: int = 512, complete: float = 0.0) -> str:
    return f"""
[[rules]]
name = "reach"
kind = "reach"
topic = "decisions-{{tag}}"
model = "m"
models_topic = "models-{{tag}}"
onnx = "model.onnx"
window = 200
eps = {EPS}
C = {spec.C.tolist()}
d = {spec.d.tolist()}
max_branches = {branches}
accelerations = "bmi+lb+bmw+ic"
complete_seconds = {complete}
"""


def decisions(x: np.ndarray) -> list[bytes]:
    return [
        orjson.dumps({"id": f"r{i}", "model": "m", "x": row.tolist(), "y": 0})
        for i, row in enumerate(x)
    ]


async def assert_violated_after_the_update(
    bootstrap: str, daemon: Daemon, before: int, v2: Network, spec: OutputSpec
) -> None:
    """The verification events so far match their schema, and the last one of version 2
    is violated with a counterexample in the box that onnxruntime confirms."""
    events = await consume_all(bootstrap, daemon.verifications_topic, before + 1, 90, settle=1.0)
    schema = json.loads((files("vigil.connectors") / "schemas" / "verification.json").read_text())
    for e in events:
        jsonschema.validate(e, schema)
    after = [e for e in events if e["version"] == "2"]
    assert after, daemon.log_text()
    violated = after[-1]
    assert violated["status"] == "violated", violated
    point = np.array([violated["counterexample"]])
    assert InputSet(np.full(3, -EPS), np.full(3, 1 + EPS)).contains(point, tol=1e-9)[0]
    assert spec.violation(OnnxRunner(v2.to_onnx())(point))[0] > 0


async def test_verification_events_follow_decisions_and_model_updates(kafka_bootstrap, tmp_path):
    v1, v2, spec = networks()
    (tmp_path / "model.onnx").write_bytes(v1.to_onnx())
    daemon = Daemon(kafka_bootstrap, tmp_path, extra_rules=rule_toml(spec))
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, size=(60, 3))
    x[0], x[1] = 0.0, 1.0  # the window's box is [0, 1]^3
    await produce(kafka_bootstrap, daemon.topic, decisions(x), key=b"m")
    other = {"model": "other", "version": "9", "uri": "file:///nonexistent.onnx"}
    await produce(kafka_bootstrap, daemon.topic_for("models"), [orjson.dumps(other)], key=b"o")
    daemon.start()
    try:
        first = await consume_all(kafka_bootstrap, daemon.verifications_topic, 1, 90, settle=1.0)
        assert first, daemon.log_text()
        event = first[-1]
        assert event["status"] == "holds", event
        assert event["version"] == "file:model.onnx" and event["model"] == "m"
        assert event["coverage"] == 1.0 and event["decisions"] == 60, daemon.log_text()
        np.testing.assert_allclose(event["input_set"]["lower"], np.full(3, -EPS))

        bad_dim = orjson.dumps({"id": "bad", "model": "m", "x": [0.5, 0.5], "y": 0})
        await produce(kafka_bootstrap, daemon.topic, [bad_dim], key=b"m")
        updates = [
            orjson.dumps({"model": "m", "version": "2", "onnx": "%%%"}),
            orjson.dumps(
                {"model": "m", "version": "2", "onnx": base64.b64encode(v2.to_onnx()).decode()}
            ),
        ]
        await produce(kafka_bootstrap, daemon.topic_for("models"), updates, key=b"m")
        await assert_violated_after_the_update(kafka_bootstrap, daemon, len(first), v2, spec)
        dead = await consume_all(kafka_bootstrap, daemon.dead_topic, 2, 60, settle=1.0)
        reasons = sorted(d["reason"] for d in dead)
        assert reasons == ["dimension", "schema"], dead
        update_schema = json.loads(
            (files("vigil.connectors") / "schemas" / "model_update.json").read_text()
        )
        jsonschema.validate(orjson.loads(updates[1]), update_schema)
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(timeout=40) == 0, daemon.log_text()
    finally:
        daemon.kill()


async def test_a_step_the_branches_leave_unknown_is_decided_by_the_complete_search(
    kafka_bootstrap, tmp_path
):
    """One branch cannot verify v1 here; the complete step does (`unsat`: holds), and finds
    v2's counterexample (`sat`: violated), each confirmed as above."""
    v1, v2, spec = networks()
    (tmp_path / "model.onnx").write_bytes(v1.to_onnx())
    rules = rule_toml(spec, branches=1, complete=20.0)
    daemon = Daemon(kafka_bootstrap, tmp_path, extra_rules=rules)
    x = np.random.default_rng(0).uniform(0, 1, size=(60, 3))
    x[0], x[1] = 0.0, 1.0
    await produce(kafka_bootstrap, daemon.topic, decisions(x), key=b"m")
    daemon.start()
    try:
        first = await consume_all(kafka_bootstrap, daemon.verifications_topic, 1, 90, settle=1.0)
        assert first, daemon.log_text()
        event = first[-1]
        assert (event["status"], event["complete"]) == ("holds", "unsat"), event
        assert event["coverage"] < 1.0  # the branch alone proved less than the whole set
        update = {"model": "m", "version": "2", "onnx": base64.b64encode(v2.to_onnx()).decode()}
        await produce(kafka_bootstrap, daemon.topic_for("models"), [orjson.dumps(update)], key=b"m")
        await assert_violated_after_the_update(kafka_bootstrap, daemon, len(first), v2, spec)
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(timeout=40) == 0, daemon.log_text()
    finally:
        daemon.kill()
