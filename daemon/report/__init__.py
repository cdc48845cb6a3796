"""``vigil report``: alerts (and the decision stream they came from) as one self-contained HTML
page for auditors, which opens without a network: inline style, script and SVG only."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from vigil.connectors.kafka import PLAINTEXT, read_committed
from vigil.connectors.kafka_security import KafkaSecurity
from vigil.daemon.report.alerts import Alert, parse_alerts, read_alert_file
from vigil.daemon.report.decisions import CsvColumns, read_decisions
from vigil.daemon.report.page import render_page
from vigil.daemon.report.source import SCHEME, parse_url

__all__ = ["CsvColumns", "load_alerts", "write_report"]


def load_alerts(source: str, security: KafkaSecurity = PLAINTEXT) -> list[Alert]:
    """The alerts of a JSON-lines file, or of ``kafka://HOST:PORT/TOPIC`` (the records
    committed when reading starts, read with ``security``)."""
    if not source.startswith(SCHEME):
        return read_alert_file(Path(source))
    servers, topic = parse_url(source)
    records = asyncio.run(read_committed(servers, topic, security))
    return parse_alerts(
        (f"{source}, partition {r.partition}, offset {r.offset}", r.value) for r in records
    )


def write_report(
    source: str,
    out: Path,
    decisions: Path | None = None,
    columns: CsvColumns | None = None,
    security: KafkaSecurity = PLAINTEXT,
) -> dict[str, Any]:
    """Read, render and write the page; return the summary the command prints."""
    alerts = load_alerts(source, security)
    stream = None
    if decisions is not None:
        wanted = {(a.model, str(i)) for a in alerts for i in (a.id, *(w.id for w in a.witnesses))}
        stream = read_decisions(decisions, wanted, columns)
    page = render_page(alerts, source, stream).encode()
    out.write_bytes(page)
    return {
        "out": str(out),
        "alerts": len(alerts),
        "decisions": None if stream is None else stream.count,
        "bytes": len(page),
    }
