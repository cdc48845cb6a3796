"""The ``vigil`` command line."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import math
import pkgutil
import sys
from importlib.resources import files
from pathlib import Path

import orjson
import vigil.daemon.commands
from vigil.connectors.csv_source import StreamFormatError
from vigil.connectors.kafka import BrokerUnavailable
from vigil.daemon.commands import out_path
from vigil.daemon.config import load_config
from vigil.daemon.demo import run_demo
from vigil.daemon.logs import configure_logging
from vigil.daemon.metrics import Metrics
from vigil.daemon.replay import ReplayOptions, replay
from vigil.daemon.service import build_rules, run_daemon
from vigil.rules.ior import BACKENDS, InvalidDecision
from vigil.rules.ior.backends import parse_backend

DEMO_STREAM = "compas-stream.csv"
"""COMPAS recidivism predictions of a Certifair baseline model, in stream order."""


def _scale_pair(text: str) -> tuple[str, float]:
    name, sep, value = text.rpartition("=")
    try:
        factor = float(value)
    except ValueError:
        factor = None
    if not sep or not name or factor is None:
        raise argparse.ArgumentTypeError(f"expected COLUMN=FACTOR, got {text!r}")
    return name, factor


def _threshold(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def _backend(text: str) -> str:
    try:
        parse_backend(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _add_monitor_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--eps",
        type=float,
        required=True,
        help="input distance bound; the ball is closed (d_in <= eps)",
    )
    p.add_argument("--metric", choices=["linf", "l2", "l1"], default="linf")
    p.add_argument(
        "--delta",
        type=float,
        default=0.0,
        help="output distance bound for probability outputs (witness iff d_out > delta)",
    )
    p.add_argument("--output-metric", choices=["linf", "l1", "tv"], default="linf")
    p.add_argument(
        "--backend",
        type=_backend,
        default="auto",
        help=f"one of {', '.join(sorted(BACKENDS))}; parallel[:blocks[:inner]]",
    )
    p.add_argument("--batch-size", type=int, default=4096, help="decisions checked together")
    p.add_argument(
        "--history-limit",
        type=int,
        metavar="N",
        help="compare with the most recent N decisions at most (bounds memory; default: all)",
    )
    p.add_argument(
        "--embedding",
        type=Path,
        metavar="MODEL.onnx",
        help="compare inputs in the space of this ONNX model (semantic robustness)",
    )
    p.add_argument(
        "--quantitative",
        action="store_true",
        help="also report each decision's largest d_out / d_in within eps",
    )
    p.add_argument(
        "--ratio-threshold",
        type=_threshold,
        metavar="T",
        help="alert only on decisions whose largest d_out / d_in exceeds T",
    )
    p.add_argument("--alerts-out", type=out_path, help="write one JSON alert per flagged decision")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vigil", description="Runtime assurance of AI models.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("replay", help="stream a CSV of decisions through the i.o.r. monitor")
    p.add_argument("stream", type=Path, help="CSV with a header row, one decision per row")
    p.add_argument(
        "--decision-column",
        nargs="+",
        required=True,
        metavar="COLUMN",
        help="the model's output: one label column, or several probability columns",
    )
    p.add_argument(
        "--drop-columns",
        nargs="*",
        default=[],
        metavar="COLUMN",
        help="columns that are not features (e.g. the ground-truth label)",
    )
    p.add_argument(
        "--ignore-columns",
        nargs="*",
        default=[],
        metavar="COLUMN",
        help="features left out of d_in (protected attributes, individual fairness)",
    )
    p.add_argument(
        "--scale",
        type=_scale_pair,
        action="append",
        default=[],
        metavar="COLUMN=FACTOR",
        help="multiply a feature before distances are taken",
    )
    p.add_argument("--id-column", help="column naming each decision (default: its row number)")
    _add_monitor_options(p)

    p = sub.add_parser(
        "demo", help="run the daemon pipeline on the bundled COMPAS stream (files, no broker)"
    )
    p.add_argument("--eps", type=float, default=0.04)
    p.add_argument("--metric", choices=["linf", "l2", "l1"], default="linf")
    p.add_argument("--backend", type=_backend, default="auto")
    p.add_argument(
        "--workdir",
        type=Path,
        default=Path("vigil-demo"),
        help="where the decision events, alerts and state go (emptied first)",
    )

    p = sub.add_parser("run", help="run the daemon")
    p.add_argument("--config", type=Path, required=True, help="TOML configuration file")

    p = sub.add_parser("check-config", help="validate a configuration file and exit")
    p.add_argument("config", type=Path)

    groups = {
        None: sub,
        "verify": sub.add_parser(
            "verify", help="verify a network (reachability, mini-batch MILP robustness)"
        ).add_subparsers(dest="subcommand", required=True),
        "certify": sub.add_parser(
            "certify", help="certify decisions (KNN fairness, counterfactual robustness)"
        ).add_subparsers(dest="subcommand", required=True),
    }
    for info in pkgutil.iter_modules(vigil.daemon.commands.__path__):
        module = importlib.import_module(f"vigil.daemon.commands.{info.name}")
        module.register(groups[module.GROUP])
    return parser


def _run_replay(
    args: argparse.Namespace,
    stream: Path,
    decision: list[str],
    drop: list[str],
    ignore: list[str],
    scale: dict[str, float],
    id_column: str | None,
) -> dict:
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.history_limit is not None and args.history_limit < 1:
        raise ValueError(f"--history-limit must be >= 1, got {args.history_limit}")
    opts = ReplayOptions(
        decision_columns=decision,
        eps=args.eps,
        metric=args.metric,
        delta=args.delta,
        output_metric=args.output_metric,
        backend=args.backend,
        batch_size=args.batch_size,
        history_limit=args.history_limit,
        drop_columns=drop,
        ignore_columns=ignore,
        scale=scale,
        id_column=id_column,
        alerts_out=args.alerts_out,
        progress=not args.no_progress,
        embedding=args.embedding,
        quantitative=args.quantitative,
        ratio_threshold=args.ratio_threshold,
    )
    return replay(stream, opts)


def _command(args: argparse.Namespace) -> str:
    """The command as typed: ``verify batch``, ``replay``, ..."""
    return " ".join(filter(None, (args.command, getattr(args, "subcommand", None))))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if hasattr(args, "handler"):
            return args.handler(args)
        if args.command == "replay":
            if not args.stream.is_file():
                raise ValueError(f"{args.stream}: no such file")
            summary = _run_replay(
                args,
                args.stream,
                args.decision_column,
                args.drop_columns,
                args.ignore_columns,
                dict(args.scale),
                args.id_column,
            )
        elif args.command == "demo":
            summary = run_demo(
                Path(str(files("vigil.daemon") / "demo" / DEMO_STREAM)),
                args.workdir,
                args.eps,
                args.metric,
                args.backend,
            )
        elif args.command == "check-config":
            config = load_config(args.config)
            for rule in build_rules(config, Metrics()):  # loads and checks the rules' models
                rule.close()
            source = "kafka" if config.kafka else "files"
            print(f"{args.config}: ok ({len(config.rules)} rules, {source} source)")
            return 0
        else:
            config = load_config(args.config)
            configure_logging(config.logging.level, config.logging.format)
            asyncio.run(run_daemon(config))
            return 0
    except (StreamFormatError, InvalidDecision, ValueError) as e:
        print(f"vigil {_command(args)}: error: {e}", file=sys.stderr)
        return 2
    except BrokerUnavailable as e:  # not the configuration's fault: a supervisor retries
        print(f"vigil {_command(args)}: error: {e}", file=sys.stderr)
        return 1
    print(orjson.dumps(summary).decode(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
