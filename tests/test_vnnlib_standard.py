"""`vigil-vnnlib`, the VNN-LIB standard's solver command line: name, version, supports,
and verify with the standard's result words and assignment format."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.milp_oracle import max_violation
from vigil import __version__
from vigil.daemon.cli._standard import main
from vigil.rules.reach.network import Network, OnnxRunner
from vigil.rules.reach.sets import InputSet, OutputSpec


def query_2(threshold: float, dtype: str = "real", name: str = "net") -> str:
    return f"""(vnnlib-version <2.0>)
(declare-network {name}
  (declare-input X {dtype} [1,2])
  (declare-output Y {dtype} [1,1]))
(assert (>= X[0,0] -1.0)) (assert (<= X[0,0] 1.0))
(assert (>= X[0,1] -1.0)) (assert (<= X[0,1] 1.0))
(assert (>= Y[0,0] {threshold!r}))
"""


@pytest.fixture
def model(tmp_path):
    rng = np.random.default_rng(11)
    net = Network.from_arrays(
        [(rng.normal(size=(10, 2)), rng.normal(size=10)), (rng.normal(size=(1, 10)), [0.0])]
    )
    path = tmp_path / "net.onnx"
    path.write_bytes(net.to_onnx())
    best, _ = max_violation(net, InputSet(-np.ones(2), np.ones(2)), OutputSpec([[1.0]], [0.0]))
    return path, float(best)


def test_name_version_and_supports(capsys):
    assert main(["--name"]) == 0 and "Vigil" in capsys.readouterr().out
    assert main(["--version"]) == 0 and capsys.readouterr().out.strip() == __version__
    assert main(["supports", "--onnx-operators"]) == 0
    operators = capsys.readouterr().out.split()
    assert {"Conv", "Gemm", "Relu", "Add", "BatchNormalization"} <= set(operators)
    assert {"Shape", "Range", "Where", "Expand", "ConstantOfShape"} <= set(operators)
    assert "Tanh" in operators and "LSTM" not in operators
    assert main(["supports", "--vnnlib-versions"]) == 0
    assert capsys.readouterr().out.split() == ["1.0", "2.0"]
    assert main(["supports", "--onnx-element-types"]) == 0
    assert capsys.readouterr().out.split() == ["real", "float16", "float32", "float64"]


def test_verify_answers_in_the_standard_format(model, tmp_path, capsys):
    path, best = model
    query = tmp_path / "q.vnnlib"
    query.write_text(query_2(best - 0.01))
    assert main(["verify", str(query), "--network", f"net={path}", "--timeout", "60"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "sat" and lines[1] == "X real [1,2]" and lines[4] == "Y real [1,1]"
    x = np.array([float(lines[2]), float(lines[3])])
    assert np.all(np.abs(x) <= 1.0)
    y = OnnxRunner(path)(x[None])[0, 0]
    assert y >= best - 0.01 - 1e-4 and abs(y - float(lines[5])) <= 1e-4
    query.write_text(query_2(best + 0.01))
    assert main(["verify", str(query), "--network", f"net={path}"]) == 0
    assert capsys.readouterr().out.splitlines() == ["unsat"]


@pytest.mark.parametrize(
    ("text", "network", "message"),
    [
        (query_2(0.0, dtype="float64"), "net={path}", "the model's input is float32"),
        (query_2(0.0, name="other"), "net={path}", "the query declares 'other'"),
        (query_2(0.0), "net=missing.onnx", "no such file"),
    ],
)
def test_verify_refuses_what_it_cannot_answer(model, tmp_path, capsys, text, network, message):
    path, _ = model
    query = tmp_path / "q.vnnlib"
    query.write_text(text)
    assert main(["verify", str(query), "--network", network.format(path=path)]) == 2
    assert message in capsys.readouterr().err


def test_the_installed_entry_point_answers():
    script = Path(sys.executable).parent / "vigil-vnnlib"
    if not script.exists():
        pytest.skip(f"{script} absent: install the package (make test does) to get the script")
    done = subprocess.run([str(script), "--version"], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == __version__


@pytest.mark.parametrize(
    ("capability", "theory"),
    [
        ("--arithmetic-complexity-theories", "LIN"),
        ("--hidden-node-theories", "H"),
        ("--multiple-input-output-theories", "MIO"),
        ("--multiple-network-theories", "MENET"),
    ],
)
def test_the_theories_answered_are_listed(capsys, capability, theory):
    assert main(["supports", capability]) == 0
    assert theory in capsys.readouterr().out.split()
