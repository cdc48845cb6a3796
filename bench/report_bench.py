"""`vigil report` at scale: 100,000 synthetic alerts (valid against connectors/schemas/alert.json)
over a synthetic decision stream CSV. Times the command end to end (median over repeats),
reports the page's size, then, if chromium and playwright are installed, how long the page
takes to open (until its script has drawn the first page of rows) and to answer a selection,
a sort and a filter.

    python bench/report_bench.py [--alerts 100000] [--decisions 250000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson

REPO = Path(__file__).resolve().parents[1]
VIGIL = Path(sys.executable).with_name("vigil")


def write_inputs(where: Path, alerts: int, decisions: int, dim: int, seed: int = 0) -> Path:
    """The decision stream (``stream.csv``: prediction, label, features) and ``alerts.jsonl``:
    ``alerts`` distinct flagged decisions, each with 1-40 earlier witnesses (geometric, mean
    about 3) of the other label, within eps 0.04 in L-inf."""
    rng = np.random.default_rng(seed)
    x = np.round(rng.random((decisions, dim)), 4)
    y = rng.integers(0, 2, decisions)
    header = "prediction,label," + ",".join(f"f{i}" for i in range(dim))
    table = np.column_stack([y, 1 - y, x])
    np.savetxt(where / "stream.csv", table, delimiter=",", header=header, comments="", fmt="%.4g")
    flagged = np.sort(rng.choice(np.arange(50, decisions), size=alerts, replace=False))
    counts = np.minimum(rng.geometric(0.33, size=alerts), 40)
    stamp = "2026-01-01T00:00:00.000Z"
    with open(where / "alerts.jsonl", "wb") as out:
        for d, k in zip(flagged.tolist(), counts.tolist(), strict=True):
            witnesses = np.sort(rng.choice(d, size=min(k, d), replace=False)).tolist()
            alert = {
                "kind": "alert",
                "schema_version": 1,
                "rule": "replay",
                "model": "stream",
                "decision": {"id": d, "y": int(y[d])},
                "witnesses": [
                    {"id": w, "y": 1 - int(y[d]), "distance": round(float(rng.random()) * 0.04, 6)}
                    for w in witnesses
                ],
                "metric": "linf",
                "eps": 0.04,
                "source": {"file": "stream.csv", "row": d},
                "detected_at": stamp,
                "history_complete": True,
            }
            out.write(orjson.dumps(alert) + b"\n")
    _validate_sample(where / "alerts.jsonl")
    return where


def _validate_sample(path: Path, n: int = 200) -> None:
    try:
        import jsonschema
    except ImportError:
        return
    schema = json.loads((REPO / "connectors/schemas/alert.json").read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    with open(path, "rb") as f:
        for _, line in zip(range(n), f, strict=False):
            validator.validate(orjson.loads(line))


def time_report(where: Path, repeats: int) -> tuple[list[float], dict]:
    command = [
        str(VIGIL), "report", str(where / "alerts.jsonl"),
        "--decisions", str(where / "stream.csv"),
        "--decision-column", "prediction", "--drop-columns", "label",
        "--out", str(where / "report.html"),
    ]  # fmt: skip
    seconds, summary = [], {}
    for _ in range(repeats):
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        seconds.append(time.perf_counter() - started)
        summary = json.loads(done.stdout)
    print("command:", " ".join(command[1:]).replace(str(where), "DIR"))
    return seconds, summary


def time_browser(page_path: Path) -> dict[str, float] | None:
    """Seconds to open the page (navigation start until the script marks it ready), to
    show a selected decision, to sort by witness count and to filter by a decision id."""
    chromium = shutil.which("chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if chromium is None:
        return None
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium)
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        started = time.perf_counter()
        page.goto(page_path.as_uri(), timeout=300_000)
        page.wait_for_selector("body[data-ready='1']", state="attached", timeout=300_000)
        opened = time.perf_counter() - started

        def timed(action, ready) -> float:
            t = time.perf_counter()
            action()
            page.wait_for_function(ready, timeout=300_000)
            return time.perf_counter() - t

        select = timed(
            lambda: page.click("#rows tr.on >> nth=0"), "() => !!document.querySelector('#side')"
        )
        sort = timed(
            lambda: page.click("#alerts th[data-k=n] button"),
            "() => document.querySelector('#alerts th[data-k=n]').hasAttribute('aria-sort')",
        )
        wanted = page.eval_on_selector("#rows tr.on td", "td => td.textContent")
        all_rows = page.inner_text("#page-info").split(" \u00b7 ")[1]  # "N of N flagged ..."
        filter_ = timed(
            lambda: page.fill("#f-id", wanted),
            f"() => !document.getElementById('page-info').textContent.endsWith({all_rows!r})",
        )
        browser.close()
    return {"open": opened, "select": select, "sort": sort, "filter": filter_}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--alerts", type=int, default=100_000)
    p.add_argument("--decisions", type=int, default=250_000)
    p.add_argument("--features", type=int, default=12)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        where = write_inputs(Path(tmp), args.alerts, args.decisions, args.features)
        with open(where / "alerts.jsonl", "rb") as f:
            pairs = sum(len(orjson.loads(line)["witnesses"]) for line in f)
        print(
            f"{args.alerts} alerts ({pairs} witness pairs) over {args.decisions} decisions x "
            f"{args.features} features; alerts.jsonl "
            f"{(where / 'alerts.jsonl').stat().st_size / 1e6:.1f} MB"
        )
        seconds, summary = time_report(where, args.repeats)
        print(
            f"vigil report: median {statistics.median(seconds):.2f} s over {args.repeats} runs "
            f"({', '.join(f'{s:.2f}' for s in seconds)}); page {summary['bytes'] / 1e6:.1f} MB "
            f"({summary['bytes']} bytes)"
        )
        bare = subprocess.run(
            [str(VIGIL), "report", str(where / "alerts.jsonl"), "--out", str(where / "bare.html")],
            capture_output=True,
            text=True,
            check=True,
        )
        print(f"without --decisions (no features): page {json.loads(bare.stdout)['bytes']} bytes")
        browser = time_browser(where / "report.html")
        if browser is None:
            print("chromium: skipped (needs /usr/bin/chromium and the playwright package)")
        else:
            print(
                "chromium: open {open:.2f} s, select a decision {select:.2f} s, sort by witnesses "
                "{sort:.2f} s, filter by id {filter:.2f} s".format(**browser)
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
