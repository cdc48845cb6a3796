"""The docs are executable: every command they show is run here, or excused with a reason.

The commands are the lines of the fenced ``sh``/``bash``/``shell``/``console`` blocks of
README.md, docs/operations.md and ops/README.md (``\\`` continuations joined, trailing
comments dropped, ``$ `` prompts removed; in ``console`` blocks only prompted lines count).
``COMMANDS`` maps the exact text of each one either to a ``Run`` (how it runs here and what
its output must show) or to an ``Excused`` reason, optionally with a check of the files the
command uses in its place. A documented command missing from the table fails
``test_every_documented_command_has_an_entry``; an entry for a command the docs no longer
show fails ``test_every_entry_is_a_documented_command``.

Commands run in a fresh copy of the repository (its tracked files, as in the working tree)
with the test ``.venv`` linked into it, so nothing is installed. What differs from the text
in the docs is said in the report (``make docs-check`` prints it; it is also written to the
pytest temporary directory):

* placeholders (``M.onnx``, ``X.npy``, ``DATA.csv``, ``COL``, ...) become small real inputs
  made by the ``inputs`` fixture, per command (``placeholders(...)`` in the table);
* Kafka commands run against the test broker (``VIGIL_KAFKA_BOOTSTRAP``, exported by
  ``make test`` and ``make docs-check``): ``127.0.0.1:9092`` becomes its address, the topics,
  group and transactional id get a per-run suffix and the metrics port a free one, in the
  dev example's config and in the commands alike;
* ``/etc/vigil`` and ``/var/lib/vigil`` become directories under the test's temporary
  directory; the Prometheus reload goes to a Prometheus started on a free port.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from tests.daemon_harness import consume_all
from vigil.daemon.state.kafka_store import TOPIC_CONFIG

REPO = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/operations.md", "ops/README.md")
SHELL_BLOCKS = frozenset({"sh", "bash", "shell", "zsh", "console"})
pytestmark = pytest.mark.broker  # its Kafka commands use the test broker
VENV = Path(sys.prefix)  # the virtualenv running the tests, linked into the copy as .venv
DEV_CONFIG = "ops/examples/dev-kafka.toml"
PRODUCED = 5278  # decisions in the bundled stream (ops/README: "5278 decisions, then exits")


# -- the parser ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shown:
    """One documented command and where it starts."""

    command: str
    doc: str
    line: int

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}"


_FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([^\s`]*)")


def _without_comment(line: str) -> str:
    """``line`` up to a shell comment: a ``#`` that starts a word outside quotes."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def parse(text: str, doc: str) -> list[Shown]:
    """The commands of the shell blocks of one Markdown text, in order."""
    shown: list[Shown] = []
    marker = language = None
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        fence = _FENCE.match(raw)
        if marker is None:
            if fence:
                marker, language = fence.group(1), fence.group(2).lower()
            continue
        stripped = raw.strip()
        if stripped and set(stripped) == {marker[0]} and len(stripped) >= len(marker):
            if pending:  # a continuation with nothing after it: shown as is, so it has no entry
                shown.append(Shown(" ".join(pending) + " \\", doc, start))
            marker = language = None
            pending = []
            continue
        if language not in SHELL_BLOCKS:
            continue
        line = stripped
        if not pending:
            if line.startswith("$ "):
                line = line[2:].lstrip()
            elif language == "console":
                continue  # output shown after a prompted command
            start = number
        line = _without_comment(line)
        if not line and not pending:
            continue
        if line.endswith("\\"):
            pending.append(line[:-1].strip())
            continue
        pending.append(line)
        shown.append(Shown(" ".join(part for part in pending if part), doc, start))
        pending = []
    return shown


def documented() -> list[Shown]:
    return [s for doc in DOCS for s in parse((REPO / doc).read_text(), doc)]


def _documented_commands() -> list[str]:
    """Each command text once, in the order the docs first show it."""
    return list(dict.fromkeys(s.command for s in documented()))


# -- the context the checks share ----------------------------------------------------------------


@dataclass
class Ctx:
    copy: Path  # the fresh copy of the repository
    scratch: Path  # room for inputs and runs outside the copy
    bootstrap: str | None  # the test broker
    inputs: Path | None = None
    dev_config: str = ""  # the dev example as the copy has it, before any substitution
    cache: dict[str, object] = field(default_factory=dict)

    def need_broker(self) -> str:
        if not self.bootstrap:
            pytest.skip("needs the test broker: VIGIL_KAFKA_BOOTSTRAP unset (run make docs-check)")
        return self.bootstrap


def _env(**extra: str) -> dict[str, str]:
    """The environment of a documented command: the .venv first on PATH, no make state."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    env["PATH"] = f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **extra}


def sh(command: str, cwd: Path, timeout: float = 180, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\nstdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-3000:]}"
    )
    return proc


def json_lines(stdout: str) -> list[dict]:
    assert stdout.strip(), "nothing on stdout"
    lines = []
    for line in stdout.splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            pytest.fail(f"a stdout line is not JSON: {line!r}")
    return lines


def substitute(text: str, subs: list[tuple[str, str]]) -> str:
    for old, new in subs:
        text = text.replace(old, new)
    return text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def _wait_for(url: str, seconds: float, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + seconds
    while _http_status(url) != 200:
        assert process.poll() is None, f"exited {process.returncode}:\n{_tail(log)}"
        assert time.monotonic() < deadline, f"{url} not 200 after {seconds:.0f} s:\n{_tail(log)}"
        time.sleep(0.2)


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _stop(process: subprocess.Popen, how: signal.Signals, timeout: float = 60) -> int:
    process.send_signal(how)
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise AssertionError(f"still running {timeout:.0f} s after {how.name}") from None


def _background(command: str, cwd: Path, log: Path) -> subprocess.Popen:
    """``command`` (without a trailing ``&``) started as a background job of its own."""
    with log.open("wb") as out:
        return subprocess.Popen(
            ["bash", "-c", "exec " + command.removesuffix("&").strip()],
            cwd=cwd,
            env=_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


# -- how a command runs and what is checked ------------------------------------------------------

Check = Callable[[Ctx, str], str]  # runs (or validates) the command; returns what it showed


@dataclass(frozen=True)
class Run:
    check: Check
    how: str = ""  # what differs from the documented text, for the report


@dataclass(frozen=True)
class Excused:
    reason: str
    instead: Check | None = None  # checks what the command uses, in place of running it


def make_demo(ctx: Ctx, command: str) -> str:
    plan = ok(sh("make -n demo", ctx.copy)).stdout
    if "pip install" in plan or "-m venv" in plan:
        pytest.skip(f"make demo would (re)install into {VENV}: its .installed stamp is old")
    proc = ok(sh(command, ctx.copy))
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    sample = _readme_sample()
    for key in ("decisions", "flagged", "witness_pairs"):
        assert summary[key] == sample[key], (key, summary, sample)
    assert summary["dead_letters"] == 0
    alerts = (ctx.copy / "vigil-demo" / "alerts.jsonl").read_text().splitlines()
    assert len(alerts) == summary["flagged"]
    return (
        f"{summary['decisions']} decisions, {summary['flagged']} flagged, "
        f"{summary['witness_pairs']} witness pairs (README's sample), 0 dead letters"
    )


def _readme_sample() -> dict:
    """The summary line README.md shows for the quick-start replay."""
    match = re.search(r'^\{"decisions".*\}$', (REPO / "README.md").read_text(), re.M)
    assert match, "README.md no longer shows the replay's summary line"
    return json.loads(match.group(0))


def replay(ctx: Ctx, command: str) -> str:
    (ctx.copy / "alerts.jsonl").unlink(missing_ok=True)
    (summary,) = json_lines(ok(sh(command, ctx.copy)).stdout)
    sample = _readme_sample()
    assert set(summary) == set(sample), (summary, sample)
    for key in ("decisions", "flagged", "witness_pairs", "backend"):
        assert summary[key] == sample[key], (key, summary[key], sample[key])
    alerts = json_lines((ctx.copy / "alerts.jsonl").read_text())
    assert len(alerts) == summary["flagged"]
    assert sum(len(a["witnesses"]) for a in alerts) == summary["witness_pairs"]
    for alert in alerts:  # "naming the decision, each witness ... and where it came from"
        assert {"id", "y"} <= set(alert["decision"]) and "row" in alert["source"]
        assert all({"id", "y", "distance"} <= set(w) for w in alert["witnesses"])
    return (
        f"summary {{decisions: {summary['decisions']}, flagged: {summary['flagged']}, "
        f"witness_pairs: {summary['witness_pairs']}}} = README's sample; "
        f"{len(alerts)} alerts in alerts.jsonl"
    )


def report(ctx: Ctx, command: str) -> str:
    """README's report of the quick start's alerts (that replay runs first when its
    alerts.jsonl is not in the copy): the summary line counts them and the stream, and the
    page lists each flagged decision's witnesses."""
    if not (ctx.copy / "alerts.jsonl").exists():
        quick_start = next(
            c for c, e in COMMANDS.items() if isinstance(e, Run) and e.check is replay
        )
        replay(ctx, quick_start)
    alerts = json_lines((ctx.copy / "alerts.jsonl").read_text())
    (summary,) = json_lines(ok(sh(command, ctx.copy)).stdout)
    page = (ctx.copy / "report.html").read_text()
    expected = {"out": "report.html", "alerts": len(alerts), "decisions": PRODUCED}
    assert summary == {**expected, "bytes": len(page.encode())}, summary
    assert page.count("<ul><li>") == len(alerts) and "https://" not in page
    return f"{len(alerts)} alerts, {PRODUCED} decisions, report.html {summary['bytes']} bytes"


def make_kafka_start(ctx: Ctx, command: str) -> str:
    host, port = ctx.need_broker().rsplit(":", 1)
    if host != "127.0.0.1":
        pytest.skip(f"the test broker {ctx.bootstrap} is not a dev-kafka.sh broker")
    if sh("bash ops/kafka/dev-kafka.sh status", ctx.copy, KAFKA_PORT=port).returncode != 0:
        pytest.skip(f"the broker on {ctx.bootstrap} was not started by dev-kafka.sh")
    proc = ok(sh(command, ctx.copy, KAFKA_PORT=port))
    assert proc.stdout.strip().endswith("already-running"), proc.stdout
    return f"KAFKA_PORT={port} {command}: already-running (the test broker, left running)"


def check_config_generic(ctx: Ctx, command: str) -> str:
    """operations.md's ``vigil check-config vigil.toml`` on the dev example named vigil.toml,
    and on a broken copy, whose error must name its key, with exit 2."""
    outcomes = []
    for name, text in (
        ("good", ctx.dev_config),
        ("bad", ctx.dev_config.replace("\neps = 0.04", "\neps = -0.04")),
    ):
        assert name == "good" or text != ctx.dev_config, "the dev example has no eps = 0.04"
        where = ctx.scratch / f"operations-check-{name}"
        where.mkdir(exist_ok=True)
        (where / "vigil.toml").write_text(text)
        outcomes.append(sh(command, where))
    good, bad = outcomes
    assert ok(good).stdout.strip() == "vigil.toml: ok (2 rules, kafka source)", good.stdout
    assert bad.returncode == 2 and "rules.0.eps" in bad.stderr, (bad.returncode, bad.stderr)
    return f"{good.stdout.strip()!r} (the dev example); with eps = -0.04: exit 2 naming rules.0.eps"


def check_config_installed(ctx: Ctx, command: str) -> str:
    """``vigil check-config /etc/vigil/vigil.toml`` on the production example as installed by
    ops/README's systemd steps, its /var/lib/vigil models made here."""
    root = ctx.scratch / "host"
    var = root / "var/lib/vigil"
    credentials = root / "run/credentials/vigil.service"
    text = (ctx.copy / "ops/examples/vigil.toml").read_text().replace("/var/lib/vigil", str(var))
    text = text.replace("/run/credentials/vigil.service", str(credentials))
    credentials.mkdir(parents=True, exist_ok=True)
    (credentials / "kafka-sasl-password").write_text("a-password\n")
    (root / "etc/vigil").mkdir(parents=True, exist_ok=True)
    (root / "etc/vigil/vigil.toml").write_text(text)
    rules = tomllib.loads(text)["rules"]
    for rule in rules:
        if "onnx" in rule:
            outputs = len(rule["C"][0]) if "C" in rule else 1
            _relu_model(Path(rule["onnx"]), rule.get("dim", 4), outputs)
    actual = command.replace("/etc/vigil", str(root / "etc/vigil"))
    out = ok(sh(actual, ctx.copy)).stdout.strip()
    assert out.endswith(f": ok ({len(rules)} rules, kafka source)"), out
    return f"ok ({len(rules)} rules); /etc/vigil, /var/lib/vigil and the credentials under {root}"


def _relu_model(path: Path, inputs: int, outputs: int) -> None:
    from vigil.rules.reach.network import Network

    rng = np.random.default_rng(inputs * 10 + outputs)
    layers = [
        (rng.normal(size=(8, inputs)), np.zeros(8)),
        (rng.normal(size=(outputs, 8)), np.zeros(outputs)),
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(Network.from_arrays(layers).to_onnx())


def run_generic(ctx: Ctx, command: str) -> str:
    """operations.md's ``vigil run --config vigil.toml``: runs until SIGTERM, then SIGINT."""
    ctx.need_broker()
    where = ctx.scratch / "operations-run"
    where.mkdir(exist_ok=True)
    outcomes = []
    for how in (signal.SIGTERM, signal.SIGINT):
        port = _free_port()
        (where / "vigil.toml").write_text(substitute(ctx.dev_config, _dev_subs(ctx, port)))
        log = where / f"run-{how.name}.log"
        daemon = _background(command, where, log)
        try:
            _wait_for(f"http://127.0.0.1:{port}/healthz", 60, daemon, log)
            code = _stop(daemon, how)
        finally:
            if daemon.poll() is None:
                daemon.kill()
                daemon.wait()
        assert code == 0, f"exit {code} after {how.name}:\n{_tail(log)}"
        assert "stopped" in log.read_text(), _tail(log)
        outcomes.append(f"{how.name}: exit 0")
    return "/healthz 200, then " + ", ".join(outcomes)


# -- placeholders ----------------------------------------------------------------------------------


def placeholders(mapping: dict[str, str], expect: Callable[[list[dict], Path], str]) -> Run:
    """A command whose arguments name placeholder files: each placeholder (a whole argument)
    becomes the real input named in ``mapping``; ``[--flag]`` runs without and with it."""

    def check(ctx: Ctx, command: str) -> str:
        assert ctx.inputs is not None
        shown = []
        for variant in _optional_variants(command):
            where = ctx.scratch / f"run-{uuid.uuid4().hex[:8]}"
            shutil.copytree(ctx.inputs, where)
            args = [mapping.get(arg, arg) for arg in shlex.split(variant)]
            proc = ok(sh(shlex.join(args), where))
            shown.append(f"{expect(json_lines(proc.stdout), where)} [as: {shlex.join(args)}]")
        return "\n".join(shown)

    how = ", ".join(f"{k} -> {v}" for k, v in mapping.items())
    return Run(check, how=f"placeholders: {how}")


def _optional_variants(command: str) -> list[str]:
    optional = re.search(r"\s\[([^\]]+)\]", command)
    if not optional:
        return [command]
    without = command.replace(optional.group(0), "")
    return [without, f"{without} {optional.group(1)}"]


def _expect_reach(lines: list[dict], where: Path) -> str:
    (verdict,) = lines
    assert verdict["status"] == "holds" and verdict["coverage"] == 1.0, verdict
    return "status holds"


def _expect_vnnlib(lines: list[dict], where: Path) -> str:
    (verdict,) = lines
    assert verdict["result"] == "unsat", verdict
    assert (where / "result.txt").read_text() == "unsat\n"
    return "unsat, result.txt written"


def _expect_batch(lines: list[dict], where: Path) -> str:
    (summary,) = lines
    assert summary["inputs"] == 4, summary
    assert summary["robust"] + summary["not_robust"] + summary["misclassified"] == 4, summary
    return f"{summary['robust']} of 4 robust"


def _expect_knn(lines: list[dict], where: Path) -> str:
    (summary,) = lines
    assert set(summary["summary"]) == {"label", "individual", "epsilon"}, summary
    results = json_lines((where / "results.jsonl").read_text())
    assert [r["index"] for r in results] == [0, 1, 2, 3]
    return f"summary for 3 variants; {len(results)} results in results.jsonl"


def _expect_cfx(lines: list[dict], where: Path) -> str:
    assert [line["row"] for line in lines] == [0, 1], lines
    assert all(line["delta_max"] >= 0 for line in lines)
    provable = all("provable_delta" in line for line in lines)
    return f"2 rows{' with provable_delta' if provable else ''}"


def _expect_explain(lines: list[dict], where: Path) -> str:
    assert [line["row"] for line in lines] == [0, 1] and all(line["found"] for line in lines)
    cfx = np.load(where / "applicants_cfx.npy")
    assert cfx.shape == (2, 3)
    return "2 counterfactuals found, written to applicants_cfx.npy"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """Small real files for the README's placeholders."""
    from tests.test_certify_knn_cli import _data, _write_csv
    from vigil.rules.reach.network import Network

    d = tmp_path_factory.mktemp("placeholders")
    rng = np.random.default_rng(0)
    classes = Network.from_arrays(
        [(rng.normal(size=(6, 3)), rng.normal(size=6)), (rng.normal(size=(3, 6)), np.zeros(3))]
    )
    (d / "classes.onnx").write_bytes(classes.to_onnx())
    x = rng.uniform(0, 1, size=(4, 3))
    top = np.sort(classes.logits(x), axis=1)
    # clear labels: where two logits tie exactly, verify batch ends with "no verdict" (exit 1)
    assert np.all(top[:, -1] - top[:, -2] > 0.1), top
    np.save(d / "inputs.npy", x)
    np.save(d / "labels.npy", np.argmax(classes.logits(x), axis=1))
    np.save(d / "lower.npy", np.zeros(3))
    np.save(d / "upper.npy", np.full(3, 0.1))
    np.save(d / "C.npy", np.array([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]]))
    np.save(d / "d.npy", np.array([1e6, 1e6]))
    # unsafe: output 0 above 1e6 somewhere in the box (it is not: unsat)
    prop = "".join(f"(declare-const X_{i} Real)\n" for i in range(3))
    prop += "".join(f"(declare-const Y_{j} Real)\n" for j in range(3))
    prop += "".join(f"(assert (>= X_{i} 0))\n(assert (<= X_{i} 0.1))\n" for i in range(3))
    (d / "prop.vnnlib").write_text(prop + "(assert (>= Y_0 1000000))\n")
    # class 1 iff x0 + x1 > 1, through a sigmoid head
    binary = Network.from_arrays(
        [
            (np.array([[1.0, 1.0, 0.0], [-1.0, -1.0, 0.0], [0.0, 0.0, 1.0]]), np.zeros(3)),
            (np.array([[4.0, -4.0, 0.1]]), np.array([-4.0])),
        ],
        "sigmoid",
    )
    (d / "binary.onnx").write_bytes(binary.to_onnx())
    np.save(d / "counterfactuals.npy", np.array([[0.8, 0.6, 0.5], [0.3, 0.9, 0.1]]))
    np.save(d / "applicants.npy", np.array([[0.2, 0.3, 0.5], [0.1, 0.4, 0.0]]))
    rows, labels = _data(60, 0)
    header = ["income", "age", "sex", "region"]
    train = [[*row, label] for row, label in zip(rows, labels, strict=True)]
    _write_csv(d / "train.csv", [*header, "approved"], train)
    _write_csv(d / "test.csv", header, _data(4, 1)[0])
    return d


# -- the dev example against the test broker -------------------------------------------------------


def _dev_subs(ctx: Ctx, port: int) -> list[tuple[str, str]]:
    """The dev example's broker, names and port -> the test broker, this run's names, ``port``."""
    tag = uuid.uuid4().hex[:8]
    return [
        ("127.0.0.1:9092", ctx.need_broker()),
        ("vigil.demo.decisions", f"vigil.demo.decisions.{tag}"),
        ("vigil.alerts", f"vigil.alerts.{tag}"),
        ("vigil.dead-letters", f"vigil.dead-letters.{tag}"),
        ('"vigil-dev"', f'"vigil-dev-{tag}"'),
        ('"vigil-dev-0"', f'"vigil-dev-0-{tag}"'),
        ("9464", str(port)),
    ]


def _expected_alerts() -> dict[str, int]:
    """ops/README's count of flagged decisions per rule after one pass of the stream."""
    text = " ".join((REPO / "ops/README.md").read_text().split())
    match = re.search(
        r"`compas-robustness`.*? has flagged (\d+) decisions and `compas-fairness`.*? (\d+);", text
    )
    assert match, "ops/README.md no longer states the alerts of one pass of the stream"
    return {"compas-robustness": int(match.group(1)), "compas-fairness": int(match.group(2))}


def _inline_kcat() -> str:
    match = re.search(r"`(kcat [^`]+)`", (REPO / "ops/README.md").read_text())
    assert match, "ops/README.md no longer shows how to read the alerts with kcat"
    return match.group(1)


def _metrics(text: str) -> dict[tuple[str, frozenset], float]:
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(\w+)\{([^}]*)\} (\S+)$", line)
        if m:
            labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
            out[(m.group(1), labels)] = float(m.group(3))
    return out


@dataclass(frozen=True)
class Walk:
    """One doc's walk through the dev example: its commands in order, then the daemon stopped
    the way the doc says (and, for ops/README, its inline kcat line on the alerts)."""

    steps: tuple[str, ...]
    stop: signal.Signals
    kcat: bool = False


WALKS = {
    "README.md, Running the daemon": Walk(
        (
            f".venv/bin/vigil check-config {DEV_CONFIG}",
            f".venv/bin/vigil run --config {DEV_CONFIG} &",
            ".venv/bin/python ops/demo-producer.py --bootstrap 127.0.0.1:9092",
        ),
        signal.SIGTERM,
    ),
    "ops/README.md, Trying the daemon against the dev broker": Walk(
        (
            f".venv/bin/vigil check-config {DEV_CONFIG}",
            f".venv/bin/vigil run --config {DEV_CONFIG}",  # "leave running; Ctrl-C stops it"
            ".venv/bin/python ops/demo-producer.py",
            "curl -s 127.0.0.1:9464/metrics | grep -E '^vigil_(alerts|events)_total'",
        ),
        signal.SIGINT,
        kcat=True,
    ),
}

Results = dict[str, tuple[bool, str]]  # command -> (passed, what it showed)


def walked(ctx: Ctx, name: str) -> Results:
    """The results of the named walk, which runs once per module."""
    if name not in ctx.cache:
        ctx.cache[name] = _walk(ctx, WALKS[name])
    results = ctx.cache[name]
    assert isinstance(results, dict)
    return results


def _walk(ctx: Ctx, walk: Walk) -> Results:
    ctx.need_broker()
    port = _free_port()
    subs = _dev_subs(ctx, port)
    alerts_topic = substitute("vigil.alerts", subs)
    (ctx.copy / DEV_CONFIG).write_text(substitute(ctx.dev_config, subs))
    shutil.rmtree(ctx.copy / "ops/examples/dev-kafka-state", ignore_errors=True)  # as documented
    expected = _expected_alerts()
    log = ctx.scratch / f"daemon-{alerts_topic}.log"
    results: Results = {}
    daemon: subprocess.Popen | None = None
    run_step = failed = ""
    for step in walk.steps:
        if failed:
            results[step] = (False, f"not reached: {failed}")
            continue
        actual = substitute(step, subs)
        try:
            if " run --config " in step:
                daemon, run_step = _background(actual, ctx.copy, log), step
                continue  # settled once the alerts are read, below
            if "demo-producer.py" in step:
                for option, default in (("--bootstrap", "127.0.0.1:9092"), ("--topic", "")):
                    if option not in actual:  # the documented default, made explicit
                        actual += f" {option} {substitute(default or 'vigil.demo.decisions', subs)}"
                proc = ok(sh(actual, ctx.copy, timeout=120))
                assert f"{PRODUCED} decision events" in proc.stderr, proc.stderr
                detail = f"{PRODUCED} decision events produced"
            elif step.startswith("curl "):
                detail = _poll_metrics(ctx, actual, expected)
            else:
                detail = ok(sh(actual, ctx.copy)).stdout.strip()
                assert detail == f"{DEV_CONFIG}: ok (2 rules, kafka source)", detail
            results[step] = (True, f"{detail} [as: {actual}]")
        except (AssertionError, subprocess.TimeoutExpired) as e:
            failed = f"{step!r} failed"
            results[step] = (False, f"{e} [as: {actual}]")
    if daemon is not None:
        try:
            results[run_step] = (
                True,
                _settle(ctx, walk, results, daemon, alerts_topic, subs, log),
            )
        except (AssertionError, subprocess.TimeoutExpired) as e:
            results[run_step] = (False, f"{e}\ndaemon log:\n{_tail(log)}")
        finally:
            if daemon.poll() is None:
                daemon.kill()
                daemon.wait()
    return results


def _poll_metrics(ctx: Ctx, command: str, expected: dict[str, int]) -> str:
    """ops/README's curl line until the counters show the whole pass (at most 90 s)."""
    deadline = time.monotonic() + 90
    while True:
        proc = sh(command, ctx.copy)
        series = _metrics(proc.stdout)
        alerts = {r: series.get(("vigil_alerts_total", frozenset({("rule", r)}))) for r in expected}
        checked = {
            r: series.get(("vigil_events_total", frozenset({("rule", r), ("outcome", "checked")})))
            for r in expected
        }
        if alerts == expected and all(n == PRODUCED for n in checked.values()):
            return f"vigil_alerts_total {alerts}; vigil_events_total checked {PRODUCED} per rule"
        assert time.monotonic() < deadline, f"after 90 s: alerts {alerts}, checked {checked}"
        time.sleep(1)


def _settle(
    ctx: Ctx,
    walk: Walk,
    results: Results,
    daemon: subprocess.Popen,
    topic: str,
    subs: list[tuple[str, str]],
    log: Path,
) -> str:
    """The daemon's part: the alerts ops/README counts arrive (committed, once each, valid
    against connectors/schemas/alert.json), then the daemon stops cleanly on the doc's signal,
    having logged nothing at level error (a healthy run's start-up included)."""
    import jsonschema

    expected = _expected_alerts()
    assert daemon.poll() is None, f"the daemon exited {daemon.returncode}"
    alerts = asyncio.run(consume_all(ctx.need_broker(), topic, sum(expected.values()), 120))
    by_rule = {rule: sum(a["rule"] == rule for a in alerts) for rule in expected}
    assert by_rule == expected, f"alerts per rule {by_rule}, ops/README.md says {expected}"
    assert len({(a["rule"], a["decision"]["id"]) for a in alerts}) == len(alerts), "duplicates"
    schema = json.loads((ctx.copy / "connectors/schemas/alert.json").read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    for alert in alerts:
        validator.validate(alert)
    if walk.kcat:
        results[KCAT] = _kcat(ctx, subs, len(alerts))
    code = _stop(daemon, walk.stop)
    assert code == 0, f"exit {code} after {walk.stop.name}"
    plain = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text(errors="replace"))
    errors = [line for line in plain.splitlines() if re.match(r"\S+ \[(error|critical)", line)]
    assert not errors, "error-level lines in a healthy run:\n" + "\n".join(errors)
    return (
        f"alerts read with read_committed: {by_rule} as ops/README.md says, none twice, all "
        f"valid against alert.json; {walk.stop.name}: exit 0; no error-level line"
    )


KCAT = "kcat (inline in ops/README.md)"


def _kcat(ctx: Ctx, subs: list[tuple[str, str]], alerts: int) -> tuple[bool, str]:
    command = substitute(_inline_kcat(), subs)
    if shutil.which("kcat") is None:
        return (True, "SKIP: kcat is not installed (apt-get install kcat)")
    proc = sh(command, ctx.copy, timeout=60)
    if proc.returncode != 0:
        return (False, f"exit {proc.returncode}: {proc.stderr[-500:]} [as: {command}]")
    lines = proc.stdout.splitlines()
    if len(lines) != alerts or not all(json.loads(line)["kind"] == "alert" for line in lines):
        return (False, f"{len(lines)} lines for {alerts} alerts [as: {command}]")
    return (True, f"{len(lines)} committed alerts, one JSON object a line [as: {command}]")


def dev_example(ctx: Ctx, command: str) -> str:
    """A command of the dev example's walks: passes when it did in every walk showing it."""
    shown = []
    for name, walk in WALKS.items():
        if command in walk.steps:
            passed, detail = walked(ctx, name)[command]
            assert passed, f"{name}: {detail}"
            shown.append(f"{name}: {detail}")
    assert shown, "in no walk"
    return "\n".join(shown)


# -- Prometheus ------------------------------------------------------------------------------------


def _prometheus_setup(ctx: Ctx) -> Path:
    """ops/README's Prometheus steps 1-2: scrape.yml's job in prometheus.yml, alerts.yml next
    to it and listed under rule_files."""
    setup = ctx.scratch / "prometheus"
    if not setup.exists():
        setup.mkdir()
        scrape = (ctx.copy / "ops/prometheus/scrape.yml").read_text()
        (setup / "prometheus.yml").write_text(f"{scrape}\nrule_files:\n  - alerts.yml\n")
        shutil.copy(ctx.copy / "ops/prometheus/alerts.yml", setup / "alerts.yml")
    return setup


def promtool(ctx: Ctx, command: str) -> str:
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    in_setup = "ops/" not in command  # the Prometheus section's files, not the repository's
    where = _prometheus_setup(ctx) if in_setup else ctx.copy
    proc = ok(sh(command, where))
    said = (proc.stdout + proc.stderr).strip()
    assert "SUCCESS" in said and "FAILED" not in said, said
    lines = [line for line in said.splitlines() if "SUCCESS" in line]
    return "; ".join(line.strip() for line in lines)


def prometheus_reload(ctx: Ctx, command: str) -> str:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus is not installed (apt-get install prometheus)")
    setup = _prometheus_setup(ctx)
    port = _free_port()
    log = ctx.scratch / "prometheus.log"
    data = ctx.scratch / "prometheus-data"
    server = _background(
        f"{binary} --config.file=prometheus.yml --web.enable-lifecycle "
        f"--web.listen-address=127.0.0.1:{port} --storage.tsdb.path={data}",
        setup,
        log,
    )
    try:
        _wait_for(f"http://127.0.0.1:{port}/-/ready", 60, server, log)
        actual = command.replace("localhost:9090", f"127.0.0.1:{port}")
        proc = ok(sh(actual, setup))
        assert proc.stdout == "", f"the reload was refused: {proc.stdout}"
        deadline = time.monotonic() + 10
        while log.read_text().count("Completed loading of configuration file") < 2:
            assert time.monotonic() < deadline, _tail(log)
            time.sleep(0.2)
    finally:
        _stop(server, signal.SIGTERM)
    return f"configuration reloaded by a Prometheus with --web.enable-lifecycle [as: {actual}]"


# -- validation in place of a run ------------------------------------------------------------------


def _compose_cli() -> list[str] | None:
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
        if probe.returncode == 0:
            return ["docker", "compose"]
    return ["docker-compose"] if shutil.which("docker-compose") else None


def compose_config(ctx: Ctx, command: str) -> str:
    """The compose file the command names validates, and has the services it names."""
    cli = _compose_cli()
    if cli is None:
        pytest.skip(
            "not run (needs a Docker daemon), and no Compose CLI to validate the file with "
            "(the docker compose plugin, or apt-get install docker-compose)"
        )
    args = shlex.split(command)
    at = args.index("-f")
    base = shlex.join([*cli, *args[at : at + 2]])
    ok(sh(f"{base} config -q", ctx.copy, timeout=60))
    services = ok(sh(f"{base} config --services", ctx.copy, timeout=60)).stdout.split()
    subcommand, *rest = args[at + 2 :]
    named = [a for a in rest if not a.startswith("-")]
    if subcommand == "exec":
        named = named[:1]  # then the command run in the container
    assert set(named) <= set(services), f"{named} not all among the services {services}"
    return f"{base} config -q: valid; {subcommand} names {named or 'no service'}, all defined"


def unit_verifies(ctx: Ctx, command: str) -> str:
    """The unit file installs as is; systemd-analyze verify accepts it (with the /opt/vigil
    virtualenv it runs replaced by the test .venv, which exists here)."""
    source = ctx.copy / shlex.split(command)[-2]
    assert source.is_file(), f"{source} is missing"
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    unit = ctx.scratch / "systemd" / source.name
    unit.parent.mkdir(exist_ok=True)
    unit.write_text(source.read_text().replace("/opt/vigil/.venv", str(VENV)))
    proc = sh(f"systemd-analyze verify {shlex.quote(str(unit))}", ctx.scratch)
    said = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 0 and not said, said
    return f"systemd-analyze verify {source.name}: no findings (/opt/vigil/.venv -> {VENV})"


def sources_exist(ctx: Ctx, command: str) -> str:
    """The repository files the command copies exist."""
    paths = [a for a in shlex.split(command) if "/" in a and not a.startswith("/")]
    assert paths, "names no repository file"
    missing = [p for p in paths if not (ctx.copy / p).is_file()]
    assert not missing, f"missing: {missing}"
    return f"{', '.join(paths)} present"


def chart_renders(ctx: Ctx, command: str) -> str:
    """`helm template` renders what the install or upgrade would, with the same chart,
    release, namespace and values files."""
    helm = os.environ.get("VIGIL_HELM")
    if not helm or not os.path.exists(helm):
        pytest.skip("helm not found: `bash ops/helm/get.sh helm` builds it (make test does)")
    _, _, release, chart, *options = shlex.split(command)
    args = [helm, "template", release, chart, *options, "--kube-version", "1.31.0"]
    rendered = ok(sh(shlex.join(args), ctx.copy, timeout=120)).stdout
    assert "kind: StatefulSet" in rendered, rendered[:2000]
    return f"`helm template` of {chart} with {' '.join(options)} renders"


# -- the table -------------------------------------------------------------------------------------


def state_topic_settings(ctx: Ctx, command: str) -> str:
    """The documented topic settings are the ones the Kafka store creates its topic with."""
    shown = dict(re.findall(r"--config (\S+)=(\S+)", command))
    assert shown == TOPIC_CONFIG, (shown, TOPIC_CONFIG)
    return f"its --config settings are the store's own: {shown}"


NO_DOCKER = "needs a Docker daemon, images and host ports; validated with compose config instead"
ROOT = "needs root on a systemd host (a deployed machine)"
KUBERNETES = "needs a Kubernetes cluster; tests/test_helm_chart.py checks the chart without one"
DASK = (
    "needs a Dask cluster on other hosts; tests/test_dask_offload.py starts a scheduler and two "
    "workers with the dask command and runs verify batch and certify knn through --scheduler"
)

COMMANDS: dict[str, Run | Excused] = {
    # README.md
    "make demo": Run(make_demo, "in the copy; .venv linked, so nothing is installed"),
    "make test": Excused("the whole suite, which runs this file"),
    ".venv/bin/vigil replay daemon/data/compas-stream.csv --decision-column prediction "
    "--drop-columns label --metric linf --eps 0.04 --alerts-out alerts.jsonl": Run(replay),
    ".venv/bin/vigil report alerts.jsonl --decisions daemon/data/compas-stream.csv "
    "--decision-column prediction --drop-columns label --out report.html": Run(
        report, "after the quick start's replay (run first if its alerts.jsonl is missing)"
    ),
    f".venv/bin/vigil check-config {DEV_CONFIG}": Run(dev_example, "the test broker's config"),
    f".venv/bin/vigil run --config {DEV_CONFIG} &": Run(dev_example, "the test broker's config"),
    ".venv/bin/python ops/demo-producer.py --bootstrap 127.0.0.1:9092": Run(
        dev_example, "--bootstrap: the test broker; --topic: this run's"
    ),
    "vigil verify reach --model M.onnx --lower L.npy --upper U.npy --C C.npy --d D.npy": (
        placeholders(
            {
                "M.onnx": "classes.onnx",
                "L.npy": "lower.npy",
                "U.npy": "upper.npy",
                "C.npy": "C.npy",
                "D.npy": "d.npy",
            },
            _expect_reach,
        )
    ),
    "vigil verify batch --model M.onnx --inputs X.npy --labels y.npy --eps 0.03": placeholders(
        {"M.onnx": "classes.onnx", "X.npy": "inputs.npy", "y.npy": "labels.npy"}, _expect_batch
    ),
    "vigil verify vnnlib M.onnx SPEC.vnnlib --timeout 60 --out result.txt": placeholders(
        {"M.onnx": "classes.onnx", "SPEC.vnnlib": "prop.vnnlib"}, _expect_vnnlib
    ),
    "vigil certify knn --train DATA.csv --target COL --protected sex --flips 1 "
    "--inputs TEST.csv --out results.jsonl": placeholders(
        {"DATA.csv": "train.csv", "COL": "approved", "TEST.csv": "test.csv"}, _expect_knn
    ),
    "vigil certify cfx --model M.onnx --cfx CFX.npy [--provable]": placeholders(
        {"M.onnx": "binary.onnx", "CFX.npy": "counterfactuals.npy"}, _expect_cfx
    ),
    "vigil explain --model M.onnx --x X.npy --robust --delta 0.05": placeholders(
        {"M.onnx": "binary.onnx", "X.npy": "applicants.npy"}, _expect_explain
    ),
    # docs/operations.md
    "vigil check-config vigil.toml": Run(check_config_generic, "vigil.toml: the dev example"),
    "vigil run --config vigil.toml": Run(run_generic, "vigil.toml: the dev example, test broker"),
    "helm install vigil ops/helm/vigil --namespace seldon-mesh -f ops/helm/examples/seldon.yaml": (
        Excused(KUBERNETES, chart_renders)
    ),
    "helm upgrade vigil ops/helm/vigil --namespace seldon-mesh -f ops/helm/examples/seldon.yaml": (
        Excused(KUBERNETES, chart_renders)
    ),
    "helm uninstall vigil --namespace seldon-mesh": Excused(KUBERNETES),
    # ops/README.md
    "make kafka-start": Run(make_kafka_start, "KAFKA_PORT: the test broker's port"),
    f".venv/bin/vigil run --config {DEV_CONFIG}": Run(dev_example, "in the background"),
    ".venv/bin/python ops/demo-producer.py": Run(
        dev_example, "--bootstrap and --topic: the test broker and this run's topic"
    ),
    "curl -s 127.0.0.1:9464/metrics | grep -E '^vigil_(alerts|events)_total'": Run(
        dev_example, "port 9464 -> this run's metrics port"
    ),
    "docker compose -f ops/compose.yaml up -d --build": Excused(NO_DOCKER, compose_config),
    "docker compose -f ops/compose.yaml ps": Excused(NO_DOCKER, compose_config),
    "docker compose -f ops/compose.yaml logs -f vigil": Excused(NO_DOCKER, compose_config),
    "docker compose -f ops/compose.yaml down -v": Excused(NO_DOCKER, compose_config),
    "docker compose -f ops/compose.yaml exec kafka /opt/kafka/bin/kafka-console-consumer.sh "
    "--bootstrap-server kafka:9092 --topic vigil.alerts --from-beginning --max-messages 5": (
        Excused(NO_DOCKER, compose_config)
    ),
    "docker compose -f ops/compose.yaml up -d --wait kafka": Excused(NO_DOCKER, compose_config),
    "docker compose -f ops/compose.yaml down": Excused(NO_DOCKER, compose_config),
    "vigil check-config /etc/vigil/vigil.toml": Run(
        check_config_installed, "/etc/vigil, /var/lib/vigil: temporary directories"
    ),
    "vigil run --config /etc/vigil/vigil.toml": Excused(
        "needs the production brokers (kafka-*.internal); `vigil run` runs on the dev example"
    ),
    "useradd --system --home-dir /var/lib/vigil --shell /usr/sbin/nologin vigil": Excused(ROOT),
    "python3 -m venv /opt/vigil/.venv": Excused(
        "writes /opt (root); tests/test_packaging.py makes a venv and installs the wheel in it"
    ),
    "/opt/vigil/.venv/bin/pip install /path/to/vigil": Excused(
        "downloads every dependency; tests/test_packaging.py builds and installs the wheel"
    ),
    "install -D -m 0640 -g vigil ops/examples/vigil.toml /etc/vigil/vigil.toml": Excused(
        ROOT, sources_exist
    ),
    "install -m 0600 /dev/stdin /etc/vigil/kafka-sasl-password": Excused(ROOT),
    "install -m 0644 ops/systemd/vigil.service /etc/systemd/system/": Excused(ROOT, unit_verifies),
    "systemctl daemon-reload": Excused(ROOT),
    "pip install 'vigil-daemon[dask]'": Excused(
        "installs from the package index; make test installs the dask extra the same way"
    ),
    "kafka-topics.sh --bootstrap-server BROKER:9092 --create --topic fraud-state --partitions 12 "
    "--replication-factor 3 --config cleanup.policy=compact --config segment.bytes=67108864": (
        Excused(
            "an operator's alternative to the topic the daemon creates; tests/test_state_stores.py "
            "creates state topics with other settings and checks how the store takes them",
            state_topic_settings,
        )
    ),
    "dask scheduler --port 8786": Excused(DASK),
    "dask worker tcp://SCHEDULER:8786 --nworkers 2 --nthreads 1": Excused(DASK),
    "vigil verify batch --model M.onnx --inputs X.npy --labels y.npy --eps 0.03 --scheduler "
    "tcp://SCHEDULER:8786": Excused(DASK),
    "vigil certify knn --train DATA.csv --target COL --protected sex --flips 1 --inputs TEST.csv "
    "--out results.jsonl --scheduler tcp://SCHEDULER:8786": Excused(DASK),
    "systemctl enable --now vigil": Excused(ROOT),
    "journalctl -u vigil -f": Excused(ROOT + " running the unit"),
    "promtool check config prometheus.yml": Run(promtool, "prometheus.yml made by steps 1-2"),
    "promtool check rules alerts.yml": Run(promtool, "alerts.yml copied by step 2"),
    "curl -X POST http://localhost:9090/-/reload": Run(
        prometheus_reload, "a Prometheus started on a free port"
    ),
    "promtool check rules ops/prometheus/alerts.yml": Run(promtool),
    "promtool test rules ops/prometheus/alerts_test.yml": Run(promtool),
}


# -- the report ------------------------------------------------------------------------------------

REPORT: dict[str, tuple[str, str]] = {}  # command -> (outcome, detail)


@pytest.fixture(scope="module")
def ctx(tmp_path_factory, inputs) -> Iterator[Ctx]:
    if not (VENV / "bin" / "vigil").exists():
        pytest.skip(f"run with the project's .venv: no vigil in {VENV / 'bin'}")
    base = tmp_path_factory.mktemp("docs")
    copy = base / "vigil"
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, tracked.split("\0")):
        source = REPO / name
        if source.is_file():  # a tracked file deleted in the working tree is left out
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name)
    (copy / ".venv").symlink_to(VENV)
    stamp = VENV / ".installed"
    if stamp.exists():  # older than the install stamp: make does not reinstall
        past = stamp.stat().st_mtime - 60
        os.utime(copy / "pyproject.toml", (past, past))
    scratch = base / "scratch"
    scratch.mkdir()
    context = Ctx(copy, scratch, os.environ.get("VIGIL_KAFKA_BOOTSTRAP"), inputs)
    context.dev_config = (copy / DEV_CONFIG).read_text()
    yield context
    _print_report(base / "docs-commands.txt")


def _print_report(path: Path) -> None:
    where: dict[str, list[str]] = {}
    for shown in documented():
        where.setdefault(shown.command, []).append(str(shown))
    lines = [f"documented commands ({', '.join(DOCS)}): {len(where)}"]
    for command, places in where.items():
        outcome, detail = REPORT.get(command, ("NOT RUN", "its test did not run"))
        lines.append(f"{outcome:8} {command}  [{', '.join(places)}]")
        lines.extend(f"         -> {part}" for part in detail.splitlines() if part)
    for command, (outcome, detail) in REPORT.items():
        if command not in where:
            lines.append(f"{outcome:8} {command}  [inline in ops/README.md]")
            lines.append(f"         -> {detail}")
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    print(f"\n{text}(report written to {path})")


def _record(command: str, fn: Callable[[], tuple[str, str]]) -> None:
    try:
        REPORT[command] = fn()
    except pytest.skip.Exception as e:
        REPORT[command] = ("SKIPPED", str(e.msg))
        raise
    except BaseException as e:
        said = " ".join(str(e).split()) or repr(e)
        REPORT[command] = ("FAILED", said[:400])
        raise


# -- the tests -------------------------------------------------------------------------------------


def test_parser_reads_commands_as_a_shell_would():
    text = "\n".join(
        [
            "Intro `not a command`.",
            "```sh",
            "make demo   # a comment",
            "# a whole-line comment",
            "",
            "vigil replay a.csv \\",
            "    --eps 0.04 --alerts-out 'x # y.jsonl'",
            "vigil run --config c.toml &",
            "```",
            "```json",
            '{"decisions": 1}',
            "```",
            "   ```console",
            "   $ vigil check-config c.toml",
            "   c.toml: ok (2 rules, kafka source)",
            "   ```",
            "```python",
            "print('no')",
            "```",
        ]
    )
    assert [(s.command, s.line) for s in parse(text, "X.md")] == [
        ("make demo", 3),
        ("vigil replay a.csv --eps 0.04 --alerts-out 'x # y.jsonl'", 6),
        ("vigil run --config c.toml &", 8),
        ("vigil check-config c.toml", 14),
    ]
    dangling = parse("```sh\nvigil run \\\n```\n", "Y.md")
    assert [s.command for s in dangling] == ["vigil run \\"]


def test_every_fenced_block_names_its_language():
    """A block without a language could hold commands the parser never sees."""
    bare = []
    for doc in DOCS:
        inside = None
        for number, line in enumerate((REPO / doc).read_text().splitlines(), 1):
            fence = _FENCE.match(line)
            if not fence:
                continue
            if inside is None:
                inside = fence.group(1)
                if not fence.group(2):
                    bare.append(f"{doc}:{number}")
            elif line.strip() and set(line.strip()) == {inside[0]}:
                inside = None
    assert not bare, f"fenced blocks without a language (sh, json, ...): {bare}"


def test_every_documented_command_has_an_entry():
    missing = [f"{s}: {s.command}" for s in documented() if s.command not in COMMANDS]
    assert not missing, "documented commands with no entry in COMMANDS:\n" + "\n".join(missing)


def test_every_entry_is_a_documented_command():
    shown = {s.command for s in documented()}
    stale = [c for c in COMMANDS if c not in shown]
    assert not stale, "COMMANDS entries for commands the docs no longer show:\n" + "\n".join(stale)
    for name, walk in WALKS.items():
        assert set(walk.steps) <= shown, f"{name}: walks through commands the docs do not show"


@pytest.mark.parametrize(
    "command", [c for c in _documented_commands() if c in COMMANDS], ids=lambda c: c[:60]
)
def test_documented_command(command: str, ctx: Ctx):
    entry = COMMANDS[command]

    def run() -> tuple[str, str]:
        if isinstance(entry, Run):
            detail = entry.check(ctx, command)
            return ("RAN", f"{detail} ({entry.how})" if entry.how else detail)
        if entry.instead is None:
            return ("EXCUSED", entry.reason)
        return ("EXCUSED", f"{entry.reason}\nchecked instead: {entry.instead(ctx, command)}")

    _record(command, run)
    if isinstance(entry, Excused) and entry.instead is None:
        pytest.skip(f"not run: {entry.reason}")


def test_inline_kcat_command_reads_the_committed_alerts(ctx: Ctx):
    """ops/README's kcat line (inline, in the prose after the walk-through), on that walk's
    alerts topic; run when kcat is installed."""
    command = _inline_kcat()

    def run() -> tuple[str, str]:
        results = walked(ctx, "ops/README.md, Trying the daemon against the dev broker")
        assert KCAT in results, f"the walk stopped before the alerts were read: {results}"
        passed, detail = results[KCAT]
        if detail.startswith("SKIP: "):
            pytest.skip(detail.removeprefix("SKIP: "))
        assert passed, detail
        return ("RAN", detail)

    _record(command, run)
