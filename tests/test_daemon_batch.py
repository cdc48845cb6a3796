"""Mini-batch robustness verification as a daemon job: a window's inputs sent as a certify
request go through the full pipeline (file source and sink, real worker pool) and come back
with the verdicts the one-by-one verifier gives."""

from __future__ import annotations

import base64

import numpy as np
import orjson

from vigil.daemon.config import parse_config
from vigil.daemon.service import run_daemon
from vigil.rules.certify.batch.runner import verify_inputs
from vigil.rules.reach.network import Network


async def test_batch_requests_return_one_by_one_verdicts(tmp_path):
    rng = np.random.default_rng(5)
    net = Network.from_arrays(
        [
            (rng.normal(size=(10, 4)), rng.normal(size=10)),
            (rng.normal(size=(3, 10)), rng.normal(size=3)),
        ]
    )
    onnx = net.to_onnx()
    x = rng.uniform(0, 1, size=(12, 4))
    labels = net.logits(x).argmax(axis=1)
    labels[0] = (labels[0] + 1) % 3  # one input the model gets wrong
    request = {
        "id": "window-7",
        "onnx": base64.b64encode(onnx).decode(),
        "inputs": x.tolist(),
        "labels": labels.tolist(),
        "eps": 0.05,
        "clip": [0.0, 1.0],
        "max_batch": 4,
    }
    lines = [orjson.dumps(request), orjson.dumps({"id": "broken", "onnx": "abc", "eps": 0.05})]
    (tmp_path / "requests.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    config = parse_config(
        {
            "files": {"decisions": str(tmp_path / "requests.jsonl"), "topic": "requests"},
            "outputs": {
                "alerts_file": str(tmp_path / "alerts.jsonl"),
                "dead_letter_file": str(tmp_path / "dead.jsonl"),
                "certifications_file": str(tmp_path / "certs.jsonl"),
            },
            "metrics": {"enabled": False},
            "state": {"dir": str(tmp_path / "state")},
            "rules": [{"name": "nightly", "kind": "certify", "job": "batch", "topic": "requests"}],
        }
    )
    await run_daemon(config, until_idle=True)
    certs = {
        c["request_id"]: c
        for c in map(orjson.loads, (tmp_path / "certs.jsonl").read_bytes().splitlines())
    }
    assert certs["broken"]["status"] == "invalid"
    got = certs["window-7"]
    assert got["status"] == "ok", got
    reference = verify_inputs(onnx, x, labels, 0.05, clip=(0.0, 1.0), method="one-by-one")
    verdicts = [v["verdict"] for v in got["result"]["verdicts"]]
    assert verdicts == [v["verdict"] for v in reference.verdicts]
    assert verdicts[0] == "misclassified"
    offsets = orjson.loads((tmp_path / "state" / "file-offsets.json").read_bytes())
    assert offsets == {"offset": 2}  # both requests answered, so both committed
