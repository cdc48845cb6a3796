"""`vigil report`: the page drawn from a real replay of the bundled COMPAS stream (every id in
its row, counts, features, nothing fetched, hostile text escaped), the Kafka reader against
the real broker (committed alerts only), and one-line errors naming file and line."""

from __future__ import annotations

import asyncio
import csv
import json
import re
import subprocess
import time
import uuid
from html.parser import HTMLParser
from pathlib import Path
from typing import NamedTuple

import orjson
import pytest

from tests.cli_support import cli_error, run_cli
from tests.conftest import load_stream
from tests.daemon_harness import create_topic
from vigil.connectors.kafka import read_committed
from vigil.daemon.cli import main
from vigil.daemon.demo import bundled_stream, write_decision_events

DEMO = bundled_stream()
COLUMNS = ("--decision-column", "prediction", "--drop-columns", "label")


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, result.stderr
    return result


class Page(HTMLParser):
    """What a page draws: its text outside <script> and <style>, the cells of its tables by
    table id (each cell a list of text chunks; an <li> starts a chunk), and every attribute."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.texts: list[str] = []
        self.tables: dict[str, dict[str, list]] = {}
        self.attributes: list[tuple[str, str, str]] = []
        self.scripts: list[tuple[dict, str]] = []
        self._skip: str | None = None
        self._script: dict | None = None
        self._table: str | None = None
        self._cell: list[str] | None = None
        self._row: list[list[str]] | None = None
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.attributes += [(tag, k, v or "") for k, v in attrs]
        if tag in ("script", "style"):
            self._skip = tag
            if tag == "script":
                self._script = dict(attrs)
        elif tag == "table":
            self._table = dict(attrs).get("id", "")
            self.tables[self._table] = {"head": [], "rows": []}
        elif tag == "tr" and self._table is not None:
            self._row = []
            self.tables[self._table]["rows"].append(self._row)
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []
            self._row.append(self._cell)
        elif tag == "li" and self._cell is not None:
            self._cell.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == self._skip:
            self._skip = None
        elif tag == "table":
            self._table = self._row = self._cell = None

    def handle_data(self, data: str) -> None:
        if self._skip == "script":
            self.scripts.append((self._script or {}, data))
            return
        if self._skip or not data.strip():
            return
        self.texts.append(data)
        if self._cell is not None:
            if self._cell:
                self._cell[-1] += data
            else:
                self._cell.append(data)

    def table(self, name: str) -> tuple[list[str], list[list[list[str]]]]:
        """(column headings, data rows) of the table with this id."""
        head, *rows = self.tables[name]["rows"]
        return ["".join(c) for c in head], rows

    def data(self) -> dict:
        (block,) = [text for attrs, text in self.scripts if attrs.get("id") == "data"]
        return json.loads(block)


def read_alerts(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def replay(tmp: Path, *extra: str, stream: Path = DEMO, columns=COLUMNS) -> Path:
    alerts = tmp / f"alerts-{uuid.uuid4().hex[:6]}.jsonl"
    ok(run_cli("replay", str(stream), *columns, "--eps", "0.04", "--no-progress",
               "--alerts-out", str(alerts), *extra))  # fmt: skip
    return alerts


class Compas(NamedTuple):
    alerts: list[dict]
    alerts_path: Path
    page: Page
    summary: dict
    out: Path


@pytest.fixture(scope="module")
def compas(tmp_path_factory) -> Compas:
    """A replay's alerts, the report of them with the CSV, its summary line and its path."""
    tmp = tmp_path_factory.mktemp("report")
    alerts = replay(tmp)
    out = tmp / "report.html"
    done = ok(run_cli("report", str(alerts), "--decisions", str(DEMO), *COLUMNS, "--out", str(out)))
    (line,) = done.stdout.splitlines()
    return Compas(read_alerts(alerts), alerts, Page(out.read_text()), json.loads(line), out)


def test_every_flagged_and_witness_id_is_drawn_in_its_row(compas):
    alerts, page = compas.alerts, compas.page
    head, rows = page.table("alerts")
    assert head[:4] == ["decision", "output", "witnesses", "nearest d_in"]
    assert head[-1] == "witness ids"
    drawn = {}
    for cells in rows:
        decision, output, count, *_, witness_ids = cells
        drawn[decision[0]] = (output[0], int(count[0]), witness_ids)
    expected = {
        str(a["decision"]["id"]): (
            str(a["decision"]["y"]),
            len(a["witnesses"]),
            [str(w["id"]) for w in a["witnesses"]],
        )
        for a in alerts
    }
    assert len(rows) == len(alerts) == 732
    assert drawn == expected
    texts = set(page.texts)  # drawn text only: the data block is not among it
    assert {str(a["decision"]["id"]) for a in alerts} <= texts
    assert {str(w["id"]) for a in alerts for w in a["witnesses"]} <= texts


def test_summary_counts_equal_the_alert_file_and_the_stream(compas):
    alerts, page, summary, out = compas.alerts, compas.page, compas.summary, compas.out
    head, rows = page.table("summary")
    (row,) = [{h: "".join(c) for h, c in zip(head, cells, strict=True)} for cells in rows]
    with open(DEMO, newline="") as f:
        decisions = sum(1 for _ in csv.reader(f)) - 1
    pairs = sum(len(a["witnesses"]) for a in alerts)
    assert row["rule"] == "replay" and row["model"] == DEMO.stem
    assert (row["metric"], row["eps"]) == ("linf", "0.04")
    assert int(row["decisions"]) == decisions == 5278
    assert int(row["flagged decisions"]) == len(alerts)
    assert int(row["witness pairs"]) == pairs
    assert row["flagged share"] == f"{100 * len(alerts) / decisions:.2f}%"
    assert summary == {
        "out": str(out),
        "alerts": len(alerts),
        "decisions": decisions,
        "bytes": out.stat().st_size,
    }


def test_the_data_block_holds_each_decision_and_witness_with_its_features(compas):
    alerts, page = compas.alerts, compas.page
    x, _ = load_stream(DEMO)
    data = page.data()
    (group,) = data["groups"]
    with open(DEMO, newline="") as f:
        assert group["features"] == next(csv.reader(f))[2:]
    assert len(data["alerts"]) == len(alerts)
    for row, alert in zip(data["alerts"], alerts, strict=True):
        _, ref, y, flat, count, *_ = row
        assert data["ids"][ref] == alert["decision"]["id"] and y == str(alert["decision"]["y"])
        assert data["x"][ref] == x[alert["decision"]["id"]].tolist()
        listed = [flat[k : k + 3] for k in range(0, len(flat), 3)]
        assert count == len(listed) == len(alert["witnesses"])
        for (wref, wy, distance), w in zip(listed, alert["witnesses"], strict=True):
            assert (data["ids"][wref], wy, distance) == (w["id"], str(w["y"]), w["distance"])
            assert data["x"][wref] == x[w["id"]].tolist()


def test_the_page_fetches_nothing(compas):
    page, text = compas.page, compas.out.read_text()
    assert "http://" not in text and "https://" not in text
    linked = [
        (tag, name, value)
        for tag, name, value in page.attributes
        if name in ("src", "href", "xlink:href", "action", "srcset", "poster", "data")
    ]
    assert linked == []
    assert not re.search(r"url\(|@import", text)
    policy = [v for tag, k, v in page.attributes if tag == "meta" and k == "content"]
    assert any(p.startswith("default-src 'none';") for p in policy)
    assert [a.get("type") for a, _ in page.scripts] == ["application/json", None]


def test_hostile_feature_names_and_ids_are_escaped(tmp_path):
    hostile = "<img src=x onerror=alert(1)>"
    closing = "</script><script>alert(2)</script>"
    ids = ['<b id="x">&amp;', "a'b\"c", "</style><svg onload=alert(3)>", "plain"]
    stream = tmp_path / "hostile.csv"
    with open(stream, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", hostile, closing, "y"])
        for n, ident in enumerate(ids):
            w.writerow([ident, 0.5, 0.25 * (n % 2), n % 2])
    columns = ("--decision-column", "y", "--id-column", "id")
    alerts = replay(tmp_path, "--eps", "1", stream=stream, columns=columns)
    out = tmp_path / "hostile.html"
    ok(run_cli("report", str(alerts), "--decisions", str(stream), *columns, "--out", str(out)))
    text = out.read_text()
    for raw in (hostile, closing, *ids[:3]):
        assert raw not in text
    assert text.count("</script>") == 2 and text.count("<script") == 2
    assert text.count("</style>") == 1
    page = Page(text)
    assert {ids[1], ids[2], ids[3]} <= set(page.texts)  # ids[0] is the first decision: no witness
    assert f"Features: {hostile}, {closing}" in page.texts
    (group,) = page.data()["groups"]
    assert group["features"] == [hostile, closing]
    assert set(page.data()["ids"]) == set(ids)


def test_without_decisions_the_page_shows_ids_outputs_and_distances(compas, tmp_path):
    alerts = compas.alerts
    out = tmp_path / "bare.html"
    done = ok(run_cli("report", str(compas.alerts_path), "--out", str(out)))
    assert json.loads(done.stdout)["decisions"] is None
    page = Page(out.read_text())
    head, rows = page.table("summary")
    assert dict(zip(head, ["".join(c) for c in rows[0]], strict=True))["decisions"] == "\u2014"
    _, rows = page.table("alerts")
    assert [r[0][0] for r in rows] == [str(a["decision"]["id"]) for a in alerts]
    nearest = [float(r[3][0]) for r in rows]
    expected = [min(w["distance"] for w in a["witnesses"]) for a in alerts]
    assert nearest == pytest.approx(expected, rel=1e-5)
    assert page.data()["x"] is None and page.data()["groups"][0]["features"] is None


def test_quantitative_alerts_show_their_ratio(tmp_path):
    path = replay(tmp_path, "--quantitative")
    alerts = read_alerts(path)
    out = tmp_path / "q.html"
    ok(run_cli("report", str(path), "--decisions", str(DEMO), *COLUMNS, "--out", str(out)))
    page = Page(out.read_text())
    head, rows = page.table("alerts")
    assert "d_out / d_in" in head
    column = head.index("d_out / d_in")
    ratios = [a["lipschitz"]["ratio"] for a in alerts]
    assert [float(r[column][0]) for r in rows] == pytest.approx(ratios, rel=1e-5)
    head, rows = page.table("summary")
    row = dict(zip(head, ["".join(c) for c in rows[0]], strict=True))
    assert float(row["largest d_out / d_in"]) == max(ratios)
    assert [a[5] for a in page.data()["alerts"]] == [
        [a["lipschitz"]["ratio"], a["lipschitz"]["witness"]] for a in alerts
    ]


def test_decision_events_give_the_same_features(compas, tmp_path):
    events = tmp_path / "decisions.jsonl"
    assert write_decision_events(DEMO, events, DEMO.stem) == 5278
    out = tmp_path / "events.html"
    done = ok(
        run_cli("report", str(compas.alerts_path), "--decisions", str(events), "--out", str(out))
    )
    assert json.loads(done.stdout)["decisions"] == 5278
    data = Page(out.read_text()).data()
    x, _ = load_stream(DEMO)
    assert data["groups"][0]["features"] == [f"x[{i}]" for i in range(x.shape[1])]
    assert all(data["x"][r] == x[i].tolist() for r, i in enumerate(data["ids"]))


# -- errors ----------------------------------------------------------------------------------------


def _alert(ident: int = 1) -> bytes:
    return orjson.dumps(
        {
            "kind": "alert", "schema_version": 1, "rule": "r", "model": "m",
            "decision": {"id": ident, "y": 1}, "witnesses": [{"id": 0, "y": 0, "distance": 0.01}],
            "metric": "linf", "eps": 0.04, "source": {"row": ident},
            "detected_at": "2026-01-01T00:00:00.000Z", "history_complete": True,
        }
    )  # fmt: skip


@pytest.mark.parametrize(
    ("lines", "said"),
    [
        ([_alert(1), _alert(2), b"{not json"], "line 3: not JSON"),
        ([_alert(1), _alert(2).replace(b'"id":2,', b""), _alert(3)], "line 2: an alert without"),
        ([b'{"kind": "decision", "id": 1}'], "line 1: not an alert (kind 'decision')"),
        (
            [_alert(1).replace(b'"distance":0.01', b'"distance":-1')],
            "line 1: witnesses[0].distance",
        ),
    ],
)
def test_a_bad_alert_line_is_named_with_its_file(tmp_path, capsys, lines, said):
    path = tmp_path / "alerts.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    out = tmp_path / "r.html"
    code, err = cli_error(capsys, ["report", str(path), "--out", str(out)])
    assert code == 2
    assert err == f"vigil report: error: {path}, {said}" + err.split(said, 1)[1]
    assert err.count("\n") == 1 and not out.exists()


def test_a_bad_decision_line_is_named_with_its_file(tmp_path, capsys):
    alerts = tmp_path / "alerts.jsonl"
    alerts.write_bytes(_alert(1) + b"\n")
    events = tmp_path / "decisions.jsonl"
    events.write_bytes(b'{"id": 0, "model": "m", "x": [1], "y": 0}\n{"id": 1, "model": "m"}\n')
    code, err = cli_error(capsys, ["report", str(alerts), "--decisions", str(events), "--out",
                                str(tmp_path / "r.html")])  # fmt: skip
    assert code == 2 and f"{events}, line 2: missing field(s): y, x (or features)" in err
    stream = tmp_path / "stream.csv"
    stream.write_text("prediction,label,a\n1,0,0.5\n0,1,oops\n")
    code, err = cli_error(capsys, ["report", str(alerts), "--decisions", str(stream), *COLUMNS,
                                "--out", str(tmp_path / "r.html")])  # fmt: skip
    assert code == 2 and f"{stream}, line 3, column 'a': 'oops' is not a number" in err


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--decisions", str(DEMO)], "is a CSV: name its output with --decision-column"),
        (["--drop-columns", "label"], "describe --decisions, which is not given"),
        (["--decisions", str(DEMO), *COLUMNS, "--ignore-columns", "nope"], "not feature columns"),
    ],
)
def test_column_options_must_fit_the_stream(tmp_path, capsys, args, said):
    alerts = tmp_path / "alerts.jsonl"
    alerts.write_bytes(_alert(1) + b"\n")
    code, err = cli_error(capsys, ["report", str(alerts), *args, "--out", str(tmp_path / "r.html")])
    assert code == 2 and said in err and err.count("\n") == 1


def test_a_missing_file_and_an_unreachable_broker(tmp_path, capsys):
    out = str(tmp_path / "r.html")
    code, err = cli_error(capsys, ["report", str(tmp_path / "none.jsonl"), "--out", out])
    assert code == 2 and "none.jsonl: no such file" in err
    code, err = cli_error(capsys, ["report", "kafka://127.0.0.1:1/alerts", "--out", out])
    assert code == 1 and "cannot reach the Kafka broker at 127.0.0.1:1: 127.0.0.1:1:" in err
    assert err.count("\n") == 1
    code, err = cli_error(capsys, ["report", "kafka://127.0.0.1:1", "--out", out])
    assert code == 2 and "expected kafka://HOST:PORT/TOPIC" in err


# -- Kafka -----------------------------------------------------------------------------------------


async def _produce(bootstrap: str, topic: str) -> None:
    """Alerts 0-2 committed, 10-11 aborted, 3-4 committed; then 20 left in an open
    transaction while the report reads (aborted after it)."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"t-{topic}")
    await producer.start()
    try:
        for ids, commit in (((0, 1, 2), True), ((10, 11), False), ((3, 4), True)):
            await producer.begin_transaction()
            for i in ids:
                await producer.send_and_wait(topic, _alert(i), partition=i % 2)
            await (producer.commit_transaction() if commit else producer.abort_transaction())
    finally:
        await producer.stop()


async def _topics(bootstrap: str) -> set[str]:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        return await consumer.topics()
    finally:
        await consumer.stop()


def test_kafka_reader_returns_exactly_the_committed_alerts(kafka_bootstrap, tmp_path, capsys):
    from aiokafka import AIOKafkaProducer

    topic = f"vigil.report.{uuid.uuid4().hex[:8]}"
    asyncio.run(create_topic(kafka_bootstrap, topic, 2))
    asyncio.run(_produce(kafka_bootstrap, topic))
    # a commit returns before the coordinator writes its markers, and the last stable
    # offset (what read_committed reads up to) moves only then: wait for that
    deadline = time.monotonic() + 30
    while len(asyncio.run(read_committed(kafka_bootstrap, topic))) < 5:
        assert time.monotonic() < deadline, "the committed transactions' markers never landed"
        time.sleep(0.2)

    async def with_open_transaction() -> tuple[list, list]:
        producer = AIOKafkaProducer(
            bootstrap_servers=kafka_bootstrap, transactional_id=f"o-{topic}"
        )
        await producer.start()
        try:
            await producer.begin_transaction()
            await producer.send_and_wait(topic, _alert(20), partition=0)
            records = await read_committed(kafka_bootstrap, topic)
            await producer.abort_transaction()
        finally:
            await producer.stop()
        return records, await read_committed(kafka_bootstrap, topic)

    during, after = asyncio.run(with_open_transaction())
    for records in (during, after):
        got = [(r.partition, orjson.loads(r.value)["decision"]["id"]) for r in records]
        assert got == [(0, 0), (0, 2), (0, 4), (1, 1), (1, 3)]

    out = tmp_path / "kafka.html"
    assert main(["report", f"kafka://{kafka_bootstrap}/{topic}", "--out", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["alerts"] == 5
    _, rows = Page(out.read_text()).table("alerts")
    assert sorted(r[0][0] for r in rows) == ["0", "1", "2", "3", "4"]


def test_kafka_reader_refuses_a_missing_topic_without_creating_it(
    kafka_bootstrap, tmp_path, capsys
):
    topic = f"vigil.report.none.{uuid.uuid4().hex[:8]}"
    out = str(tmp_path / "r.html")
    code, err = cli_error(capsys, ["report", f"kafka://{kafka_bootstrap}/{topic}", "--out", out])
    assert code == 2 and f"{topic}: no such topic" in err
    assert topic not in asyncio.run(_topics(kafka_bootstrap))
