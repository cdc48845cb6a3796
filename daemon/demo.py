"""``vigil demo``: the full daemon pipeline on a bundled stream, with files instead of Kafka."""

from __future__ import annotations

import asyncio
import csv
import shutil
import time
from collections import Counter
from importlib.resources import files
from pathlib import Path
from typing import Any

import orjson

from vigil.daemon.config import parse_config
from vigil.daemon.logs import configure_logging
from vigil.daemon.service import run_daemon

DEMO_STREAM = "compas-stream.csv"
"""COMPAS recidivism predictions of a Certifair baseline model, in stream order."""


def bundled_stream() -> Path:
    """The demo stream shipped inside the package."""
    return Path(str(files("vigil.daemon.data") / DEMO_STREAM))


def write_decision_events(stream_csv: Path, out: Path, model: str) -> int:
    """Turn a Certifair stream CSV (prediction, label, features...) into decision events."""
    with open(stream_csv, newline="") as f, open(out, "wb") as sink:
        rows = csv.reader(f)
        next(rows)
        n = 0
        for n, row in enumerate(rows, start=1):
            event = {
                "id": n - 1,
                "model": model,
                "x": [float(v) for v in row[2:]],
                "y": int(float(row[0])),
            }
            sink.write(orjson.dumps(event) + b"\n")
    return n


OUTPUTS = {"decisions.jsonl", "alerts.jsonl", "dead-letters.jsonl", "state"}
"""What a demo writes into its working directory."""


def _claim(workdir: Path) -> None:
    """Empty ``workdir`` for a new run, unless it holds anything but a demo's outputs."""
    if workdir.exists() and not workdir.is_dir():
        raise ValueError(f"--workdir {workdir}: exists and is not a directory")
    others = (
        sorted(p.name for p in workdir.iterdir() if p.name not in OUTPUTS)
        if workdir.exists()
        else []
    )
    if others:
        raise ValueError(
            f"--workdir {workdir}: holds {', '.join(others[:3])}, which the demo did not write; "
            "choose a new or empty directory"
        )
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)


def run_demo(
    stream_csv: Path, workdir: Path, eps: float, metric: str, backend: str
) -> dict[str, Any]:
    """Run the pipeline (file source -> i.o.r. rule -> file sinks) and summarise the alerts."""
    started = time.perf_counter()
    config = parse_config(
        {
            "files": {"decisions": str(workdir / "decisions.jsonl"), "topic": "decisions"},
            "outputs": {
                "alerts_file": str(workdir / "alerts.jsonl"),
                "dead_letter_file": str(workdir / "dead-letters.jsonl"),
            },
            "state": {"dir": str(workdir / "state")},
            "metrics": {"enabled": False},
            "logging": {"level": "warning"},
            "rules": [
                {
                    "name": "compas-robustness",
                    "kind": "ior",
                    "topic": "decisions",
                    "model": "compas",
                    "metric": metric,
                    "eps": eps,
                    "backend": backend,
                }
            ],
        }
    )
    _claim(workdir)
    decisions = write_decision_events(stream_csv, workdir / "decisions.jsonl", "compas")
    configure_logging(config.logging.level, config.logging.format)
    asyncio.run(run_daemon(config, until_idle=True))
    alerts = [orjson.loads(line) for line in (workdir / "alerts.jsonl").read_bytes().splitlines()]
    dead = (workdir / "dead-letters.jsonl").read_bytes().splitlines()
    by_label = Counter(a["decision"]["y"] for a in alerts)
    print(
        f"vigil demo: {decisions} COMPAS decisions through the pipeline (files, no broker), "
        f"{metric} eps {eps}, backend {backend}"
    )
    print(
        f"  alerts: {len(alerts)} decisions with a witness set, "
        f"{sum(len(a['witnesses']) for a in alerts)} witness pairs -> {workdir / 'alerts.jsonl'}"
    )
    for label, count in sorted(by_label.items()):
        print(f"    decisions labelled {label} with a witness: {count}")
    if alerts:
        largest = max(alerts, key=lambda a: len(a["witnesses"]))
        print(
            f"    largest witness set: decision {largest['decision']['id']} "
            f"({len(largest['witnesses'])} witnesses)"
        )
    print(f"  dead letters: {len(dead)}; state snapshots in {workdir / 'state'}")
    return {
        "decisions": decisions,
        "flagged": len(alerts),
        "witness_pairs": sum(len(a["witnesses"]) for a in alerts),
        "dead_letters": len(dead),
        "seconds": round(time.perf_counter() - started, 4),
        "backend": backend,
    }
