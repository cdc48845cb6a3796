"""`vigil certify knn` end to end and the daemon job contract (run_job, schemas, cache)."""

from __future__ import annotations

import csv
import json
import pickle
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import jsonschema
import numpy as np
import orjson
import pytest

from vigil.daemon.cli import main
from vigil.rules.certify.knn import FairKnnCertifier, Table
from vigil.rules.certify.knn.job import run_job

SCHEMAS = Path(__file__).resolve().parents[1] / "connectors" / "schemas"


def _validator(name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads((SCHEMAS / f"{name}.json").read_text()))


def _data(size: int, seed: int) -> tuple[list[list[object]], list[int]]:
    """Rows (income, age, sex, region) with a label that mostly follows income."""
    rng = np.random.default_rng(seed)
    rows, labels = [], []
    for _ in range(size):
        income = round(float(rng.normal(50, 15)), 2)
        age = int(rng.integers(18, 70))
        sex = str(rng.choice(["F", "M"]))
        region = str(rng.choice(["north", "south", "east"]))
        rows.append([income, age, sex, region])
        labels.append(int(income + rng.normal(0, 8) > 50))
    return rows, labels


def _request(**extra: object) -> dict:
    rows, labels = _data(40, 0)
    test, _ = _data(8, 1)
    return {
        "id": "r1",
        "train": {"x": rows, "y": labels, "columns": ["income", "age", "sex", "region"]},
        "protected": ["sex"],
        "flips": 1,
        "k": [3, 5, 7],
        "folds": 4,
        "variant": "label",
        "inputs": test,
        **extra,
    }


def _write_csv(path: Path, header: list[str], rows: list[list[object]], sep: str = ",") -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f, delimiter=sep)
        w.writerow(header)
        w.writerows(rows)


def test_run_job_validates_and_is_sound_against_enumeration():
    request = _request()
    _validator("knn_request").validate(request)
    result = run_job(request)
    _validator("knn_result").validate(result)
    assert result["id"] == "r1" and len(result["results"]) == 8
    # the same training data, certified and enumerated directly
    cert = FairKnnCertifier.from_table(
        Table(request["train"]["columns"], request["train"]["x"]),
        np.array(request["train"]["y"]),
        ["sex"],
        1,
        ks=[3, 5, 7],
        folds=4,
    )
    x = cert.encoder.transform(Table(request["train"]["columns"], request["inputs"]))
    truth = cert.ground_truth(x, "label")
    labels = cert.model.classes[cert.model.predict_codes(x)]
    for r, t, y in zip(result["results"], truth, labels, strict=True):
        assert r["label"] == y
        assert not r["certified"] or t
        assert r["status"] == ("certified" if r["certified"] else "unknown")
    assert result["certified"] == sum(r["certified"] for r in result["results"]) > 0


def test_repeated_requests_reuse_the_trained_model():
    first = run_job(_request(flips=2))
    again = run_job(_request(flips=2, variant="individual"))
    other = run_job(_request(flips=0))
    assert again["cached"] and again["train_hash"] == first["train_hash"]
    assert not other["cached"] and other["train_hash"] != first["train_hash"]
    assert again["kset"] == first["kset"]


def test_train_path_request_matches_inline_request(tmp_path):
    request = _request(variant="epsilon", eps=0.05)
    path = tmp_path / "train.csv"
    rows = [[*r, y] for r, y in zip(request["train"]["x"], request["train"]["y"], strict=True)]
    _write_csv(path, [*request["train"]["columns"], "approved"], rows, sep=";")
    by_path = {k: v for k, v in request.items() if k != "train"}
    by_path.update(train_path=str(path), target="approved", sep=";")
    _validator("knn_request").validate(by_path)
    a, b = run_job(request), run_job(by_path)
    assert [r["certified"] for r in a["results"]] == [r["certified"] for r in b["results"]]
    assert [str(r["label"]) for r in a["results"]] == [str(r["label"]) for r in b["results"]]
    assert a["kset"] == b["kset"]


def test_run_job_runs_in_a_worker_process():
    request = _request()
    pickle.dumps(run_job)
    with ProcessPoolExecutor(max_workers=1) as pool:
        remote = pool.submit(run_job, request).result(timeout=60)
    local = run_job(request)
    assert [r["certified"] for r in remote["results"]] == [r["certified"] for r in local["results"]]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"flips": "one"}, "flips"),
        ({"protected": ["gender"]}, "protected"),
        ({"protected": [9]}, "protected"),
        ({"variant": "group"}, "variant"),
        ({"inputs": [[1.0, 2]]}, "inputs"),
        ({"train": {"x": [[1, 2]], "y": [0, 1]}}, "train.y"),
        ({"metric": "cosine"}, "metric"),
        ({"train": {"x": [[1, 2]], "y": [0], "columns": 5}}, "'train.columns' must be a list"),
        ({"train": {"x": [[1, 2]], "y": [0], "columns": ["a", "a"]}}, "duplicate column name 'a'"),
        ({"k": [3.7]}, "k candidates must be positive integers"),
        ({"k": ["x"]}, "k candidates must be positive integers"),
        ({"k": [True]}, "k candidates must be positive integers"),
        ({"folds": 0}, "folds must be an integer >= 2"),
        ({"folds": 1}, "folds must be an integer >= 2"),
        ({"inputs": [["nan", 30, "F", "north"]]}, "column 'income'.*not finite"),
    ],
)
def test_bad_request_fields_are_named(change, field):
    with pytest.raises(ValueError, match=field):
        run_job(_request(**change))
    with pytest.raises(ValueError, match="'flips' is required"):
        run_job({k: v for k, v in _request().items() if k != "flips"})


def test_cli_writes_one_line_per_input_and_a_sound_summary(tmp_path, capsys):
    rows, labels = _data(60, 2)
    test, test_labels = _data(12, 3)
    header = ["income", "age", "sex", "region", "approved"]
    train = tmp_path / "train.csv"
    inputs = tmp_path / "test.csv"
    _write_csv(train, header, [[*r, y] for r, y in zip(rows, labels, strict=True)])
    _write_csv(inputs, header, [[*r, y] for r, y in zip(test, test_labels, strict=True)])
    out = tmp_path / "results.jsonl"
    argv = [
        "certify", "knn", "--train", str(train), "--target", "approved", "--protected", "sex",
        "--flips", "1", "--eps", "0.02", "--inputs", str(inputs), "--out", str(out),
        "--k", "3,5,7", "--check", "--no-progress",
    ]  # fmt: skip
    assert main(argv) == 0
    captured = capsys.readouterr()
    (printed,) = captured.out.strip().splitlines()  # one JSON line; the table is on stderr
    summary = orjson.loads(printed)["summary"]
    lines = [orjson.loads(line) for line in out.read_text().splitlines()]
    assert [line["index"] for line in lines] == list(range(12))
    for line, row in zip(lines, test, strict=True):
        assert line["group"] == f"sex={row[2]}"
        assert set(line["variants"]) == {"label", "individual", "epsilon"}
        for v in ("label", "individual"):
            entry = line["variants"][v]
            assert not entry["certified"] or entry["truth"]
        # each variant only adds admissible inputs
        cert = [line["variants"][v]["certified"] for v in ("label", "individual", "epsilon")]
        assert cert == sorted(cert, reverse=True)
    for v in ("label", "individual", "epsilon"):
        got = sum(line["variants"][v]["certified"] for line in lines)
        assert summary[v]["certified"] == got
        assert sum(g["inputs"] for g in summary[v]["groups"].values()) == 12
    assert summary["label"]["unsound"] == summary["individual"]["unsound"] == 0
    assert "unsound" not in summary["epsilon"]
    assert any("sex=F" in p and "sex=M" not in p for p in captured.err.splitlines())


def test_cli_reports_bad_columns(tmp_path, capsys):
    train, _ = _cli_files(tmp_path, 20)
    rows, _ = _data(20, 4)
    other = tmp_path / "other.csv"
    _write_csv(other, ["income", "age"], [r[:2] for r in rows])
    base = ["certify", "knn", "--train", str(train), "--target", "y", "--flips", "0",
            "--out", str(tmp_path / "o.jsonl"), "--k", "1,3", "--no-progress"]  # fmt: skip
    assert main([*base, "--protected", "race", "--inputs", str(train)]) == 2
    assert "'race'" in capsys.readouterr().err
    assert main([*base, "--protected", "sex", "--inputs", str(other)]) == 2
    assert "columns must be the training features" in capsys.readouterr().err


def test_eps_list_must_match_the_feature_columns():
    with pytest.raises(ValueError, match="eps: expected 1 or 4 values, got 2"):
        run_job(_request(variant="epsilon", eps=[0.1, 0.2]))
    per_column = run_job(_request(variant="epsilon", eps=[0.5, 0.0, 0.0, 0.0]))
    wide = run_job(_request(variant="epsilon", eps=0.5))
    narrow = run_job(_request(variant="epsilon", eps=0.0))
    # a larger box never certifies more
    for a, b, c in zip(wide["results"], per_column["results"], narrow["results"], strict=True):
        assert a["certified"] <= b["certified"] <= c["certified"]


def _cli_files(tmp_path: Path, size: int) -> tuple[Path, list[str]]:
    rows, labels = _data(size, 4)
    train = tmp_path / "train.csv"
    _write_csv(
        train,
        ["income", "age", "sex", "region", "y"],
        [[*r, y] for r, y in zip(rows, labels, strict=True)],
    )
    out = tmp_path / "o.jsonl"
    base = ["certify", "knn", "--train", str(train), "--target", "y", "--protected", "sex",
            "--inputs", str(train), "--out", str(out), "--no-progress"]  # fmt: skip
    return train, base


def test_cli_reports_bad_folds(tmp_path, capsys):
    _, base = _cli_files(tmp_path, 20)
    for folds in ("0", "1"):
        assert main([*base, "--flips", "0", "--folds", folds]) == 2
        assert f"folds must be an integer >= 2, got {folds}" in capsys.readouterr().err


def test_cli_check_enumerates_only_for_the_label_and_individual_variants(tmp_path, capsys):
    # 60 rows and 4 flips: over 500,000 flipped training sets, beyond the enumeration limit
    _, base = _cli_files(tmp_path, 60)
    argv = [*base, "--flips", "4", "--k", "9,11", "--check"]
    assert main([*argv, "--variant", "epsilon"]) == 0
    capsys.readouterr()
    assert main([*argv, "--variant", "label"]) == 2
    assert "enumeration needs" in capsys.readouterr().err
