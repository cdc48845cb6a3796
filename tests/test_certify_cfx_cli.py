"""`vigil certify cfx`, `vigil explain` and the daemon job, end to end on real ONNX models."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import numpy as np
import orjson
import pytest
from sklearn.neural_network import MLPClassifier

from tests.conftest import SHARED_DATA
from vigil.connectors.events import Decision, Record
from vigil.daemon.adapters import CfxRule
from vigil.daemon.cli import main
from vigil.daemon.config import CfxRuleConfig
from vigil.rules.certify.cfx import ShiftSample, worst_case
from vigil.rules.certify.cfx.decision import margins
from vigil.rules.certify.cfx.job import InvalidRequest, run_job
from vigil.rules.reach.network import Network, OnnxRunner

SCHEMAS = Path(__file__).resolve().parents[1] / "connectors" / "schemas"
KEYS = {"row", "valid", "delta_max", "samples", "seconds"}


@pytest.fixture(scope="module")
def trained() -> tuple[Network, np.ndarray]:
    """A small ReLU classifier trained with scikit-learn, and its training inputs."""
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, size=(400, 4))
    y = (x[:, 0] + x[:, 1] - 0.5 * x[:, 2] > 0.8).astype(int)
    clf = MLPClassifier((8, 6), random_state=0, max_iter=1500).fit(x, y)
    layers = [(c.T, b) for c, b in zip(clf.coefs_, clf.intercepts_, strict=True)]
    return Network.from_arrays(layers, "sigmoid"), x


@pytest.fixture
def files(tmp_path, trained) -> tuple[Path, Path, np.ndarray]:
    network, x = trained
    m = margins(network, x, 1)
    rows = np.vstack([x[np.argsort(m)[-2:]], x[np.argmin(m)]])  # two valid, one invalid
    model = tmp_path / "m.onnx"
    model.write_bytes(network.to_onnx())
    cfx = tmp_path / "cfx.npy"
    np.save(cfx, rows)
    return model, cfx, rows


def run_cli(capsys, argv: list[str]) -> tuple[int, list[dict], str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines() if line.strip()], err


def test_certify_prints_one_certificate_per_row(capsys, files, trained):
    network, _ = trained
    model, cfx, rows = files
    argv = ["certify", "cfx", "--model", str(model), "--cfx", str(cfx), "--provable"]
    code, lines, _ = run_cli(capsys, [*argv, "--no-progress", "--seed", "3"])
    assert code == 0
    assert [entry["row"] for entry in lines] == [0, 1, 2]
    for entry, x in zip(lines, rows, strict=True):
        assert set(entry) == KEYS | {"provable_delta"}
        assert entry["samples"] == 1379
        assert 0.0 <= entry["provable_delta"] <= entry["delta_max"]
        if entry["provable_delta"] > 0:
            assert worst_case(network, x, 1, entry["provable_delta"]).robust
    assert lines[0]["delta_max"] > 0 and lines[1]["delta_max"] > 0
    assert lines[2]["delta_max"] == 0.0 and lines[2]["provable_delta"] == 0.0
    accepted = OnnxRunner(model)(rows)[:, 0] >= 0.5  # the deployed model's decision
    assert [e["valid"] for e in lines] == accepted.tolist() == [True, True, False]
    # The probabilistic claim at delta_max, on fresh realisations: at most ~0.5 % fail.
    for entry, x in zip(lines[:2], rows[:2], strict=True):
        fresh = ShiftSample(network, x, 1, 4000, np.random.default_rng(11))
        assert (fresh.margins(entry["delta_max"]) < 0).mean() <= 0.02
    again = run_cli(capsys, [*argv, "--no-progress", "--seed", "3"])[1]
    assert [e["delta_max"] for e in again] == [e["delta_max"] for e in lines]


def test_logits_and_probabilities_give_the_same_certificates(capsys, tmp_path, files, trained):
    network, _ = trained
    _, cfx, _ = files
    results = []
    for output in ("sigmoid", "none"):
        model = tmp_path / f"{output}.onnx"
        model.write_bytes(Network(network.weights, network.biases, output).to_onnx(np.float64))
        argv = ["certify", "cfx", "--model", str(model), "--cfx", str(cfx), "--no-progress"]
        results.append([e["delta_max"] for e in run_cli(capsys, argv)[1]])
    assert results[0] == results[1]


def test_softmax_target_class_and_bad_inputs(capsys, tmp_path):
    rng = np.random.default_rng(1)
    net = Network.from_arrays(
        [(rng.normal(size=(5, 3)), rng.normal(size=5)), (rng.normal(size=(3, 5)), np.zeros(3))],
        "softmax",
    )
    model = tmp_path / "soft.onnx"
    model.write_bytes(net.to_onnx())
    x = rng.uniform(-1, 1, size=(200, 3))
    best = x[np.argmax(margins(net, x, 2))][None]
    np.save(tmp_path / "c.npy", best)
    argv = ["certify", "cfx", "--model", str(model), "--cfx", str(tmp_path / "c.npy")]
    code, lines, _ = run_cli(capsys, [*argv, "--target", "2", "--no-progress"])
    assert code == 0 and lines[0]["delta_max"] > 0
    assert margins(net, best, 2)[0] >= 0
    code, _, err = run_cli(capsys, [*argv, "--target", "3", "--no-progress"])
    assert code == 2 and "target must be in [0, 3)" in err
    np.save(tmp_path / "wide.npy", np.zeros((2, 4)))
    argv[-1] = str(tmp_path / "wide.npy")
    code, _, err = run_cli(capsys, [*argv, "--no-progress"])
    assert code == 2 and "--cfx" in err and "4 features" in err
    argv[-1] = str(tmp_path / "c.npy")
    code, _, err = run_cli(capsys, [*argv, "--gamma", "1.5", "--no-progress"])
    assert code == 2 and "gamma must be in (0, 1)" in err


def test_installed_command_keeps_json_on_stdout(files):
    model, cfx, _ = files
    vigil = Path(sys.executable).with_name("vigil")
    done = subprocess.run(
        [str(vigil), "certify", "cfx", "--model", str(model), "--cfx", str(cfx)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert len([json.loads(line) for line in done.stdout.splitlines()]) == 3


def test_job_matches_the_cli_and_its_schemas(capsys, files):
    model, cfx, rows = files
    request = {
        "onnx": base64.b64encode(model.read_bytes()).decode(),
        "cfx": rows.tolist(),
        "target": 1,
        "gamma": 0.999,
        "R": 0.995,
        "provable": True,
        "seed": 5,
    }
    jsonschema.validate(request, json.loads((SCHEMAS / "cfx_request.json").read_text()))
    result = run_job(request)
    jsonschema.validate(result, json.loads((SCHEMAS / "cfx_result.json").read_text()))
    argv = ["certify", "cfx", "--model", str(model), "--cfx", str(cfx), "--provable"]
    lines = run_cli(capsys, [*argv, "--seed", "5", "--no-progress"])[1]
    strip = [{k: v for k, v in e.items() if k != "seconds"} for e in result["results"]]
    assert strip == [{k: v for k, v in e.items() if k != "seconds"} for e in lines]
    defaults = run_job({"onnx": request["onnx"], "cfx": request["cfx"]})
    assert all(set(e) == KEYS for e in defaults["results"])


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"onnx": None}, "onnx"),
        ({"onnx": "not base64!"}, "onnx"),
        ({"onnx": base64.b64encode(b"garbage").decode()}, "onnx"),
        ({"cfx": "rows"}, "cfx"),
        ({"cfx": [[1.0, 2.0]]}, "cfx"),
        ({"gamma": "high"}, "gamma"),
        ({"provable": 1}, "provable"),
        ({"target": True}, "target"),
        ({"R": 2.0}, "R"),
        ({"seed": -1}, "seed"),
        ({"gamma": 0.9999999, "R": 0.99999999}, "gamma=.*R=.*n="),
    ],
)
def test_job_names_the_bad_field(files, change, field):
    model, _, rows = files
    request = {"onnx": base64.b64encode(model.read_bytes()).decode(), "cfx": rows.tolist()}
    request.update(change)
    if change.get("onnx", "") is None:
        del request["onnx"]
    with pytest.raises(InvalidRequest, match=field):
        run_job(request)


def test_explain_writes_robust_counterfactuals(capsys, tmp_path, files, trained):
    network, x = trained
    model, _, _ = files
    inputs = x[np.argsort(margins(network, x, 1))[:3]]  # clearly rejected
    np.save(tmp_path / "x.npy", inputs)
    out = tmp_path / "robust.npy"
    argv = ["explain", "--model", str(model), "--x", str(tmp_path / "x.npy"), "--out", str(out)]
    robust = [*argv, "--robust", "--delta", "0.05", "--test", "milp", "--immutable", "3"]
    code, lines, _ = run_cli(capsys, [*robust, "--no-progress"])
    assert code == 0 and all(entry["found"] for entry in lines)
    found = np.load(out)
    assert np.all(OnnxRunner(model)(found)[:, 0] >= 0.5)  # valid on the deployed model
    assert np.all((found >= 0) & (found <= 1))
    np.testing.assert_array_equal(found[:, 3], inputs[:, 3])
    for row, entry, x0 in zip(found, lines, inputs, strict=True):
        assert worst_case(network, row, 1, 0.05).robust
        assert entry["l1"] == pytest.approx(np.abs(row - x0).sum())
    plain = tmp_path / "plain.npy"
    argv[-1] = str(plain)
    code, lines, _ = run_cli(capsys, [*argv, "--no-progress"])
    nearest = np.load(plain)
    assert code == 0
    assert np.all(np.abs(nearest - inputs).sum(axis=1) <= np.abs(found - inputs).sum(axis=1) + 1e-9)
    code, _, err = run_cli(capsys, [*argv, "--robust", "--no-progress"])
    assert code == 2 and "--delta" in err
    code, _, err = run_cli(capsys, [*argv, "--robust", "--delta", "nan", "--no-progress"])
    assert code == 2 and "--delta" in err


def test_explain_respects_per_feature_bounds(capsys, tmp_path, files, trained):
    network, x = trained
    model, _, _ = files
    inputs = x[np.argsort(margins(network, x, 1))[:2]]
    np.save(tmp_path / "x.npy", inputs)
    bounds = np.array([[0.0, 0.0, 0.0, 0.0], [0.9, 1.0, 0.5, 1.0]])
    bounds[:, 2] = np.minimum(bounds[:, 2], inputs[:, 2].min())  # feature 2 may only fall
    np.save(tmp_path / "b.npy", bounds)
    out = tmp_path / "o.npy"
    argv = ["explain", "--model", str(model), "--x", str(tmp_path / "x.npy"), "--out", str(out)]
    code, lines, _ = run_cli(capsys, [*argv, "--bounds", str(tmp_path / "b.npy"), "--no-progress"])
    assert code == 0
    found = np.load(out)
    for row, entry in zip(found, lines, strict=True):
        if entry["found"]:
            assert np.all((row >= bounds[0] - 1e-9) & (row <= bounds[1] + 1e-9))
            assert margins(network, row, 1)[0] >= 0
        else:
            assert np.all(np.isnan(row))
    np.save(tmp_path / "bad.npy", np.zeros((3, 4)))
    code, _, err = run_cli(capsys, [*argv, "--bounds", str(tmp_path / "bad.npy"), "--no-progress"])
    assert code == 2 and "--bounds" in err and "(2, 4)" in err


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_german_credit_network_of_the_paper_size(capsys, tmp_path):
    path = SHARED_DATA / "german.data-numeric"
    if not path.exists():
        pytest.skip(f"shared data absent: {path}")
    data = np.loadtxt(path)
    x = (data[:, :24] - data[:, :24].min(0)) / np.ptp(data[:, :24], axis=0)
    y = (data[:, 24] == 1).astype(int)
    clf = MLPClassifier((20, 10), random_state=0, max_iter=300).fit(x[:500], y[:500])
    network = Network.from_arrays(
        [(c.T, b) for c, b in zip(clf.coefs_, clf.intercepts_, strict=True)], "sigmoid"
    )
    model = tmp_path / "german.onnx"
    model.write_bytes(network.to_onnx())
    accepted = x[margins(network, x, 1) > 1.0][:4]
    np.save(tmp_path / "c.npy", accepted)
    argv = ["certify", "cfx", "--model", str(model), "--cfx", str(tmp_path / "c.npy")]
    code, lines, _ = run_cli(capsys, [*argv, "--provable", "--no-progress"])
    assert code == 0 and len(lines) == 4
    assert all(0 < e["provable_delta"] <= e["delta_max"] for e in lines)


@pytest.mark.parametrize("command", ["certify cfx --cfx", "explain --x"])
def test_corrupt_model_is_a_clean_error(capsys, tmp_path, files, command):
    _, cfx, _ = files
    model = tmp_path / "corrupt.onnx"
    model.write_bytes(b"\x08\xff\xff garbage, not a protobuf")
    code, _, err = run_cli(capsys, [*command.split(), str(cfx), "--model", str(model)])
    assert code == 2 and f"--model {model}" in err


def cfx_rule(model: Path, **config: object) -> CfxRule:
    """A cfx rule on ``model``, with a stand-in pool (the tests submit no jobs)."""
    fields = {"name": "cfx", "kind": "cfx", "topic": "decisions", "onnx": model}
    context = SimpleNamespace(pool=object())
    return CfxRule(CfxRuleConfig(**fields, **config), context)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("config", "match"),
    [({"target": 2}, "target must be 0 or 1"), ({"gamma": 0.9999999, "R": 0.99999999}, "gamma=")],
)
def test_cfx_rule_rejects_a_bad_config_at_startup(files, config, match):
    model, _, _ = files
    with pytest.raises(ValueError, match=f"rule 'cfx': {match}"):
        cfx_rule(model, **config)


async def test_cfx_rule_dead_letters_a_malformed_cfx(files):
    model, _, _ = files
    rule = cfx_rule(model)
    decisions = []
    for offset, event in enumerate([{"cfx": [1.0]}, {"cfx": "rows"}, {}]):
        record = Record("decisions", 0, offset, orjson.dumps(event))
        decisions.append(Decision(record, offset, "m", [0.0] * 4, 0, event))
    result = await rule.check(("decisions", 0), decisions, 0)
    assert result.checked == 0 and not result.events
    assert [(r.offset, reason) for r, reason, _ in result.dead] == [(0, "schema"), (1, "schema")]
    assert "cfx: rows have 1 features, the model expects 4" in result.dead[0][2]
    assert "cfx: not a numeric array" in result.dead[1][2]


@pytest.mark.parametrize("command", [["certify", "cfx"], ["explain"], ["verify", "batch"]])
def test_a_negative_seed_is_named(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--seed", "-1"])
    assert exit_info.value.code == 2
    assert "--seed: expected a non-negative integer" in capsys.readouterr().err
