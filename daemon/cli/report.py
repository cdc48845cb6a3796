"""``vigil report``: alerts as one self-contained HTML page for auditors, one JSON summary line."""

from __future__ import annotations

import argparse
from pathlib import Path

import orjson

from vigil.connectors.kafka import PLAINTEXT
from vigil.daemon.cli._args import out_path
from vigil.daemon.cli.replay import add_column_options
from vigil.daemon.config import load_config
from vigil.daemon.report import CsvColumns, write_report
from vigil.daemon.report.source import SCHEME

GROUP = None


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report", help="write the alerts as one self-contained HTML page for auditors"
    )
    p.add_argument(
        "alerts", help="JSON-lines alert file, or kafka://HOST:PORT/TOPIC (committed alerts)"
    )
    p.add_argument(
        "--decisions",
        type=Path,
        metavar="STREAM",
        help="the decisions the alerts came from, to show features: a CSV (read with the "
        "column options below, as vigil replay reads it) or JSON-lines decision events",
    )
    p.add_argument("--out", type=out_path, required=True, help="the HTML file to write")
    p.add_argument(
        "--config",
        type=Path,
        metavar="VIGIL_TOML",
        help="read a kafka:// source with this daemon configuration's [kafka] TLS and SASL "
        "settings",
    )
    add_column_options(p.add_argument_group("CSV columns (a CSV --decisions)"), required=False)
    p.set_defaults(handler=_report)


def _report(args: argparse.Namespace) -> int:
    columns = None
    if any(
        (args.decision_column, args.drop_columns, args.ignore_columns, args.scale, args.id_column)
    ):
        columns = CsvColumns(
            decision_columns=args.decision_column or (),
            drop_columns=args.drop_columns,
            ignore_columns=args.ignore_columns,
            scale=dict(args.scale),
            id_column=args.id_column,
        )
    if columns is not None and args.decisions is None:
        raise ValueError("the CSV column options describe --decisions, which is not given")
    security = PLAINTEXT
    if args.config is not None:
        if not args.alerts.startswith(SCHEME):
            raise ValueError("--config gives Kafka settings, and the alerts are a file")
        kafka = load_config(args.config).kafka
        if kafka is None:
            raise ValueError(f"{args.config} has no [kafka] section")
        security = kafka.security()
    summary = write_report(args.alerts, args.out, args.decisions, columns, security)
    print(orjson.dumps(summary).decode(), flush=True)
    return 0
