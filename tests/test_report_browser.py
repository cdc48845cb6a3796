"""The COMPAS report in a real headless Chromium (the system's, driven by playwright): it opens
offline without console errors or any request but its own file, draws the ids, shows a
selected decision beside its witnesses, filters and sorts, and renders a non-blank page.

``VIGIL_REPORT_SCREENSHOT=docs/report-compas.png`` also saves the screenshot there."""

from __future__ import annotations

import csv
import os
import shutil
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.cli_support import run_cli
from tests.test_report import COLUMNS, DEMO, ok, replay

CHROMIUM = shutil.which("chromium")
if CHROMIUM is None:
    pytest.skip("chromium not installed (apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright not installed (pip install playwright)"
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, list[dict]]:
    tmp = tmp_path_factory.mktemp("browser")
    alerts = replay(tmp)
    out = tmp / "report.html"
    ok(run_cli("report", str(alerts), "--decisions", str(DEMO), *COLUMNS, "--out", str(out)))
    return out, [orjson.loads(line) for line in alerts.read_bytes().splitlines()]


@pytest.fixture(scope="module")
def browser() -> Iterator:
    with sync_api.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM)
        yield launched
        launched.close()


class Opened:
    """A page opened from ``path`` with every console error, page error, dialog and request
    recorded; requests other than the file itself are aborted."""

    def __init__(self, browser, path: Path) -> None:
        self.url = path.as_uri()
        self.context = browser.new_context(viewport={"width": 1300, "height": 900})
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page = self.context.new_page()
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("dialog", lambda d: (self.errors.append(f"dialog: {d.message}"), d.dismiss()))
        self.context.route("**/*", self._route)
        self.page.goto(self.url)
        self.page.wait_for_selector("body[data-ready='1']", state="attached")

    def _route(self, route) -> None:
        self.requests.append(route.request.url)
        if route.request.url == self.url:
            route.continue_()
        else:
            route.abort()

    def visible_ids(self) -> list[str]:
        return self.page.eval_on_selector_all(
            "#rows tr", "rows => rows.filter(r => r.offsetParent).map(r => r.cells[0].innerText)"
        )

    def info(self) -> str:
        return self.page.inner_text("#page-info")


@pytest.fixture
def opened(browser, report) -> Iterator[Opened]:
    page = Opened(browser, report[0])
    yield page
    page.context.close()


def test_opens_offline_without_errors_and_draws_every_id(opened, report):
    _, alerts = report
    assert opened.errors == []
    assert opened.requests == [opened.url]
    ids = [str(a["decision"]["id"]) for a in alerts]
    assert opened.visible_ids() == ids[:100]
    assert opened.info() == "page 1 of 8 \u00b7 732 of 732 flagged decisions"
    drawn = opened.page.eval_on_selector_all(
        "#rows tr",
        "rows => rows.map(r => [r.cells[0].textContent,"
        " Array.from(r.querySelectorAll('li'), li => li.textContent)])",
    )
    assert drawn == [
        [str(a["decision"]["id"]), [str(w["id"]) for w in a["witnesses"]]] for a in alerts
    ]
    opened.page.click("#next")
    assert opened.visible_ids() == ids[100:200]
    assert opened.errors == [] and opened.requests == [opened.url]


def _stream() -> tuple[list[str], dict[int, list[str]]]:
    with open(DEMO, newline="") as f:
        rows = csv.reader(f)
        header = next(rows)
        return header[2:], {n: row[2:] for n, row in enumerate(rows)}


def test_a_selected_decision_stands_beside_its_witnesses(opened, report):
    _, alerts = report
    alert = next(a for a in alerts if len(a["witnesses"]) >= 3)
    decision = alert["decision"]["id"]
    opened.page.click(f"#rows tr.on:has(td:first-child:text-is('{decision}'))")
    opened.page.wait_for_selector("#side")
    table = opened.page.eval_on_selector(
        "#side",
        "t => Array.from(t.rows, r => Array.from(r.cells, c => [c.textContent, c.className]))",
    )
    head, _, output, distance, differing, *features = table
    witnesses = alert["witnesses"]
    assert [c[0] for c in head] == [
        "feature",
        f"decision {decision}",
        *(f"witness {w['id']}" for w in witnesses),
    ]
    assert [c[0] for c in output[2:]] == [str(w["y"]) for w in witnesses]
    assert [float(c[0]) for c in distance[2:]] == [w["distance"] for w in witnesses]
    names, values = _stream()
    assert [row[0][0] for row in features] == names
    x = values[decision]
    for f, row in enumerate(features):
        assert float(row[1][0]) == float(x[f])
        for k, w in enumerate(witnesses):
            value, difference = row[2 + 2 * k], row[3 + 2 * k]
            wx = values[w["id"]]
            assert float(value[0]) == float(wx[f])
            assert float(difference[0]) == pytest.approx(float(wx[f]) - float(x[f]), abs=1e-9)
            differs = float(wx[f]) != float(x[f])
            assert ("diff" in value[1]) == ("diff" in difference[1]) == differs
    counts = [
        sum(float(values[w["id"]][f]) != float(x[f]) for f in range(len(names))) for w in witnesses
    ]
    assert [int(c[0]) for c in differing[2:]] == counts
    assert opened.errors == []


def test_filters_and_sorting(opened, report):
    _, alerts = report
    page = opened.page
    page.fill("#f-id", "77")
    page.wait_for_function("() => /of 732/.test(document.getElementById('page-info').textContent)")
    page.wait_for_function(
        "n => document.querySelectorAll('#rows tr.on').length === n",
        arg=sum("77" in str(a["decision"]["id"]) for a in alerts),
    )
    assert all("77" in i for i in opened.visible_ids())
    page.click("#f-clear")
    page.fill("#f-wid", "12")
    expected = [
        str(a["decision"]["id"]) for a in alerts if any(w["id"] == 12 for w in a["witnesses"])
    ]
    page.wait_for_function(
        "n => document.getElementById('page-info').textContent.includes(` ${n} of 732`)",
        arg=len(expected),
    )
    assert opened.visible_ids() == expected[:100]
    page.click("#f-clear")
    page.select_option("#f-y", "1")
    page.fill("#f-min", "10")
    expected = [
        str(a["decision"]["id"])
        for a in alerts
        if a["decision"]["y"] == 1 and len(a["witnesses"]) >= 10
    ]
    page.wait_for_function(
        "n => document.getElementById('page-info').textContent.includes(` ${n} of 732`)",
        arg=len(expected),
    )
    assert opened.visible_ids() == expected[:100]
    page.click("#f-clear")
    page.click("#alerts th[data-k=n] button")
    page.click("#alerts th[data-k=n] button")
    assert page.get_attribute("#alerts th[data-k=n]", "aria-sort") == "descending"
    counts = page.eval_on_selector_all(
        "#rows tr.on", "rows => rows.map(r => +r.cells[2].innerText)"
    )
    assert counts == sorted((len(a["witnesses"]) for a in alerts), reverse=True)[:100]
    page.click("#f-order")
    assert opened.visible_ids() == [str(a["decision"]["id"]) for a in alerts[:100]]
    assert opened.errors == []


def distinct_colours(png: bytes) -> int:
    """How many distinct pixel values an 8-bit RGB(A), non-interlaced PNG holds."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, []
    while pos < len(png):
        length, kind = struct.unpack(">I4s", png[pos : pos + 8])
        body = png[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
    assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(b"".join(idat))
    stride = width * bpp
    prev = bytearray(stride)
    colours = set()
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for i in range(stride) if kind else ():
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + ((a + b) >> 1)) & 255
            else:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        colours.update(bytes(line[k : k + bpp]) for k in range(0, stride, bpp))
        prev = line
    return len(colours)


def test_the_rendered_page_is_not_blank(opened, browser):
    opened.page.click("#rows tr.on >> nth=0")
    opened.page.wait_for_selector("#side")
    shot = opened.page.screenshot(full_page=True)
    blank = browser.new_page(viewport={"width": 1300, "height": 900})
    try:
        assert distinct_colours(blank.screenshot()) == 1
    finally:
        blank.close()
    assert distinct_colours(shot) > 50
    saved = os.environ.get("VIGIL_REPORT_SCREENSHOT")
    if saved:
        (REPO / saved).write_bytes(shot)


def test_hostile_text_is_shown_as_text(browser, tmp_path):
    hostile = "<img src=x onerror=alert(1)>"
    stream = tmp_path / "hostile.csv"
    stream.write_text(f'id,"{hostile}",y\n"<b>a</b>",0.5,0\n"</script>",0.5,1\n')
    columns = ("--decision-column", "y", "--id-column", "id")
    alerts = replay(tmp_path, "--eps", "1", stream=stream, columns=columns)
    out = tmp_path / "hostile.html"
    ok(run_cli("report", str(alerts), "--decisions", str(stream), *columns, "--out", str(out)))
    opened = Opened(browser, out)
    try:
        assert opened.visible_ids() == ["</script>"]
        opened.page.click("#rows tr.on")
        opened.page.wait_for_selector("#side")
        cells = opened.page.eval_on_selector_all("#side th", "c => c.map(x => x.textContent)")
        assert hostile in cells and "witness <b>a</b>" in cells
        assert opened.page.query_selector("img") is None and opened.page.query_selector("b") is None
        assert opened.errors == [] and opened.requests == [opened.url]
    finally:
        opened.context.close()
