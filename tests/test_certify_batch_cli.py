"""`vigil verify batch` and the daemon job on a small digits network, through onnxruntime."""

from __future__ import annotations

import base64
import json
from importlib.resources import files

import jsonschema
import numpy as np
import orjson
import pytest
from sklearn.datasets import load_digits
from sklearn.neural_network import MLPClassifier

from vigil.daemon.cli import main
from vigil.rules.certify.batch.job import run_job
from vigil.rules.reach.network import Network, OnnxRunner


@pytest.fixture(scope="module")
def digits_model(tmp_path_factory):
    digits = load_digits()
    x, y = digits.data / 16.0, digits.target
    clf = MLPClassifier((16, 16), activation="relu", max_iter=400, random_state=0).fit(x, y)
    net = Network.from_arrays([(w.T, b) for w, b in zip(clf.coefs_, clf.intercepts_, strict=True)])
    onnx = net.to_onnx()
    pick = np.flatnonzero(y == 3)[:7]
    labels = y[pick].copy()
    labels[-1] = 5  # a wrong label: the verdict must be "misclassified"
    d = tmp_path_factory.mktemp("batch")
    (d / "m.onnx").write_bytes(onnx)
    np.save(d / "X.npy", x[pick])
    np.save(d / "y.npy", labels)
    return d, onnx, x[pick], labels


def _run(capsys, d, *extra):
    code = main(
        [
            "verify", "batch", "--model", str(d / "m.onnx"), "--inputs", str(d / "X.npy"),
            "--labels", str(d / "y.npy"), "--clip", "0,1", "--max-batch", "3", "--no-progress",
            *extra,
        ]
    )  # fmt: skip
    out = capsys.readouterr()
    return code, out


@pytest.mark.parametrize("eps", [0.01, 0.08])
def test_cli_verdicts_match_baseline_and_witnesses_are_confirmed(digits_model, capsys, eps):
    d, onnx, x, labels = digits_model
    runner = OnnxRunner(onnx)
    results = {}
    for name, extra in [("baverly", []), ("one-by-one", ["--baseline", "one-by-one"])]:
        out_file = d / f"{name}-{eps}.jsonl"
        code, out = _run(capsys, d, "--eps", str(eps), "--out", str(out_file), *extra)
        assert code == 0, out.err
        summary = json.loads(out.out.strip().splitlines()[-1])
        lines = [json.loads(line) for line in out_file.read_text().splitlines()]
        assert [v["index"] for v in lines] == list(range(len(x)))
        assert summary["inputs"] == len(x) and summary["method"] == name
        assert summary["robust"] + summary["not_robust"] + summary["misclassified"] == len(x)
        assert lines[-1]["verdict"] == "misclassified"
        for v in lines:
            if v["verdict"] == "not_robust":
                adv = np.array(v["adversarial_example"])
                centre = x[v["index"]]
                assert np.all(np.abs(adv - centre) <= eps + 1e-9)
                assert np.all((adv >= 0) & (adv <= 1))
                assert int(np.argmax(runner(adv[None, :])[0])) != labels[v["index"]]
            else:
                assert "adversarial_example" not in v
        results[name] = [v["verdict"] for v in lines]
    assert results["baverly"] == results["one-by-one"]


def test_cli_milp_bounds_give_the_lp_baseline_verdicts(digits_model, capsys):
    d, *_ = digits_model
    verdicts = {}
    for name, extra in [
        ("milp", ["--bounds", "milp", "--bound-time", "0.5"]),
        ("lp", ["--baseline", "one-by-one"]),
    ]:
        out_file = d / f"bounds-{name}.jsonl"
        code, out = _run(capsys, d, "--eps", "0.08", "--out", str(out_file), *extra)
        assert code == 0, out.err
        assert json.loads(out.out)["bounds"] == name
        verdicts[name] = [json.loads(line)["verdict"] for line in out_file.read_text().splitlines()]
    assert verdicts["milp"] == verdicts["lp"]
    assert {"robust", "not_robust"} <= set(verdicts["lp"])


def test_cli_rejects_a_non_positive_bound_time(digits_model, capsys):
    d, *_ = digits_model
    code, out = _run(capsys, d, "--eps", "0.05", "--bounds", "milp", "--bound-time", "0")
    assert code == 2 and "--bound-time must be positive" in out.err


def test_cli_sees_both_verdicts_across_radii(digits_model, capsys):
    d, *_ = digits_model
    kinds = set()
    for eps in ("0.005", "0.2"):
        code, out = _run(capsys, d, "--eps", eps, "--baseline", "one-by-one")
        assert code == 0, out.err
        summary = json.loads(out.out)
        kinds |= {k for k in ("robust", "not_robust") if summary[k]}
    assert kinds == {"robust", "not_robust"}


def test_cli_rejects_mismatched_labels(digits_model, capsys, tmp_path):
    d, *_ = digits_model
    np.save(tmp_path / "short.npy", np.array([3, 3]))
    code = main(
        [
            "verify", "batch", "--model", str(d / "m.onnx"), "--inputs", str(d / "X.npy"),
            "--labels", str(tmp_path / "short.npy"), "--eps", "0.01", "--no-progress",
        ]
    )  # fmt: skip
    assert code == 2
    assert "labels must have shape" in capsys.readouterr().err
    labels = np.load(d / "y.npy")
    labels[0] = 99
    np.save(tmp_path / "range.npy", labels)
    argv = ["verify", "batch", "--model", str(d / "m.onnx"), "--inputs", str(d / "X.npy")]
    assert main([*argv, "--labels", str(tmp_path / "range.npy"), "--eps", "0.01"]) == 2
    err = capsys.readouterr().err
    assert "vigil verify batch: error: labels must lie in 0..9; index 0 has 99" in err


def _request(onnx: bytes, x: np.ndarray, labels, **fields) -> dict:
    return {
        "onnx": base64.b64encode(onnx).decode(),
        "inputs": x.tolist(),
        "labels": list(labels),
        **fields,
    }


def _schema(name: str) -> dict:
    return orjson.loads((files("vigil.connectors") / "schemas" / name).read_bytes())


def test_job_result_validates_against_schema(digits_model):
    _, onnx, x, labels = digits_model
    request = _request(onnx, x, labels.tolist(), eps=0.05, clip=[0, 1], max_batch=4, bounds="milp")
    jsonschema.validate(request, _schema("batch_request.json"))
    result = run_job(request)
    jsonschema.validate(result, _schema("batch_result.json"))
    assert result["summary"]["inputs"] == len(x) and result["summary"]["bounds"] == "milp"
    assert result["verdicts"][-1]["verdict"] == "misclassified"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("onnx", "not base64!", "'onnx'"),
        ("eps", -1.0, "eps"),
        ("clip", [1, 0], "clip"),
        ("max_batch", 0, "max_batch"),
        ("inputs", [[0.0, 2.0]], "features"),
        ("labels", [[3, 1], [3]], "labels"),
        ("bounds", "exact", "'bounds'"),
        ("bound_time", 0, "'bound_time'"),
    ],
)
def test_job_names_the_bad_field(digits_model, field, value, message):
    _, onnx, x, labels = digits_model
    request = {
        "onnx": base64.b64encode(onnx).decode(),
        "inputs": x[:1].tolist(),
        "labels": labels[:1].tolist(),
        "eps": 0.05,
        field: value,
    }
    if field == "inputs":
        request["labels"] = [3]
    with pytest.raises(ValueError, match=message):
        run_job(request)


def test_job_refuses_a_single_output_model(digits_model):
    _, _, x, _ = digits_model
    rng = np.random.default_rng(0)
    net = Network.from_arrays(
        [(rng.normal(size=(4, 64)), np.zeros(4)), (rng.normal(size=(1, 4)), np.zeros(1))]
    )
    request = _request(net.to_onnx(), x[:2], [0, 0], eps=10.0)
    with pytest.raises(ValueError, match="two or more outputs"):
        run_job(request)


def test_a_huge_max_batch_is_capped_by_the_inputs(digits_model):
    _, onnx, x, labels = digits_model
    request = _request(onnx, x, labels.tolist(), eps=0.01, max_batch=10**9)
    assert len(run_job(request)["verdicts"]) == len(x)


def test_cli_names_a_scalar_inputs_file(digits_model, capsys, tmp_path):
    d, *_ = digits_model
    np.save(tmp_path / "X.npy", np.float64(1.0))
    code = main(
        [
            "verify", "batch", "--model", str(d / "m.onnx"), "--inputs", str(tmp_path / "X.npy"),
            "--labels", str(d / "y.npy"), "--eps", "0.05", "--no-progress",
        ]
    )  # fmt: skip
    assert code == 2 and "--inputs" in capsys.readouterr().err
