"""The cfx rule in the full pipeline (file source and sink, real worker pool): counterfactuals
that arrive with decisions get their APΔS delta_max, as computing it directly gives."""

from __future__ import annotations

import json
from importlib.resources import files

import jsonschema
import numpy as np
import orjson

from daemon.config import parse_config
from daemon.service import run_daemon
from rules.certify.cfx.certify import certify_rows
from rules.reach.network import Network


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
    schema = json.loads((files("connectors") / "schemas" / "certification.json").read_text())
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
