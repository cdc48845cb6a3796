"""Certification on a Dask cluster: `vigil verify batch --scheduler`, `vigil certify knn
--scheduler` and the daemon's offload pool with ``[offload] engine = "dask"``, on a real
scheduler and two workers started with the ``dask`` command (skipped without it)."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import orjson
import pytest

from tests import dask_jobs, offload_jobs
from vigil.daemon import offload
from vigil.daemon.adapters import certify
from vigil.daemon.cli import main
from vigil.daemon.config import ConfigError, parse_config
from vigil.daemon.metrics import Metrics
from vigil.daemon.offload import DaskCluster, DaskLane, OffloadPool
from vigil.daemon.service import build_rules
from vigil.rules.reach.network import Network

ROOT = Path(__file__).resolve().parents[1]
WORKERS = 2
ALLOWED_FAILURES = 1
"""The test scheduler retries a task whose worker died once; a second death is an error."""


def _dask_command() -> str | None:
    beside = Path(sys.executable).with_name("dask")
    return str(beside) if beside.exists() else shutil.which("dask")


DASK = _dask_command()


class Cluster:
    """A running scheduler and its workers, and a client to inspect them."""

    def __init__(self, address: str, client) -> None:
        self.address = address
        self.client = client

    def ready(self) -> None:
        """Wait until all workers are up (again, after a test killed one)."""
        self.client.wait_for_workers(WORKERS, timeout=90)

    def pids(self) -> dict[str, int]:
        """Each worker's address and process id."""
        self.ready()
        return self.client.run(os.getpid)


def _stop(processes: list[subprocess.Popen]) -> None:
    """Stop each process group (a worker's nanny, its worker and helpers): SIGTERM, then
    SIGKILL whatever is left of the group."""
    for p in reversed(processes):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
    for p in reversed(processes):
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if DASK is None:
        pytest.skip("the `dask` command is not installed (pip install 'vigil-daemon[dask]')")
    distributed = pytest.importorskip("distributed", reason="Dask distributed is not installed")
    logs = tmp_path_factory.mktemp("dask")
    scheduler_file = logs / "scheduler.json"
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {
        **os.environ,
        "PYTHONPATH": path,  # the workers import the test jobs (tests.dask_jobs)
        "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": str(ALLOWED_FAILURES),
    }
    processes: list[subprocess.Popen] = []

    def start(name: str, *argv: str) -> subprocess.Popen:
        with (logs / f"{name}.log").open("wb") as log:
            processes.append(
                subprocess.Popen(
                    [DASK, *argv],
                    cwd=ROOT,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # one process group each, killed as a whole
                )
            )
        return processes[-1]

    client = None
    try:
        scheduler = start(
            "scheduler", "scheduler", "--host", "127.0.0.1", "--port", "0",
            "--no-dashboard", "--scheduler-file", str(scheduler_file),
        )  # fmt: skip
        address = _address(scheduler, scheduler_file, logs / "scheduler.log")
        for i in range(WORKERS):
            start(
                f"worker{i}", "worker", "--scheduler-file", str(scheduler_file),
                "--nworkers", "1", "--nthreads", "1", "--no-dashboard", "--host", "127.0.0.1",
            )  # fmt: skip
        client = distributed.Client(address, set_as_default=False, timeout=30)
        handle = Cluster(address, client)
        handle.ready()
        yield handle
    finally:
        if client is not None:
            client.close()
        _stop(processes)


def _address(scheduler: subprocess.Popen, scheduler_file: Path, log: Path) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if scheduler.poll() is not None:
            pytest.fail(f"the Dask scheduler exited:\n{log.read_text()}")
        with contextlib.suppress(FileNotFoundError, ValueError, KeyError):
            return json.loads(scheduler_file.read_text())["address"]
        time.sleep(0.1)
    pytest.fail("the Dask scheduler wrote no scheduler file within 60 s")


# --- vigil verify batch --scheduler ---------------------------------------------------------


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """A small digits MLP and 12 inputs of classes 0, 3 and 8 (interleaved), the last one
    labelled wrongly."""
    from sklearn.datasets import load_digits
    from sklearn.neural_network import MLPClassifier

    data = load_digits()
    x, y = data.data / 16.0, data.target
    clf = MLPClassifier((16, 16), activation="relu", max_iter=400, random_state=0).fit(x, y)
    net = Network.from_arrays([(w.T, b) for w, b in zip(clf.coefs_, clf.intercepts_, strict=True)])
    pick = np.flatnonzero(np.isin(y, [0, 3, 8]))[:12]
    labels = y[pick].copy()
    labels[-1] = 5
    d = tmp_path_factory.mktemp("digits")
    (d / "m.onnx").write_bytes(net.to_onnx())
    np.save(d / "X.npy", x[pick])
    np.save(d / "y.npy", labels)
    return d


def _verify(capsys, d: Path, out: Path, *extra: str) -> tuple[list[dict], dict]:
    code = main(
        [
            "verify", "batch", "--model", str(d / "m.onnx"), "--inputs", str(d / "X.npy"),
            "--labels", str(d / "y.npy"), "--clip", "0,1", "--eps", "0.08", "--max-batch", "3",
            "--out", str(out), "--no-progress", *extra,
        ]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    lines = [orjson.loads(line) for line in out.read_text().splitlines()]
    return lines, orjson.loads(captured.out.strip().splitlines()[-1])


def _ran_on_workers(summary: dict, cluster: Cluster, tasks: int) -> None:
    """Every task's result names the Dask worker that computed it (the task asks its worker
    for its address, which fails outside a worker), and those are the cluster's workers."""
    ran = summary["cluster"]
    assert ran["scheduler"] == cluster.address and ran["tasks"] == tasks
    assert sum(ran["workers"].values()) == tasks
    assert set(ran["workers"]) <= set(cluster.pids())


def test_verify_batch_on_the_cluster_gives_the_local_verdicts(cluster, digits, capsys, tmp_path):
    local, local_summary = _verify(capsys, digits, tmp_path / "local.jsonl")
    remote, summary = _verify(
        capsys, digits, tmp_path / "remote.jsonl", "--scheduler", cluster.address
    )
    # one task per label (0, 3, 5, 8): the same balls form the same mini-batches, so even the
    # adversarial examples are the local run's
    assert remote == local
    _ran_on_workers(summary, cluster, tasks=4)
    for key in ("inputs", "robust", "not_robust", "misclassified", "method", "bounds", "sizer"):
        assert summary[key] == local_summary[key]
    assert {"robust", "not_robust", "misclassified"} <= {v["verdict"] for v in local}
    # one task per input: the verdicts still match, in input order
    single, summary = _verify(
        capsys, digits, tmp_path / "single.jsonl", "--scheduler", cluster.address,
        "--chunk-size", "1",
    )  # fmt: skip
    assert [(v["index"], v["verdict"]) for v in single] == [
        (v["index"], v["verdict"]) for v in local
    ]
    _ran_on_workers(summary, cluster, tasks=12)


def test_verify_batch_refuses_bad_input_before_using_the_cluster(digits, capsys, tmp_path):
    labels = np.load(digits / "y.npy")
    labels[0] = 99
    np.save(tmp_path / "range.npy", labels)
    code = main(
        [
            "verify", "batch", "--model", str(digits / "m.onnx"), "--inputs",
            str(digits / "X.npy"), "--labels", str(tmp_path / "range.npy"), "--eps", "0.01",
            "--no-progress", "--scheduler", "tcp://127.0.0.1:9",
        ]
    )  # fmt: skip
    assert code == 2
    assert "labels must lie in 0..9; index 0 has 99" in capsys.readouterr().err


def test_an_unreachable_scheduler_is_an_error_naming_it(digits, capsys, tmp_path, monkeypatch):
    pytest.importorskip("distributed", reason="Dask distributed is not installed")
    monkeypatch.setattr(offload, "CONNECT_SECONDS", 1.0)
    with socket_nobody_listens_on() as port:
        code = main(
            [
                "verify", "batch", "--model", str(digits / "m.onnx"), "--inputs",
                str(digits / "X.npy"), "--labels", str(digits / "y.npy"), "--eps", "0.01",
                "--no-progress", "--scheduler", f"tcp://127.0.0.1:{port}",
            ]
        )  # fmt: skip
    assert code == 1
    assert f"cannot reach the Dask scheduler at tcp://127.0.0.1:{port}" in capsys.readouterr().err


@contextlib.contextmanager
def socket_nobody_listens_on():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]  # bound, not listening: connections are refused


def test_the_scheduler_flag_is_checked(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["verify", "batch", "--model", "m", "--inputs", "x", "--labels", "y", "--eps", "1",
              "--scheduler", "host:8786"])  # fmt: skip
    assert exit_.value.code == 2
    assert "expected a Dask scheduler address tcp://HOST:PORT" in capsys.readouterr().err


# --- vigil certify knn --scheduler ----------------------------------------------------------


def _people(size: int, seed: int) -> list[list[object]]:
    """Rows (income, age, sex, region, approved); approval mostly follows income."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(size):
        income = round(float(rng.normal(50, 15)), 2)
        rows.append(
            [
                income,
                int(rng.integers(18, 70)),
                str(rng.choice(["F", "M"])),
                str(rng.choice(["north", "south", "east"])),
                int(income + rng.normal(0, 8) > 50),
            ]
        )
    return rows


def _csv(path: Path, rows: list[list[object]]) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["income", "age", "sex", "region", "approved"])
        writer.writerows(rows)
    return path


def _untimed(value):
    """``value`` without its timings (they differ between any two runs)."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if "seconds" not in k}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


def test_certify_knn_on_the_cluster_gives_the_local_results(cluster, capsys, tmp_path):
    train = _csv(tmp_path / "train.csv", _people(60, 2))
    inputs = _csv(tmp_path / "inputs.csv", _people(12, 3))
    base = [
        "certify", "knn", "--train", str(train), "--target", "approved", "--protected", "sex",
        "--flips", "1", "--eps", "0.02", "--inputs", str(inputs), "--k", "3,5,7", "--check",
        "--no-progress",
    ]  # fmt: skip
    runs = {}
    for name, extra in [("local", []), ("remote", ["--scheduler", cluster.address])]:
        out = tmp_path / f"{name}.jsonl"
        assert main([*base, "--out", str(out), "--chunk-size", "5", *extra]) == 0
        printed = orjson.loads(capsys.readouterr().out.strip().splitlines()[-1])
        runs[name] = ([orjson.loads(line) for line in out.read_text().splitlines()], printed)
    (local, local_printed), (remote, printed) = runs["local"], runs["remote"]
    assert [line["index"] for line in remote] == list(range(12))
    assert _untimed(remote) == _untimed(local)
    assert [list(line) for line in remote] == [list(line) for line in local]  # key order too
    assert _untimed(printed["summary"]) == _untimed(local_printed["summary"])
    assert (printed["k"], printed["kset"]) == (local_printed["k"], local_printed["kset"])
    _ran_on_workers(printed, cluster, tasks=3)  # 12 inputs in chunks of 5


def test_certify_knn_check_errors_come_back_from_the_cluster(cluster, capsys, tmp_path):
    """Refusals raised on a worker (here: too many flipped training sets to enumerate) are
    reported as a local run reports them."""
    train = _csv(tmp_path / "train.csv", _people(60, 4))
    argv = [
        "certify", "knn", "--train", str(train), "--target", "approved", "--protected", "sex",
        "--flips", "4", "--k", "9,11", "--inputs", str(train), "--out", str(tmp_path / "o"),
        "--check", "--variant", "label", "--no-progress", "--scheduler", cluster.address,
    ]  # fmt: skip
    assert main(argv) == 2
    assert "enumeration needs" in capsys.readouterr().err


# --- the daemon's offload pool on Dask --------------------------------------------------------


def _knn_request(**extra: object) -> dict:
    rows = _people(40, 0)
    return {
        "id": "r1",
        "train": {
            "x": [r[:4] for r in rows],
            "y": [r[4] for r in rows],
            "columns": ["income", "age", "sex", "region"],
        },
        "protected": ["sex"],
        "flips": 1,
        "k": [3, 5, 7],
        "folds": 4,
        "variant": "label",
        "inputs": [r[:4] for r in _people(8, 1)],
        **extra,
    }


def _certify_config(offload_section: dict, extra_rules: list[dict] | None = None):
    return parse_config(
        {
            "kafka": {"bootstrap_servers": "unused:9092"},
            "offload": offload_section,
            "rules": [
                {"name": "c", "kind": "certify", "job": "knn", "topic": "requests"},
                *(extra_rules or []),
            ],
        }
    )


OFFLOAD_SERIES = (
    "vigil_offload_jobs_total",
    "vigil_offload_pending_jobs",
    "vigil_offload_worker_restarts_total",
    "vigil_offload_job_seconds_count",
)


async def test_daemon_certify_jobs_on_dask_match_the_process_pool(cluster):
    request = _knn_request()
    refused = {k: v for k, v in request.items() if k != "flips"}
    seen = {}
    for engine in ("processes", "dask"):
        section = {"workers": 2, "timeout_seconds": 120}
        if engine == "dask":
            section |= {"engine": "dask", "scheduler": cluster.address}
        metrics = Metrics()
        (rule,) = build_rules(_certify_config(section), metrics)
        try:
            lanes = rule.pool._lanes
            assert all(isinstance(lane, DaskLane) for lane in lanes) == (engine == "dask")
            module = certify.JOBS["knn"]
            ok, bad = await asyncio.wait_for(
                asyncio.gather(
                    rule.pool.submit(rule.job_kind, certify.run_certification, module, request),
                    rule.pool.submit(rule.job_kind, certify.run_certification, module, refused),
                ),
                120,
            )
            if engine == "dask":  # the job ran in a cluster worker, not here
                where = await asyncio.wait_for(rule.pool.submit("pid", dask_jobs.pid), 60)
                assert where.value in cluster.pids().values()
        finally:
            rule.close()
        text = metrics.render().decode()
        series = sorted(
            line
            for line in text.splitlines()
            if line.startswith(OFFLOAD_SERIES) and 'kind="pid"' not in line
        )
        seen[engine] = (ok, bad, series)
    (ok, bad, series), (dask_ok, dask_bad, dask_series) = seen["processes"], seen["dask"]
    assert ok.status == dask_ok.status == "ok"
    assert _untimed(_uncached(dask_ok.value)) == _untimed(_uncached(ok.value))
    assert bad.status == dask_bad.status == "invalid"
    assert dask_bad.error == bad.error and "'flips' is required" in bad.error
    assert dask_series == series
    assert 'vigil_offload_jobs_total{kind="certify.knn",outcome="ok",pool="default"} 1.0' in series


def _uncached(result: dict) -> dict:
    return {k: v for k, v in result.items() if k != "cached"}


def test_reach_rules_keep_local_process_lanes_with_engine_dask(tmp_path):
    pytest.importorskip("distributed", reason="Dask distributed is not installed")
    rng = np.random.default_rng(0)
    net = Network.from_arrays(
        [(rng.normal(size=(6, 3)), rng.normal(size=6)), (rng.normal(size=(1, 6)), [0.0])]
    )
    (tmp_path / "m.onnx").write_bytes(net.to_onnx())
    reach = {
        "name": "r", "kind": "reach", "topic": "decisions", "model": "m",
        "onnx": str(tmp_path / "m.onnx"), "C": [[1.0]], "d": [1e6],
    }  # fmt: skip
    config = _certify_config({"engine": "dask", "scheduler": "tcp://127.0.0.1:8786"}, [reach])
    rules = build_rules(config, Metrics())
    try:
        certify_rule, reach_rule = rules
        assert all(isinstance(lane, DaskLane) for lane in certify_rule.pool._lanes)
        assert all(isinstance(lane, ProcessPoolExecutor) for lane in reach_rule.pool._lanes)
    finally:
        for rule in rules:
            rule.close()


async def test_a_killed_dask_worker_gives_a_retry_or_an_error_never_a_hang(cluster, tmp_path):
    metrics = Metrics()
    pool = OffloadPool(DaskCluster(cluster.address), 1, metrics, 4, 120.0, "test")
    try:
        marker = tmp_path / "pid"
        job = pool.submit("sleep", dask_jobs.pid_after_marker, str(marker), 3.0)
        deadline = time.monotonic() + 60
        while not marker.exists() or not marker.read_text():
            assert time.monotonic() < deadline, "the job did not start on a worker"
            await asyncio.sleep(0.05)
        victim = int(marker.read_text())
        assert victim in cluster.pids().values()
        os.kill(victim, signal.SIGKILL)
        outcome = await asyncio.wait_for(job, 90)
        # the scheduler retries a task whose worker died (once, on this cluster)
        assert outcome.status == "ok", outcome.error
        assert outcome.value != victim
        # a job that kills every worker it runs on: an error once the retries are used up
        await asyncio.to_thread(cluster.ready)
        crashed = await asyncio.wait_for(pool.submit("crash", offload_jobs.crash), 120)
        assert crashed.status == "error"
        assert "worker process died" in crashed.error and "Dask workers died" in crashed.error
        await asyncio.to_thread(cluster.ready)
        after = await asyncio.wait_for(pool.submit("pid", dask_jobs.pid), 60)
        assert after.status == "ok"
    finally:
        pool.shutdown()
    text = metrics.render().decode()
    assert 'vigil_offload_worker_restarts_total{pool="test",reason="worker_died"} 1.0' in text
    assert 'vigil_offload_jobs_total{kind="crash",outcome="error",pool="test"} 1.0' in text
    assert 'vigil_offload_jobs_total{kind="sleep",outcome="ok",pool="test"} 1.0' in text


async def test_a_timed_out_dask_job_restarts_its_worker(cluster, tmp_path):
    """Dask cannot interrupt a task: the lane cancels it and the worker's nanny restarts the
    worker, so the stuck job does not hold a cluster thread for the rest of its run."""
    await asyncio.to_thread(cluster.ready)
    metrics = Metrics()
    pool = OffloadPool(DaskCluster(cluster.address), 1, metrics, 4, 3.0, "test")
    try:
        marker = tmp_path / "pid"
        slow = await pool.submit("slow", dask_jobs.pid_after_marker, str(marker), 300.0)
        assert slow.status == "timeout" and "3 s" in slow.error
        stuck = int(marker.read_text())
        deadline = time.monotonic() + 60
        while Path(f"/proc/{stuck}").exists() and not _zombie(stuck):
            assert time.monotonic() < deadline, "the stuck worker was not restarted"
            await asyncio.sleep(0.1)
        await asyncio.to_thread(cluster.ready)
        after = await asyncio.wait_for(pool.submit("pid", dask_jobs.pid), 60)
        assert after.status == "ok" and after.value != stuck
    finally:
        pool.shutdown()
    text = metrics.render().decode()
    assert 'vigil_offload_worker_restarts_total{pool="test",reason="timeout"} 1.0' in text
    assert 'vigil_offload_jobs_total{kind="slow",outcome="timeout",pool="test"} 1.0' in text


def _zombie(pid: int) -> bool:
    with contextlib.suppress(FileNotFoundError):
        return "State:\tZ" in Path(f"/proc/{pid}/status").read_text()
    return True


# --- configuration ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"engine": "dask"}, 'offload.scheduler: Value error, required with engine = "dask"'),
        (
            {"engine": "dask", "scheduler": "scheduler:8786"},
            "offload.scheduler: Value error, expected a Dask scheduler address tcp://HOST:PORT",
        ),
        ({"scheduler": "tcp://127.0.0.1:8786"}, 'only used with engine = "dask"'),
        ({"engine": "ray"}, "offload.engine: Input should be 'processes' or 'dask'"),
    ],
)
def test_offload_engine_keys_are_validated(section, message):
    pytest.importorskip("distributed", reason="Dask distributed is not installed")
    with pytest.raises(ConfigError) as error:
        _certify_config(section)
    assert message in str(error.value)


def test_engine_dask_needs_a_certify_or_cfx_rule():
    pytest.importorskip("distributed", reason="Dask distributed is not installed")
    with pytest.raises(ConfigError, match="reach rules always run in a local process"):
        parse_config(
            {
                "kafka": {"bootstrap_servers": "unused:9092"},
                "offload": {"engine": "dask", "scheduler": "tcp://127.0.0.1:8786"},
                "rules": [{"name": "i", "kind": "ior", "topic": "decisions", "eps": 0.1}],
            }
        )
    config = _certify_config({"engine": "dask", "scheduler": "tcp://10.0.0.5:8786"})
    assert (config.offload.engine, config.offload.scheduler) == ("dask", "tcp://10.0.0.5:8786")


def test_without_dask_a_cluster_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed fails
    with pytest.raises(offload.ClusterError, match=r"pip install 'vigil-daemon\[dask\]'"):
        DaskCluster("tcp://127.0.0.1:8786").client()
