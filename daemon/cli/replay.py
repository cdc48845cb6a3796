"""``vigil replay``: a CSV of decisions through the i.o.r. monitor, one JSON summary line."""

from __future__ import annotations

import argparse
from pathlib import Path

import orjson

from vigil.daemon.cli._args import backend, out_path, scale_pair, threshold
from vigil.daemon.replay import ReplayOptions, replay
from vigil.rules.ior import BACKENDS

GROUP = None


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("replay", help="stream a CSV of decisions through the i.o.r. monitor")
    p.add_argument("stream", type=Path, help="CSV with a header row, one decision per row")
    add_column_options(p)
    _add_monitor_options(p)
    p.set_defaults(handler=_replay)


def add_column_options(p: argparse._ActionsContainer, required: bool = True) -> None:
    """How a CSV stream's columns are read: shared with ``vigil report``, which reads the
    stream the alerts came from as the replay did (there only for a CSV, so not required)."""
    p.add_argument(
        "--decision-column",
        nargs="+",
        required=required,
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
        type=scale_pair,
        action="append",
        default=[],
        metavar="COLUMN=FACTOR",
        help="multiply a feature before distances are taken",
    )
    p.add_argument("--id-column", help="column naming each decision (default: its row number)")


def _replay(args: argparse.Namespace) -> int:
    if not args.stream.is_file():
        raise ValueError(f"{args.stream}: no such file")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.history_limit is not None and args.history_limit < 1:
        raise ValueError(f"--history-limit must be >= 1, got {args.history_limit}")
    opts = ReplayOptions(
        decision_columns=args.decision_column,
        eps=args.eps,
        metric=args.metric,
        delta=args.delta,
        output_metric=args.output_metric,
        backend=args.backend,
        batch_size=args.batch_size,
        history_limit=args.history_limit,
        drop_columns=args.drop_columns,
        ignore_columns=args.ignore_columns,
        scale=dict(args.scale),
        id_column=args.id_column,
        alerts_out=args.alerts_out,
        progress=not args.no_progress,
        embedding=args.embedding,
        quantitative=args.quantitative,
        ratio_threshold=args.ratio_threshold,
    )
    print(orjson.dumps(replay(args.stream, opts)).decode(), flush=True)
    return 0


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
        type=backend,
        default="auto",
        help=f"one of {', '.join(sorted(BACKENDS))}; parallel[:blocks[:inner[:workers]]]",
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
        type=threshold,
        metavar="T",
        help="alert only on decisions whose largest d_out / d_in exceeds T",
    )
    p.add_argument("--alerts-out", type=out_path, help="write one JSON alert per flagged decision")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
