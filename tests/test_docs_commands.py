"""Every command the docs show runs here, as written, with its output checked.

The commands are read from the fenced shell blocks of README.md, docs/operations.md and
ops/README.md. Each one is either run (in a fresh clone of the repository, with the test
environment's .venv, against the test broker where it needs one) or excused with the reason
it cannot run on a test machine. A command added to the docs without either fails
``test_every_documented_command_is_run_or_excused``; `make docs-check` runs this file alone
and prints what ran.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer

from tests.test_cli_stdout import work  # noqa: F401 - the placeholder files' fixture

REPO = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/operations.md", "ops/README.md")
BIN = Path(sys.executable).parent
SHELLS = ("sh", "bash", "console", "shell")


def documented() -> list[tuple[str, str]]:
    """(command, where) for every command line of the docs' shell blocks; continuation
    lines are joined and trailing comments dropped."""
    out = []
    for doc in DOCS:
        block, pending = None, ""
        for number, line in enumerate((REPO / doc).read_text().splitlines(), 1):
            fence = re.match(r"^\s*```(\w*)", line)
            if fence:
                block = None if block is not None else fence.group(1)
                continue
            if block not in SHELLS:
                continue
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            pending += (" " if pending else "") + text.removesuffix("\\").strip()
            if text.endswith("\\"):
                continue
            out.append((re.sub(r"\s+#\s.*$", "", pending).strip(), f"{doc}:{number}"))
            pending = ""
    return out


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """A fresh clone of the repository's committed state, sharing the test .venv."""
    where = tmp_path_factory.mktemp("docs") / "vigil"
    subprocess.run(["git", "clone", "-q", str(REPO), str(where)], check=True)
    (where / ".venv").symlink_to(BIN.parent)
    os.utime(where / "pyproject.toml", (0, 0))  # older than .venv/.installed: no reinstall
    return where


def sh(command: str, cwd: Path, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    """Run ``command`` with bash in ``cwd``, the test .venv's scripts first on PATH."""
    environment = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", **env}
    return subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    )
    return proc.stdout


def json_lines(stdout: str) -> list[dict]:
    lines = [json.loads(line) for line in stdout.splitlines()]
    assert lines, "nothing on stdout"
    return lines


# -- runners -------------------------------------------------------------------------------


def make_demo(command: str, ctx: Context) -> None:
    out = ok(sh(command, ctx.clone))
    summary = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    assert (summary["decisions"], summary["flagged"], summary["dead_letters"]) == (5278, 732, 0)


def replay(command: str, ctx: Context) -> None:
    (summary,) = json_lines(ok(sh(command, ctx.clone)))
    sample = re.search(r'^\{"decisions".*\}$', (REPO / "README.md").read_text(), re.M)
    shown = json.loads(sample.group(0))
    for key in ("decisions", "flagged", "witness_pairs", "backend"):
        assert summary[key] == shown[key], key
    alerts = (ctx.clone / "alerts.jsonl").read_text().splitlines()
    assert len(alerts) == summary["flagged"]


def check_config(command: str, ctx: Context) -> None:
    path = command.split()[-1]
    if not (ctx.clone / path).exists():  # the docs' generic name: the dev example under it
        shutil.copy(ctx.clone / "ops/examples/dev-kafka.toml", ctx.clone / path)
    assert ok(sh(command, ctx.clone)).strip().endswith("kafka source)")


def placeholder(files: dict[str, str]) -> Callable[[str, Context], None]:
    """Run a command whose file arguments are placeholders, with real files by those names
    (links to small inputs the CLI tests make), and check its stdout is JSON lines."""

    def run(command: str, ctx: Context) -> None:
        where = ctx.work.parent / f"run-{uuid.uuid4().hex[:6]}"
        where.mkdir()
        for name, source in files.items():
            (where / name).symlink_to(ctx.work / source)
        for variant in _variants(command):
            json_lines(ok(sh(variant, where)))

    return run


def _variants(command: str) -> list[str]:
    """A command with ``[--flag]`` once without the flag and once with it."""
    optional = re.search(r"\s\[([^\]]+)\]", command)
    if not optional:
        return [command]
    without = command.replace(optional.group(0), "")
    return [without, without + " " + optional.group(1)]


def dev_broker(command: str, ctx: Context) -> None:
    """README's three commands and ops/README's curl, in their order, against the test broker:
    the daemon on the dev example, the demo producer, the metrics; then alerts are read."""
    ctx.dev_run()


def make_kafka_start(command: str, ctx: Context) -> None:
    port = ctx.bootstrap.rsplit(":", 1)[1]
    out = ok(sh(command, ctx.clone, KAFKA_PORT=port))
    assert "already-running" in out  # the suite's broker: left as it is


def promtool(command: str, ctx: Context) -> None:
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    if command == "promtool check config prometheus.yml":  # the Prometheus section's setup
        setup = ctx.clone / "prometheus-setup"
        setup.mkdir(exist_ok=True)
        scrape = (ctx.clone / "ops/prometheus/scrape.yml").read_text()
        (setup / "prometheus.yml").write_text(scrape + "\nrule_files:\n  - alerts.yml\n")
        shutil.copy(ctx.clone / "ops/prometheus/alerts.yml", setup / "alerts.yml")
        proc = sh(command, setup)
        ok(proc)
        assert "SUCCESS" in proc.stdout + proc.stderr
        return
    if command == "promtool check rules alerts.yml":
        ok(sh(command, ctx.clone / "ops" / "prometheus"))
        return
    ok(sh(command, ctx.clone))


class Context:
    """What the runners share: the clone, the placeholder files, the broker."""

    def __init__(self, clone: Path, inputs: Path, bootstrap: str | None) -> None:
        self.clone, self.work, self.bootstrap = clone, inputs, bootstrap
        self._dev_done = False

    def dev_run(self) -> None:
        if self._dev_done:
            return
        if self.bootstrap is None:
            pytest.skip("VIGIL_KAFKA_BOOTSTRAP unset: run `make test` to start the dev broker")
        tag = uuid.uuid4().hex[:8]
        port = _free_port()
        config = (REPO / "ops/examples/dev-kafka.toml").read_text()
        for old, new in (  # this run's own topics, group and port on the shared test broker
            ("127.0.0.1:9092", self.bootstrap),
            ("vigil.demo.decisions", f"vigil.demo.decisions-{tag}"),
            ("vigil.alerts", f"vigil.alerts-{tag}"),
            ("vigil.dead-letters", f"vigil.dead-letters-{tag}"),
            ('"vigil-dev"', f'"vigil-dev-{tag}"'),
            ("port = 9464", f"port = {port}"),
        ):
            config = config.replace(old, new)
        assert f"vigil.alerts-{tag}" in config and str(port) in config
        (self.clone / "ops/examples/dev-kafka.toml").write_text(config)
        env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
        log = open(self.clone / "dev-run.log", "wb")  # noqa: SIM115 - closed below
        daemon = subprocess.Popen(
            [".venv/bin/vigil", "run", "--config", "ops/examples/dev-kafka.toml"],
            cwd=self.clone,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            producer = f".venv/bin/python ops/demo-producer.py --bootstrap {self.bootstrap}"
            ok(sh(f"{producer} --topic vigil.demo.decisions-{tag}", self.clone))
            alerts = asyncio.run(_read(self.bootstrap, f"vigil.alerts-{tag}", 732 + 1217, 120))
            rules = {a["rule"] for a in alerts}
            assert len(alerts) == 732 + 1217 and rules == {"compas-robustness", "compas-fairness"}
            metrics = ok(
                sh(
                    f"curl -s 127.0.0.1:{port}/metrics | grep -E '^vigil_(alerts|events)_total'",
                    self.clone,
                )
            )
            assert re.search(r'vigil_alerts_total\{rule="compas-robustness"\} 732', metrics)
            if shutil.which("kcat"):  # ops/README's kcat line, on this run's alerts topic
                kcat = (
                    f"kcat -b {self.bootstrap} -C -t vigil.alerts-{tag} "
                    "-X isolation.level=read_committed -e -q -f '%s\\n'"
                )
                assert len(json_lines(ok(sh(kcat, self.clone)))) == len(alerts)
            daemon.send_signal(signal.SIGTERM)
            assert daemon.wait(timeout=60) == 0
        finally:
            if daemon.poll() is None:
                daemon.kill()
                daemon.wait()
            log.close()
        self._dev_done = True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _read(bootstrap: str, topic: str, expect: int, timeout: float) -> list[dict]:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
    )
    await consumer.start()
    out: list[dict] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < expect and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            out += [json.loads(r.value) for rs in batches.values() for r in rs]
        await asyncio.sleep(2)  # anything more would be a duplicate
        batches = await consumer.getmany(timeout_ms=500)
        out += [json.loads(r.value) for rs in batches.values() for r in rs]
    finally:
        await consumer.stop()
    return out


NO_DOCKER = "needs a Docker daemon; tests/test_compose.py validates ops/compose.yaml"
DEPLOYED = "changes a deployed host (root, systemd, /etc, /opt); packaging: tests/test_packaging.py"

RUN: dict[str, Callable[[str, Context], None]] = {
    "make demo": make_demo,
    ".venv/bin/vigil replay daemon/data/compas-stream.csv --decision-column prediction "
    "--drop-columns label --metric linf --eps 0.04 --alerts-out alerts.jsonl": replay,
    ".venv/bin/vigil check-config ops/examples/dev-kafka.toml": check_config,
    "vigil check-config vigil.toml": check_config,
    ".venv/bin/vigil run --config ops/examples/dev-kafka.toml &": dev_broker,
    ".venv/bin/vigil run --config ops/examples/dev-kafka.toml": dev_broker,
    "vigil run --config vigil.toml": dev_broker,
    ".venv/bin/python ops/demo-producer.py --bootstrap 127.0.0.1:9092": dev_broker,
    ".venv/bin/python ops/demo-producer.py": dev_broker,
    "curl -s 127.0.0.1:9464/metrics | grep -E '^vigil_(alerts|events)_total'": dev_broker,
    "make kafka-start": make_kafka_start,
    "vigil verify reach --model M.onnx --lower L.npy --upper U.npy --C C.npy --d D.npy": (
        placeholder(
            {
                "M.onnx": "classes.onnx",
                "L.npy": "L.npy",
                "U.npy": "U.npy",
                "C.npy": "C.npy",
                "D.npy": "D.npy",
            }
        )
    ),
    "vigil verify batch --model M.onnx --inputs X.npy --labels y.npy --eps 0.03": placeholder(
        {"M.onnx": "classes.onnx", "X.npy": "X.npy", "y.npy": "y.npy"}
    ),
    "vigil certify knn --train DATA.csv --target COL --protected sex --flips 1 --inputs "
    "TEST.csv --out results.jsonl": placeholder(
        {"DATA.csv": "train-col.csv", "TEST.csv": "test.csv"}
    ),
    "vigil certify cfx --model M.onnx --cfx CFX.npy [--provable]": placeholder(
        {"M.onnx": "binary.onnx", "CFX.npy": "cfx.npy"}
    ),
    "vigil explain --model M.onnx --x X.npy --robust --delta 0.05": placeholder(
        {"M.onnx": "binary.onnx", "X.npy": "applicants.npy"}
    ),
    "promtool check config prometheus.yml": promtool,
    "promtool check rules alerts.yml": promtool,
    "promtool check rules ops/prometheus/alerts.yml": promtool,
    "promtool test rules ops/prometheus/alerts_test.yml": promtool,
}

EXCUSED: dict[str, str] = {
    "make test": "the suite itself",
    "docker compose -f ops/compose.yaml up -d --build": NO_DOCKER,
    "docker compose -f ops/compose.yaml ps": NO_DOCKER,
    "docker compose -f ops/compose.yaml logs -f vigil": NO_DOCKER,
    "docker compose -f ops/compose.yaml down -v": NO_DOCKER,
    "docker compose -f ops/compose.yaml exec kafka /opt/kafka/bin/kafka-console-consumer.sh "
    "--bootstrap-server kafka:9092 --topic vigil.alerts --from-beginning --max-messages 5": (
        NO_DOCKER
    ),
    "docker compose -f ops/compose.yaml up -d --wait kafka": NO_DOCKER,
    "docker compose -f ops/compose.yaml down": NO_DOCKER,
    "vigil check-config /etc/vigil/vigil.toml": DEPLOYED,
    "vigil run --config /etc/vigil/vigil.toml": DEPLOYED,
    "useradd --system --home-dir /var/lib/vigil --shell /usr/sbin/nologin vigil": DEPLOYED,
    "python3 -m venv /opt/vigil/.venv": DEPLOYED,
    "/opt/vigil/.venv/bin/pip install /path/to/vigil": DEPLOYED,
    "install -D -m 0640 -g vigil ops/examples/vigil.toml /etc/vigil/vigil.toml": DEPLOYED,
    "install -m 0644 ops/systemd/vigil.service /etc/systemd/system/": DEPLOYED,
    "systemctl daemon-reload": DEPLOYED,
    "systemctl enable --now vigil": DEPLOYED,
    "journalctl -u vigil -f": DEPLOYED,
    "curl -X POST http://localhost:9090/-/reload": "needs a running Prometheus",
}


def test_every_documented_command_is_run_or_excused():
    shown = documented()
    unknown = [f"{where}: {c}" for c, where in shown if c not in RUN and c not in EXCUSED]
    assert not unknown, "documented commands with no check:\n" + "\n".join(unknown)
    stale = sorted((set(RUN) | set(EXCUSED)) - {c for c, _ in shown})
    assert not stale, f"checks for commands the docs no longer show: {stale}"
    assert not set(RUN) & set(EXCUSED)


@pytest.fixture(scope="module")
def ctx(clone, work) -> Context:  # noqa: F811 - the imported fixture
    _knn_target_named_col(work)
    return Context(clone, work, os.environ.get("VIGIL_KAFKA_BOOTSTRAP"))


def _knn_target_named_col(inputs: Path) -> None:
    """README's knn line names its target column COL: the training file with ``band`` so."""
    text = (inputs / "train.csv").read_text()
    (inputs / "train-col.csv").write_text(text.replace("band", "COL", 1))


@pytest.mark.parametrize(
    "command", sorted({c for c, _ in documented() if c in RUN}), ids=lambda c: c[:70]
)
def test_documented_command_runs(command, ctx):
    RUN[command](command, ctx)
    print(f"ran: {command}")
