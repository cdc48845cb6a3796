"""The ops pack's Prometheus rules and Grafana dashboard against a live daemon.

A real `vigil run` (ior, reach and certify rules, exactly-once) reads the dev broker; a real
`prometheus`, configured from ops/prometheus/scrape.yml (only the target, the intervals and
the rule file changed), scrapes it every second and evaluates ops/prometheus/alerts.yml.
Once the daemon has answered decisions, bad events, model updates and certification
requests, every PromQL expression of ops/grafana/vigil-dashboard.json and every alert
expression is run through Prometheus' HTTP API: each must evaluate without error or warning,
every series selector in it must match scraped series (so a renamed metric or label value
fails here), and each dashboard expression must return a finite value. Prometheus' view must
also agree with what the daemon wrote to its output topics, the rule group must load
healthy, and the alerts this traffic should raise (and only those) must be active.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pytest

from tests.daemon_harness import (
    KNN_RULE,
    Daemon,
    consume_all,
    decision_events,
    expected_alerts,
    free_port,
    produce,
)
from vigil.rules.reach.network import Network

REPO = Path(__file__).resolve().parents[1]
SCRAPE = REPO / "ops" / "prometheus" / "scrape.yml"
ALERTS = REPO / "ops" / "prometheus" / "alerts.yml"
DASHBOARD = REPO / "ops" / "grafana" / "vigil-dashboard.json"

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None or shutil.which("promtool") is None,
    reason="prometheus or promtool not found (apt-get install prometheus, or a Prometheus release)",
)

JOB = "vigil"  # the job of scrape.yml, selected by every rule and the dashboard's default
WINDOW = "5m"
"""What $__rate_interval (and $__interval, $__range) stand for: Grafana derives them from a
panel's time range and step; here they cover the whole run (well under 5 minutes), so the
rates and quantiles an instant query returns at the end include all the traffic."""

# --- the daemon's rules and traffic ---------------------------------------------------------

REACH_EPS = 0.05
REACH_RULE = """
[[rules]]
name = "reach"
kind = "reach"
topic = "decisions-{tag}"
model = "m"
models_topic = "models-{tag}"
onnx = "model.onnx"
window = 200
eps = %(eps)s
C = [[1.0, 0.0], [0.0, 1.0]]
d = [%(d)s, %(d)s]
max_branches = 512
accelerations = "bmi+lb+bmw+ic"
"""


def reach_networks() -> tuple[Network, Network, float]:
    """v1 meets ``y <= d`` on [0, 1]^3 widened by REACH_EPS (d is above an interval bound of
    its outputs there); v2, its output bias raised by 3 d, breaks it everywhere."""
    rng = np.random.default_rng(8)
    w1, b1 = rng.normal(size=(8, 3)), rng.normal(size=8)
    w2 = rng.normal(size=(2, 8))
    bound = np.abs(w2) @ (np.abs(w1) @ np.full(3, 1 + REACH_EPS) + np.abs(b1))
    d = float(np.ceil(bound.max()) + 1)
    v1 = Network.from_arrays([(w1, b1), (w2, np.zeros(2))])
    v2 = Network.from_arrays([(w1, b1), (w2, np.full(2, 3 * d))])
    return v1, v2, d


def knn_requests() -> list[bytes]:
    """Two small KNN fairness certifications, an undecodable record and an invalid request."""
    out = []
    for i in range(2):
        rng = np.random.default_rng(i + 1)
        x = rng.random((80, 4)).round(3)
        sex = rng.integers(0, 2, 80)
        y = ((x[:, 0] + x[:, 1] + 0.3 * rng.random(80)) > 1.1).astype(int)
        rows = [[*map(float, r), int(s)] for r, s in zip(x, sex, strict=True)]
        request = {
            "id": f"knn{i}",
            "train": {"x": rows, "y": y.tolist()},
            "protected": [4],
            "flips": 1,
            "inputs": rows[:5],
            "variant": "individual",
        }
        out.append(orjson.dumps(request))
    return [*out, b"{not json", b'{"id": "bad"}']


BAD_DECISIONS = [
    b"{not json",  # undecodable
    b"[1, 2, 3]",  # schema
    orjson.dumps({"id": "b1", "model": "compas", "x": [0.1, 0.2], "y": 1}),  # dimension (ior)
    orjson.dumps({"id": "b2", "model": "m", "x": [0.5, 0.5], "y": 0}),  # dimension (reach)
    b'{"id": "b3", "model": "compas", "x": [NaN' + b", 0" * 13 + b'], "y": 1}',  # non_finite
]
EXPECTED_DEAD = {
    "undecodable": 2,  # one decision, one request
    "schema": 1,
    "dimension": 2,
    "non_finite": 1,
    "invalid_request": 1,  # the request without inputs (also answered, status "invalid")
}


# --- processes ------------------------------------------------------------------------------


def _descendants(pid: int) -> set[int]:
    """The process ids below ``pid`` (worker processes, multiprocessing's helpers), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry.name))
    out, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def stop_daemon(daemon: Daemon) -> tuple[int | None, set[int]]:
    """SIGTERM (the daemon drains and stops its pools), SIGKILL if it hangs; then wait for its
    worker processes to go and kill any that did not. Returns the exit code and the pids that
    had to be killed. Safe to call twice."""
    proc = daemon.proc
    if proc is None:
        return None, set()
    if proc.poll() is not None:  # stopped already (its pid may belong to another process now)
        daemon.log.close()
        return proc.returncode, set()
    family = _descendants(proc.pid)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=40)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    daemon.log.close()
    deadline = time.monotonic() + 10  # workers exit with their parent within about a second
    while (left := {p for p in family if _alive(p)}) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return proc.returncode, left


@dataclass
class Prometheus:
    base: str
    proc: subprocess.Popen
    log: Path

    def api(self, path: str, **params: str) -> dict:
        """A JSON answer of the HTTP API (error answers included, with their status)."""
        url = f"{self.base}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return json.load(response)
        except urllib.error.HTTPError as e:
            return json.loads(e.read() or b"{}") | {"http_status": e.code}

    def query(self, expr: str, at: float | None = None) -> dict:
        params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        return self.api("/api/v1/query", **params)

    def values(self, expr: str) -> dict[frozenset, float]:
        """An instant vector's samples by label set ({} when the query fails)."""
        answer = self.query(expr)
        if answer.get("status") != "success" or answer["data"]["resultType"] != "vector":
            return {}
        return {
            frozenset(s["metric"].items()): float(s["value"][1]) for s in answer["data"]["result"]
        }

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def prometheus_config(metrics_port: int) -> str:
    """ops/prometheus/scrape.yml with the daemon's port as target, 1 s scrapes and rule
    evaluations, and alerts.yml as rule file; everything else (job name, path, relabelling)
    as it is there."""
    text = SCRAPE.read_text()
    for pattern, new in [
        (r"(scrape_interval:\s*)\S+", r"\g<1>1s"),
        (r"(scrape_timeout:\s*)\S+", r"\g<1>1s"),
        (r"(targets:\s*)\[[^\]]*\]", rf'\g<1>["127.0.0.1:{metrics_port}"]'),
    ]:
        text, n = re.subn(pattern, new, text)
        assert n == 1, f"{SCRAPE}: expected one match of {pattern!r}, found {n}"
    assert "global:" not in text and "rule_files:" not in text, "extend prometheus_config()"
    return (
        f"global:\n  evaluation_interval: 1s\nrule_files:\n  - {json.dumps(str(ALERTS))}\n\n{text}"
    )


@pytest.fixture
def reach_models(tmp_path) -> tuple[Network, Network, float]:
    v1, v2, d = reach_networks()
    (tmp_path / "model.onnx").write_bytes(v1.to_onnx())
    return v1, v2, d


@pytest.fixture
def daemon(kafka_bootstrap, tmp_path, reach_models):
    _, _, d = reach_models
    run = Daemon(
        kafka_bootstrap,
        tmp_path,
        exactly_once=True,
        snapshot_every_events=500,  # several snapshots written while the test runs
        extra_rules=REACH_RULE % {"eps": REACH_EPS, "d": d} + KNN_RULE,
    )
    try:
        run.start()
        yield run
    finally:
        stop_daemon(run)


@pytest.fixture
def prometheus(daemon, tmp_path):
    config = tmp_path / "prometheus.yml"
    config.write_text(prometheus_config(daemon.port))
    check = subprocess.run(
        ["promtool", "check", "config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    port = free_port()
    log = tmp_path / "prometheus.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
        )
    try:
        yield Prometheus(f"http://127.0.0.1:{port}", proc, log)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


async def wait_until(check: Callable[[], object], what: str, timeout: float) -> object:
    """Poll ``check`` until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := check():
            return result
        await asyncio.sleep(0.25)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


# --- the expressions ------------------------------------------------------------------------


def dashboard_queries(dashboard: dict) -> list[tuple[str, str, str]]:
    """(panel title and refId, expr, legendFormat) of every panel target, panels nested in
    rows included."""
    out: list[tuple[str, str, str]] = []

    def walk(panels: list[dict]) -> None:
        for panel in panels:
            for target in panel.get("targets", []):
                if target.get("expr"):
                    title = f"{panel['title']} [{target['refId']}]"
                    out.append((title, target["expr"], target.get("legendFormat") or ""))
            walk(panel.get("panels", []))

    walk(dashboard["panels"])
    return out


def grafana_values(dashboard: dict) -> dict[str, str]:
    """What each variable stands for: the interval globals, and each dashboard variable's
    default (a variable left at "All" becomes its allValue, as Grafana renders it)."""
    values = {"__rate_interval": WINDOW, "__interval": WINDOW, "__range": WINDOW}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "datasource":
            continue
        current = variable.get("current", {}).get("value")
        if variable.get("includeAll") and current in ("$__all", ["$__all"], None):
            values[variable["name"]] = variable.get("allValue") or ".*"
        elif isinstance(current, list):
            values[variable["name"]] = "(" + "|".join(map(re.escape, current)) + ")"
        else:
            values[variable["name"]] = current
    return values


_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)")


def substitute(expr: str, values: dict[str, str]) -> str:
    def one(match: re.Match) -> str:
        name = next(g for g in match.groups() if g)
        assert name in values, f"no value for Grafana variable ${name} in {expr!r}"
        return values[name]

    return _VARIABLE.sub(one, expr)


def alert_rules(text: str) -> list[tuple[str, str]]:
    """(alert, expr) of alerts.yml: plain, quoted and block-scalar exprs (PyYAML is not a
    dependency, and the file is plain block YAML)."""
    lines = text.splitlines()
    out: list[tuple[str, str]] = []
    name = None
    i = 0
    while i < len(lines):
        if m := re.match(r"^\s*-\s+alert:\s*[\"']?([A-Za-z0-9_]+)", lines[i]):
            name = m.group(1)
        elif m := re.match(r"^(\s*)expr:\s*(.*?)\s*$", lines[i]):
            indent, value = len(m.group(1)), m.group(2)
            if value[:1] in ("|", ">"):
                block = []
                while i + 1 < len(lines) and (
                    not lines[i + 1].strip()
                    or len(lines[i + 1]) - len(lines[i + 1].lstrip()) > indent
                ):
                    i += 1
                    block.append(lines[i].strip())
                value = "\n".join(block).strip()
            elif value[:1] == '"':
                value = json.loads(value)
            elif value[:1] == "'":
                value = value[1:-1].replace("''", "'")
            assert name is not None, f"{ALERTS}: expr before any alert"
            out.append((name, value))
            name = None
        i += 1
    return out


_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*\{([^{}]*)\}")


def selectors(expr: str) -> list[str]:
    """The series selectors (``name{matchers}``) of a PromQL expression."""
    return [f"{m.group(1)}{{{m.group(2)}}}" for m in _SELECTOR.finditer(expr)]


def label_values_queries(dashboard: dict, values: dict[str, str]) -> dict[str, tuple[str, str]]:
    """Each query variable's ``label_values(selector, label)``, variables substituted."""
    out = {}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        m = re.fullmatch(r"\s*label_values\((.+),\s*(\w+)\)\s*", variable["query"])
        assert m, f"variable {variable['name']}: unsupported query {variable['query']!r}"
        out[variable["name"]] = (substitute(m.group(1), values), m.group(2))
    return out


def _finite(data: dict) -> bool:
    if data["resultType"] == "scalar":
        samples = [data["result"][1]]
    else:
        samples = [s["value"][1] for s in data["result"]]
    return any(math.isfinite(float(v)) for v in samples)


def _problems(answer: dict) -> str | None:
    if answer.get("status") != "success":
        return f"{answer.get('errorType')}: {answer.get('error')}"
    if answer.get("warnings"):
        return f"warnings: {answer['warnings']}"
    return None


# --- the test -------------------------------------------------------------------------------


async def test_dashboard_and_alert_expressions_on_a_live_daemon(
    kafka_bootstrap, compas, reach_models, daemon, prometheus
):
    _, v2, _ = reach_models
    prom = prometheus
    x, y = compas  # 3000 decisions: 381 alerts, 3737 witness pairs

    # 1. the daemon is ready and Prometheus scrapes it, before any traffic: every counter is
    # first scraped at 0, so rate() and increase() see all of the traffic
    def ready() -> bool:
        code = daemon.proc.poll()
        assert code is None, f"the daemon exited ({code}):\n{daemon.log_text()[-4000:]}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{daemon.port}/readyz", timeout=2):
                return True
        except (urllib.error.URLError, OSError):
            return False

    await wait_until(ready, "/readyz", 60)

    def scraped() -> bool:
        assert prom.proc.poll() is None, f"prometheus exited:\n{prom.log_text()}"
        up = prom.values(f'up{{job="{JOB}"}}')
        return (
            list(up.values()) == [1.0]
            and bool(prom.values(f'count_over_time(up{{job="{JOB}"}}[{WINDOW}]) >= 3'))
            and bool(prom.values(f'vigil_events_total{{job="{JOB}", rule="compas-fairness"}}'))
        )

    await wait_until(scraped, "Prometheus to scrape the daemon 3 times", 30)
    targets = prom.api("/api/v1/targets")["data"]["activeTargets"]
    assert [(t["labels"]["job"], t["health"]) for t in targets] == [(JOB, "up")], targets

    # 2. traffic for every rule, in two waves: decisions (alerts, witnesses, dead letters of
    # each reason), certification requests (jobs in the default pool), a model update that
    # breaks the spec. The labelled histograms (vigil_check_seconds by rule and backend,
    # vigil_offload_job_seconds by pool and kind) are not created at 0 when the daemon starts
    # (Metrics.start creates counters only), so a series first scraped after its only
    # observations never shows a rate and its latency panels stay NaN: the first wave makes
    # each series, the second, sent once Prometheus has scraped them, moves them.
    rng = np.random.default_rng(0)
    reach_x = rng.uniform(0, 1, size=(60, 3))
    reach_x[0], reach_x[1] = 0.0, 1.0
    reach = [
        orjson.dumps({"id": f"r{i}", "model": "m", "x": row.tolist(), "y": 0})
        for i, row in enumerate(reach_x)
    ]
    compas_events = decision_events(x, y, "compas")
    requests = knn_requests()
    await produce(kafka_bootstrap, daemon.topic_for("knn"), requests[:1], key=b"lender")
    await produce(kafka_bootstrap, daemon.topic, compas_events[:1000] + reach[:30])
    first = await consume_all(kafka_bootstrap, daemon.verifications_topic, 1, 60, settle=0.5)
    assert first and first[-1]["status"] == "holds", daemon.log_text()[-4000:]
    histograms = [
        f'vigil_check_seconds_count{{job="{JOB}", rule="compas-fairness"}}',
        f'vigil_check_seconds_count{{job="{JOB}", rule="reach"}}',
        f'vigil_offload_job_seconds_count{{job="{JOB}", kind="certify.knn"}}',
        f'vigil_offload_job_seconds_count{{job="{JOB}", kind="reach.step"}}',
    ]
    await wait_until(
        lambda: all(prom.values(h) for h in histograms), "the first wave's histograms", 30
    )
    await produce(kafka_bootstrap, daemon.topic_for("knn"), requests[1:], key=b"lender")
    await produce(kafka_bootstrap, daemon.topic, compas_events[1000:] + reach[30:] + BAD_DECISIONS)
    update = {"model": "m", "version": "2", "onnx": base64.b64encode(v2.to_onnx()).decode()}
    await produce(kafka_bootstrap, daemon.topic_for("models"), [orjson.dumps(update)], key=b"m")

    # 3. the daemon's answers, to compare with what Prometheus shows
    expected = expected_alerts(x, y, daemon.eps)
    alerts = await consume_all(kafka_bootstrap, daemon.alerts_topic, len(expected), 60, 0.5)
    assert len(alerts) == len(expected), daemon.log_text()[-4000:]
    certifications = await consume_all(
        kafka_bootstrap, daemon.certifications_topic, 3, 60, settle=0.5
    )
    assert sorted((c["request_id"], c["status"]) for c in certifications) == [
        ("bad", "invalid"),
        ("knn0", "ok"),
        ("knn1", "ok"),
    ], certifications

    deadline = time.monotonic() + 60
    while True:  # until the step after the update is out (steps before it may still come)
        verifications = await consume_all(
            kafka_bootstrap, daemon.verifications_topic, len(first) + 1, 10, settle=0.5
        )
        if any(v["version"] == "2" and v["status"] == "violated" for v in verifications):
            break
        assert time.monotonic() < deadline, (verifications, daemon.log_text()[-4000:])
    dead = await consume_all(kafka_bootstrap, daemon.dead_topic, 7, 30, settle=0.5)
    assert Counter(d["reason"] for d in dead) == EXPECTED_DEAD, dead

    # 4. Prometheus has scraped all of it: its latest values equal the topics' counts
    want = {
        f'sum by (rule) (vigil_alerts_total{{job="{JOB}"}} > 0)': {
            frozenset({"rule": "compas-fairness"}.items()): float(len(alerts))
        },
        f'sum by (reason) (vigil_dead_letters_total{{job="{JOB}"}} > 0)': {
            frozenset({"reason": r}.items()): float(n) for r, n in EXPECTED_DEAD.items()
        },
        f'sum by (outcome) (vigil_offload_jobs_total{{job="{JOB}", kind="certify.knn"}} > 0)': {
            frozenset({"outcome": s}.items()): float(n)
            for s, n in Counter(c["status"] for c in certifications).items()
        },
        f'sum by (status) (vigil_verifications_total{{job="{JOB}", rule="reach"}} > 0)': {
            frozenset({"status": s}.items()): float(n)
            for s, n in Counter(v["status"] for v in verifications).items()
        },
        f'vigil_events_total{{job="{JOB}", outcome="checked"}} > 0': None,  # checked below
    }

    def caught_up() -> bool:
        checked = {dict(k)["rule"]: v for k, v in prom.values(list(want)[-1]).items()}
        # reach: its decisions and the model update; knn: the requests that parse
        if checked != {"compas-fairness": len(x), "reach": len(reach) + 1, "knn-fairness": 3}:
            return False
        return all(prom.values(q) == w for q, w in want.items() if w is not None)

    try:
        await wait_until(caught_up, "Prometheus to scrape the final counts", 20)
    except AssertionError:
        got = {q: prom.values(q) for q in want}
        raise AssertionError(f"Prometheus disagrees with the output topics: {got}") from None

    # 5. the rule group: loaded from alerts.yml, every rule evaluated and healthy
    rules = alert_rules(ALERTS.read_text())
    names = [name for name, _ in rules]
    assert len(names) >= 14 and len(set(names)) == len(names), names

    def evaluated() -> list[dict] | None:
        groups = prom.api("/api/v1/rules")["data"]["groups"]
        loaded = [r for g in groups for r in g["rules"]]
        if loaded and all(r["health"] != "unknown" for r in loaded):
            return groups
        return None

    groups = await wait_until(evaluated, "every rule to be evaluated", 15)
    assert [(g["name"], Path(g["file"]).resolve()) for g in groups] == [("vigil", ALERTS)]
    loaded = groups[0]["rules"]
    assert [r["name"] for r in loaded] == names
    unhealthy = {
        r["name"]: (r["health"], r.get("lastError")) for r in loaded if r["health"] != "ok"
    }
    assert not unhealthy, unhealthy
    assert all(r["type"] == "alerting" for r in loaded)

    # 6. every expression: evaluates cleanly, its selectors match scraped series, and the
    # dashboard's return a finite value
    dashboard = json.loads(DASHBOARD.read_text())
    values = grafana_values(dashboard)
    assert values["job"] == JOB, "the dashboard's default job is not scrape.yml's"
    panels = [(t, substitute(e, values), legend) for t, e, legend in dashboard_queries(dashboard)]
    assert len(panels) >= 25, panels
    at = time.time()
    failures: list[str] = []
    for title, expr, legend in [*panels, *[(f"alert {n}", e, "") for n, e in rules]]:
        found = selectors(expr)
        if not found:
            failures.append(f"{title}: no series selector found in {expr!r}")
        for selector in found:
            answer = prom.query(selector, at)
            if problem := _problems(answer):
                failures.append(f"{title}: {selector}: {problem}")
            elif not answer["data"]["result"]:
                failures.append(f"{title}: no series match {selector}")
        answer = prom.query(expr, at)
        if problem := _problems(answer):
            failures.append(f"{title}: {problem}\n    {expr}")
        elif title.startswith("alert "):
            continue  # an alert expression returns data only while its condition holds
        elif not answer["data"]["result"]:
            failures.append(f"{title}: no data\n    {expr}")
        elif not _finite(answer["data"]):
            failures.append(f"{title}: only NaN/Inf\n    {expr}\n    {answer['data']['result']}")
        elif answer["data"]["resultType"] == "vector":  # the legend names labels it has
            for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", legend):
                if any(label not in s["metric"] for s in answer["data"]["result"]):
                    failures.append(f"{title}: legend {legend!r}: no label {label!r}")

    # the variables' label_values() queries offer this run's job, rules and topics
    offered = {
        "job": {JOB},
        "rule": {"compas-fairness", "reach", "knn-fairness"},
        "topic": {daemon.topic, daemon.topic_for("knn"), daemon.topic_for("models")},
    }
    for name, (selector, label) in label_values_queries(dashboard, values).items():
        answer = prom.api(f"/api/v1/label/{label}/values", **{"match[]": selector})
        if problem := _problems(answer):
            failures.append(f"variable {name}: {problem}")
        elif not offered.get(name, set()) <= set(answer["data"]) or not answer["data"]:
            failures.append(f"variable {name}: {selector} offers {answer['data']}")
    assert not failures, "\n".join(failures)

    # 7. the alerts this traffic raises, and no others: the spec violation fires at once,
    # dead letters and the witness rate (3737 pairs in well under 10 minutes > 1/s) are
    # pending (their `for` has not passed)
    def active() -> set[tuple[str, str]]:
        found = prom.api("/api/v1/alerts")["data"]["alerts"]
        return {(a["labels"]["alertname"], a["state"]) for a in found}

    expected_active = {
        ("VigilSpecViolated", "firing"),
        ("VigilDeadLettersIncreasing", "pending"),  # one per reason
        ("VigilWitnessRateHigh", "pending"),
    }
    try:
        await wait_until(lambda: active() == expected_active, "the expected alerts", 10)
    except AssertionError:
        raise AssertionError(f"active alerts {active()}, expected {expected_active}") from None
    (spec,) = [a for a in prom.api("/api/v1/alerts")["data"]["alerts"] if a["state"] == "firing"]
    assert (spec["labels"]["rule"], spec["labels"]["severity"]) == ("reach", "critical"), spec

    # 8. everything stops: the daemon drains and exits 0, its workers go with it
    code, killed = stop_daemon(daemon)
    assert code == 0, daemon.log_text()[-4000:]
    assert not killed, f"worker processes outlived the daemon: {killed}"
