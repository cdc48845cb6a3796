"""Certification requests on the real broker: results out, bad requests dead-lettered, and the
decision stream keeps flowing while a slow certification runs in the pool."""

from __future__ import annotations

import csv
import json
import signal
from importlib.resources import files

import jsonschema
import numpy as np
import orjson

from tests.daemon_harness import (
    KNN_RULE,
    Daemon,
    consume_all,
    decision_events,
    expected_alerts,
    produce,
    witness_map,
)
from vigil.rules.certify.knn.job import run_job


def training(n: int, seed: int) -> tuple[list[list[float]], list[int]]:
    rng = np.random.default_rng(seed)
    x = rng.random((n, 4)).round(3)
    sex = rng.integers(0, 2, n)
    y = ((x[:, 0] + x[:, 1] + 0.3 * rng.random(n)) > 1.1).astype(int)
    return [[*map(float, r), int(s)] for r, s in zip(x, sex, strict=True)], y.tolist()


async def test_knn_requests_run_beside_the_decision_stream(kafka_bootstrap, tmp_path, compas):
    rows, labels = training(15000, 0)
    with open(tmp_path / "train.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["a", "b", "c", "d", "sex", "y"])
        writer.writerows([*r, t] for r, t in zip(rows, labels, strict=True))
    slow = {
        "id": "slow",
        "train_path": str(tmp_path / "train.csv"),
        "target": "y",
        "protected": ["sex"],
        "flips": 2,
        "inputs": rows[:3],
    }
    fast = []
    for i in range(3):
        x, y = training(80, i + 1)
        fast.append(
            {
                "id": f"fast{i}",
                "train": {"x": x, "y": y},
                "protected": [4],
                "flips": 1,
                "inputs": x[:5],
                "variant": "individual",
            }
        )
    requests = [orjson.dumps(r) for r in [slow, *fast]] + [b"{not json", b'{"id": "bad"}']

    x, y = compas
    daemon = Daemon(kafka_bootstrap, tmp_path, extra_rules=KNN_RULE)
    expected = expected_alerts(x, y, daemon.eps)
    daemon.start()
    try:
        await produce(kafka_bootstrap, daemon.topic_for("knn"), requests, key=b"lender")
        await produce(kafka_bootstrap, daemon.topic, decision_events(x, y, "compas"))
        alerts = await consume_all(kafka_bootstrap, daemon.alerts_topic, len(expected), 120)
        results = await consume_all(kafka_bootstrap, daemon.certifications_topic, 5, 240)
        assert witness_map(alerts) == expected, daemon.log_text()
        by_id = {r["request_id"]: r for r in results}
        assert len(results) == 5 and set(by_id) == {"slow", "fast0", "fast1", "fast2", "bad"}
        schema = json.loads(
            (files("vigil.connectors") / "schemas" / "certification.json").read_text()
        )
        for r in results:
            jsonschema.validate(r, schema)
        for request in fast:
            got = by_id[request["id"]]
            assert got["status"] == "ok"
            want = run_job(request)
            assert [e["certified"] for e in got["result"]["results"]] == [
                e["certified"] for e in want["results"]
            ]
            assert got["result"]["kset"] == want["kset"]
        assert by_id["slow"]["status"] == "ok" and len(by_id["slow"]["result"]["results"]) == 3
        assert by_id["bad"]["status"] == "invalid" and "inputs" in by_id["bad"]["error"]
        # the consumer kept checking decisions while the slow certification ran
        assert max(a["detected_at"] for a in alerts) < by_id["slow"]["completed_at"]
        dead = await consume_all(kafka_bootstrap, daemon.dead_topic, 2, 30, settle=1.0)
        assert sorted(d["reason"] for d in dead) == ["invalid_request", "undecodable"]
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(timeout=40) == 0, daemon.log_text()
    finally:
        daemon.kill()
