"""The JSON-printing commands keep stdout to JSON lines (so `vigil ... | jq .` works).

Each command runs as its own process through the console script: HiGHS prints a banner
straight to file descriptor 1 on the first model of a process, which an in-process capture
of ``sys.stdout`` would not see.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.test_certify_knn_cli import _data, _write_csv
from vigil.rules.reach.network import Network

VIGIL = Path(sys.executable).with_name("vigil")


def _stdout_of(*args: str) -> str:
    result = subprocess.run(
        [str(VIGIL), *args], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def _assert_json_lines(stdout: str) -> list[object]:
    assert stdout.strip(), "nothing on stdout"
    lines = stdout.splitlines()
    for line in lines:
        try:
            json.loads(line)
        except ValueError:
            pytest.fail(f"a stdout line is not JSON: {line!r}\nstdout:\n{stdout}")
    return [json.loads(line) for line in lines]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """Two small ReLU networks and their inputs: a 3-class one for verification and a
    binary one with a sigmoid head (class 1 iff x0 + x1 > 1) for counterfactuals."""
    d = tmp_path_factory.mktemp("stdout")
    rng = np.random.default_rng(0)
    classes = Network.from_arrays(
        [(rng.normal(size=(6, 3)), rng.normal(size=6)), (rng.normal(size=(3, 6)), np.zeros(3))]
    )
    (d / "classes.onnx").write_bytes(classes.to_onnx())
    x = rng.uniform(0, 1, size=(4, 3))
    np.save(d / "X.npy", x)
    np.save(d / "y.npy", np.argmax(classes.logits(x), axis=1))
    np.save(d / "L.npy", np.zeros(3))
    np.save(d / "U.npy", np.full(3, 0.1))
    np.save(d / "C.npy", np.array([[1.0, 0.0, 0.0]]))
    np.save(d / "D.npy", np.array([1e6]))
    binary = Network.from_arrays(
        [
            (np.array([[1.0, 1.0, 0.0], [-1.0, -1.0, 0.0], [0.0, 0.0, 1.0]]), np.zeros(3)),
            (np.array([[4.0, -4.0, 0.1]]), np.array([-4.0])),
        ],
        "sigmoid",
    )
    (d / "binary.onnx").write_bytes(binary.to_onnx())
    np.save(d / "cfx.npy", np.array([[0.8, 0.6, 0.5], [0.3, 0.9, 0.1]]))
    np.save(d / "applicants.npy", np.array([[0.2, 0.3, 0.5], [0.1, 0.4, 0.0]]))
    rows, _ = _data(60, 0)
    bands = [int(np.digitize(r[0] + rng.normal(0, 6), [42, 58])) for r in rows]
    assert set(bands) == {0, 1, 2}  # three labels: abstract learning then solves its LP
    _write_csv(
        d / "train.csv",
        ["income", "age", "sex", "region", "band"],
        [[*r, band] for r, band in zip(rows, bands, strict=True)],
    )
    _write_csv(d / "test.csv", ["income", "age", "sex", "region"], _data(4, 1)[0])
    stream = rng.uniform(0, 1, size=(30, 2))
    _write_csv(
        d / "stream.csv",
        ["f0", "f1", "prediction"],
        [[a, b, int(a > 0.5)] for a, b in stream.tolist()],
    )
    return d


def test_the_console_script_is_installed():
    assert VIGIL.is_file(), f"no console script at {VIGIL}"


def test_verify_batch_prints_json_only(work):
    out = _stdout_of(
        "verify", "batch", "--model", str(work / "classes.onnx"), "--inputs", str(work / "X.npy"),
        "--labels", str(work / "y.npy"), "--eps", "0.05", "--clip", "0,1",
        "--out", str(work / "verdicts.jsonl"),
    )  # fmt: skip
    (summary,) = _assert_json_lines(out)
    assert summary["inputs"] == 4


def test_explain_prints_json_only(work):
    out = _stdout_of(
        "explain", "--model", str(work / "binary.onnx"), "--x", str(work / "applicants.npy"),
        "--robust", "--delta", "0.05", "--out", str(work / "applicants_cfx.npy"),
    )  # fmt: skip
    lines = _assert_json_lines(out)
    assert [e["row"] for e in lines] == [0, 1]
    assert all(e["found"] for e in lines)


def test_certify_cfx_provable_prints_json_only(work):
    out = _stdout_of(
        "certify", "cfx", "--model", str(work / "binary.onnx"), "--cfx", str(work / "cfx.npy"),
        "--provable",
    )  # fmt: skip
    lines = _assert_json_lines(out)
    assert [e["row"] for e in lines] == [0, 1]
    assert all("provable_delta" in e for e in lines)


def test_certify_knn_prints_json_only(work):
    """With three labels abstract learning solves LPs with HiGHS: none of its banner reaches
    stdout, and the human-readable table goes to stderr."""
    (summary,) = _assert_json_lines(_stdout_of(*_knn_args(work)))
    assert set(summary) == {"k", "kset", "summary"}


def _knn_args(work: Path) -> list[str]:
    return [
        "certify", "knn", "--train", str(work / "train.csv"), "--target", "band",
        "--protected", "sex", "--flips", "2", "--k", "3,5,7", "--folds", "4",
        "--inputs", str(work / "test.csv"), "--out", str(work / "knn.jsonl"),
    ]  # fmt: skip


def test_verify_reach_prints_json_only(work):
    out = _stdout_of(
        "verify", "reach", "--model", str(work / "classes.onnx"), "--lower", str(work / "L.npy"),
        "--upper", str(work / "U.npy"), "--C", str(work / "C.npy"), "--d", str(work / "D.npy"),
    )  # fmt: skip
    (result,) = _assert_json_lines(out)
    assert result["status"] == "holds"


def test_replay_prints_json_only(work):
    out = _stdout_of(
        "replay", str(work / "stream.csv"), "--decision-column", "prediction", "--eps", "0.1",
        "--alerts-out", str(work / "alerts.jsonl"),
    )  # fmt: skip
    (summary,) = _assert_json_lines(out)
    assert summary["decisions"] == 30
