"""`vigil replay` and `vigil demo` end to end: summaries, alerts, errors and exit codes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orjson
import pytest

from tests.cli_support import run_cli
from tests.conftest import load_stream
from tests.onnx_models import forward, mlp
from tests.oracle import largest_ratios, window_starts, witness_sets
from vigil.daemon.cli import main
from vigil.daemon.demo import bundled_stream

DEMO = bundled_stream()


def replay_demo(*args: str) -> subprocess.CompletedProcess:
    """`vigil replay` on the bundled stream (prediction column, label dropped)."""
    return run_cli(
        "replay", str(DEMO), "--decision-column", "prediction", "--drop-columns", "label", *args
    )


def test_history_limit_compares_each_decision_with_the_window_only(tmp_path):
    alerts_path = tmp_path / "alerts.jsonl"
    result = replay_demo(
        "--eps", "0.04", "--batch-size", "333", "--history-limit", "1000",
        "--alerts-out", str(alerts_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    x, y = load_stream(DEMO)
    sizes = [333] * (len(x) // 333) + ([len(x) % 333] if len(x) % 333 else [])
    expected = {}
    for n, lo in enumerate(window_starts(sizes, 1000)):
        d = np.abs(x[lo:n] - x[n]).max(axis=1, initial=0.0)
        hits = np.flatnonzero((d <= 0.04) & (y[lo:n] != y[n]))
        if hits.size:
            expected[n] = [(int(j) + lo, float(d[j])) for j in hits]
    alerts = [orjson.loads(line) for line in alerts_path.read_bytes().splitlines()]
    got = {a["decision"]["id"]: [(w["id"], w["distance"]) for w in a["witnesses"]] for a in alerts}
    assert got == expected
    assert len(expected) < len([ws for ws in witness_sets(x, y, 0.04) if ws])


def test_replay_alerts_equal_the_oracle_on_the_bundled_stream(tmp_path):
    alerts_path = tmp_path / "alerts.jsonl"
    result = replay_demo(
        "--eps",
        "0.04",
        "--batch-size",
        "333",
        "--alerts-out",
        str(alerts_path),
    )
    assert result.returncode == 0, result.stderr
    summary = orjson.loads(result.stdout.strip().splitlines()[-1])
    assert set(summary) == {
        "decisions",
        "flagged",
        "witness_pairs",
        "seconds",
        "parse_seconds",
        "check_seconds",
        "backend",
    }
    assert 0 < summary["parse_seconds"] + summary["check_seconds"] <= summary["seconds"]

    x, y = load_stream(DEMO)
    truth = witness_sets(x, y, 0.04)
    expected = {n: ws for n, ws in enumerate(truth) if ws}
    alerts = [orjson.loads(line) for line in alerts_path.read_bytes().splitlines()]
    got = {a["decision"]["id"]: [(w["id"], w["distance"]) for w in a["witnesses"]] for a in alerts}
    assert got == expected
    assert summary["decisions"] == len(x)
    assert summary["flagged"] == len(expected)
    assert summary["witness_pairs"] == sum(map(len, expected.values()))
    first = alerts[0]
    assert first["decision"]["y"] == int(y[first["decision"]["id"]])
    assert {w["y"] for w in first["witnesses"]} == {1 - first["decision"]["y"]}
    assert first["source"] == {"file": str(DEMO), "row": first["decision"]["id"]}
    assert (first["rule"], first["model"], first["metric"], first["eps"]) == (
        "replay",
        DEMO.stem,
        "linf",
        0.04,
    )


def test_replay_probability_outputs_with_ids_ignored_and_scaled_columns(tmp_path, capsys):
    rng = np.random.default_rng(7)
    n = 300
    x = rng.integers(0, 8, size=(n, 3)) / 8
    p = rng.integers(0, 5, size=n) / 4
    stream = tmp_path / "s.csv"
    lines = ["id,a,sex,b,p0,p1"] + [
        f"d{i},{x[i, 0]},{x[i, 1]},{x[i, 2]},{1 - p[i]},{p[i]}" for i in range(n)
    ]
    stream.write_text("\n".join(lines) + "\n")
    alerts_path = tmp_path / "a.jsonl"
    code = main(
        [
            "replay",
            str(stream),
            "--decision-column",
            "p0",
            "p1",
            "--id-column",
            "id",
            "--ignore-columns",
            "sex",
            "--scale",
            "b=2",
            "--metric",
            "l1",
            "--eps",
            "0.25",
            "--delta",
            "0.25",
            "--output-metric",
            "tv",
            "--alerts-out",
            str(alerts_path),
            "--no-progress",
        ]
    )
    assert code == 0
    summary = orjson.loads(capsys.readouterr().out.strip())
    truth = witness_sets(
        x, np.stack([1 - p, p], axis=1), 0.25, "l1", 0.25, "tv", scale=[1, 1, 2], ignore=(1,)
    )
    alerts = [orjson.loads(line) for line in alerts_path.read_bytes().splitlines()]
    assert summary["witness_pairs"] == sum(map(len, truth)) > 0
    assert {a["decision"]["id"]: [w["id"] for w in a["witnesses"]] for a in alerts} == {
        f"d{i}": [f"d{j}" for j, _ in ws] for i, ws in enumerate(truth) if ws
    }
    assert all(a["delta"] == 0.25 and len(a["decision"]["y"]) == 2 for a in alerts)


@pytest.mark.parametrize(
    ("content", "args", "message"),
    [
        ("a,b,prediction\n1,2,0\n", ["--drop-columns", "label"], "line 1: no column named 'label'"),
        ("a,b,prediction\n1,2,0\n1,x,1\n", [], "line 3, column 'b': 'x' is not a number"),
        ("a,b,prediction\n1,2,0\nnan,2,1\n", [], "line 3, column 'a': 'nan' is not finite"),
        ("a,b,prediction\n1,2,0\n1,2\n", [], "line 3: 2 fields, expected 3"),
        ("a,b,prediction\n1,2,\n", [], "line 2, column 'prediction': empty"),
        ("", [], "the file is empty"),
        ("a,a,prediction\n1,2,0\n", [], "line 1: duplicate column 'a'"),
        ("a,b,prediction\n1,2,0\n", ["--ignore-columns", "zzz"], "--ignore-columns: not feature"),
        ("a,b,prediction\n1,2,0\n", ["--batch-size", "0"], "--batch-size must be >= 1"),
    ],
)
def test_bad_input_names_line_and_column_and_exits_2(tmp_path, content, args, message):
    stream = tmp_path / "bad.csv"
    stream.write_text(content)
    result = run_cli(
        "replay", str(stream), "--decision-column", "prediction", "--eps", "0.1", *args
    )
    assert result.returncode == 2
    assert message in result.stderr
    assert result.stdout == ""


def test_a_byte_order_mark_is_not_part_of_the_first_column_and_binary_is_refused(tmp_path):
    stream = tmp_path / "bom.csv"
    stream.write_bytes("\ufeffprediction,a\n0,1\n1,1\n".encode())
    result = run_cli("replay", str(stream), "--decision-column", "prediction", "--eps", "0.1")
    assert result.returncode == 0, result.stderr
    assert orjson.loads(result.stdout)["flagged"] == 1
    for rows in (1, 20_000):  # decoded with the header, or in a later read
        stream.write_bytes(b"prediction,a\n" + b"0,1\n" * rows + b"\x93\xff,1\n")
        result = run_cli("replay", str(stream), "--decision-column", "prediction", "--eps", "0.1")
        assert result.returncode == 2 and "not UTF-8 text" in result.stderr, result.stderr


def test_missing_file_and_bad_scale_are_reported(tmp_path):
    result = run_cli("replay", str(tmp_path / "nope.csv"), "--decision-column", "p", "--eps", "1")
    assert result.returncode == 2 and "no such file" in result.stderr
    result = run_cli(
        "replay", str(DEMO), "--decision-column", "prediction", "--eps", "1", "--scale", "age"
    )
    assert result.returncode == 2 and "expected COLUMN=FACTOR" in result.stderr


def test_demo_runs_the_pipeline_and_matches_the_oracle(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "vigil.daemon.cli", "demo", "--workdir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    summary = orjson.loads(result.stdout.strip().splitlines()[-1])
    x, y = load_stream(DEMO)
    truth = witness_sets(x, y, 0.04)
    assert summary["decisions"] == len(x)
    assert summary["flagged"] == sum(1 for ws in truth if ws)
    assert summary["witness_pairs"] == sum(map(len, truth))
    assert summary["dead_letters"] == 0
    assert f"{summary['flagged']} decisions with a witness set" in result.stdout
    alerts = (tmp_path / "demo" / "alerts.jsonl").read_bytes().splitlines()
    assert len(alerts) == summary["flagged"]
    assert list((tmp_path / "demo" / "state").rglob("*.snap"))


def test_demo_empties_only_its_own_output(tmp_path):
    """--workdir is emptied first: only when it holds nothing but an earlier demo's output,
    and only once the arguments are known to be good."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    for args in (
        ["--workdir", str(tmp_path / "mine")],
        ["--workdir", str(tmp_path), "--eps", "-1"],
    ):
        result = run_cli("demo", *args)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
    assert (
        "notes.txt, which the demo did not write"
        in run_cli("demo", "--workdir", str(tmp_path / "mine")).stderr
    )
    demo = tmp_path / "demo"
    for _ in range(2):  # the second run replaces the first one's output
        assert run_cli("demo", "--workdir", str(demo)).returncode == 0
    assert len((demo / "decisions.jsonl").read_bytes().splitlines()) == len(load_stream(DEMO)[0])


def test_run_with_a_file_source_stops_on_sigterm(tmp_path):
    """After the file is read the daemon waits for more (it does not spin), and a SIGTERM
    stops it cleanly."""
    (tmp_path / "decisions.jsonl").write_bytes(
        orjson.dumps({"id": 0, "model": "m", "x": [0.0], "y": 0}) + b"\n"
    )
    (tmp_path / "vigil.toml").write_text(
        """
[files]
decisions = "decisions.jsonl"
[outputs]
alerts_file = "alerts.jsonl"
dead_letter_file = "dead.jsonl"
[metrics]
enabled = false
[state]
dir = "state"
[[rules]]
name = "r"
kind = "ior"
topic = "decisions"
eps = 0.1
"""
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "vigil.daemon.cli", "run", "--config", str(tmp_path / "vigil.toml")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "state" / "file-offsets.json").exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        cpu = _cpu_seconds(proc.pid)
        time.sleep(1.0)
        assert _cpu_seconds(proc.pid) - cpu < 0.5, "the idle daemon spins"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()
        proc.wait()
    assert list((tmp_path / "state").rglob("*.snap"))  # the shutdown's snapshot


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize("backend", ["auto", "bruteforce", "kdtree"])
@pytest.mark.parametrize(("stream", "eps"), [("compas-base-P1", 0.16), ("german-base-P1", 0.16)])
def test_replay_real_streams_agree_with_the_oracle(certifair_dir, backend, stream, eps):
    path = certifair_dir / f"{stream}-combined.csv"
    result = run_cli(
        "replay",
        str(path),
        "--decision-column",
        "prediction",
        "--drop-columns",
        "label",
        "--eps",
        str(eps),
        "--backend",
        backend,
    )
    assert result.returncode == 0, result.stderr
    summary = orjson.loads(result.stdout)
    truth = witness_sets(*load_stream(path), eps)
    assert (summary["flagged"], summary["witness_pairs"]) == (
        sum(1 for ws in truth if ws),
        sum(map(len, truth)),
    )


@pytest.mark.parametrize(
    "backend", ["bdd", "grid", "snn", "parallel:3", "parallel:2:auto", "parallel:2:bdd:processes"]
)
def test_replay_new_backends_on_the_bundled_stream(backend):
    result = replay_demo(
        "--eps",
        "0.04",
        "--backend",
        backend,
        "--no-progress",
    )
    assert result.returncode == 0, result.stderr
    summary = orjson.loads(result.stdout)
    truth = witness_sets(*load_stream(DEMO), 0.04)
    assert (summary["flagged"], summary["witness_pairs"], summary["backend"]) == (
        sum(1 for ws in truth if ws),
        sum(map(len, truth)),
        backend,
    )


def test_replay_quantitative_threshold_alerts_on_large_ratios(tmp_path):
    alerts_path = tmp_path / "q.jsonl"
    result = replay_demo(
        "--eps",
        "0.04",
        "--ratio-threshold",
        "50",
        "--alerts-out",
        str(alerts_path),
        "--no-progress",
    )
    assert result.returncode == 0, result.stderr
    x, y = load_stream(DEMO)
    ratios = largest_ratios(x, y, 0.04)
    expected = {n: r for n, r in enumerate(ratios) if r[0] > 50}
    alerts = [orjson.loads(line) for line in alerts_path.read_bytes().splitlines()]
    got = {
        a["decision"]["id"]: (a["lipschitz"]["ratio"], a["lipschitz"]["witness"]) for a in alerts
    }
    assert got == {n: (None if r == float("inf") else r, j) for n, (r, j) in expected.items()}
    summary = orjson.loads(result.stdout)
    assert summary["alerted"] == len(expected) > 0
    assert summary["max_ratio"] == max(r for r, _ in ratios)


def test_replay_with_an_onnx_embedding(tmp_path):
    rng = np.random.default_rng(3)
    layers = [
        (rng.integers(-8, 9, size=(14, 6)) / 8, rng.integers(-8, 9, size=6) / 8),
        (rng.integers(-8, 9, size=(6, 3)) / 8, rng.integers(-8, 9, size=3) / 8),
    ]
    model = tmp_path / "embed.onnx"
    model.write_bytes(mlp(layers))
    result = replay_demo(
        "--eps",
        "0.05",
        "--embedding",
        str(model),
        "--metric",
        "l2",
        "--no-progress",
    )
    assert result.returncode == 0, result.stderr
    x, y = load_stream(DEMO)
    truth = witness_sets(forward(layers, x), y, 0.05, "l2")
    summary = orjson.loads(result.stdout)
    assert (summary["flagged"], summary["witness_pairs"]) == (
        sum(1 for ws in truth if ws),
        sum(map(len, truth)),
    )
    bad = run_cli(
        "replay",
        str(DEMO),
        "--decision-column",
        "prediction",
        "--eps",
        "0.05",
        "--embedding",
        str(model),
    )
    assert bad.returncode == 2 and "the model takes 14 features, the stream has 15" in bad.stderr


def test_replay_rejects_bad_backend_specs():
    for spec, message in [
        ("annoy", "unknown backend 'annoy'"),
        ("kdtree:3", "only parallel takes options"),
        ("parallel:x", "blocks must be an integer"),
    ]:
        result = run_cli(
            "replay", str(DEMO), "--decision-column", "prediction", "--eps", "1", "--backend", spec
        )
        assert result.returncode == 2 and message in result.stderr
