"""``vigil demo``: the daemon pipeline on the bundled COMPAS stream, files instead of Kafka."""

from __future__ import annotations

import argparse
from pathlib import Path

import orjson

from vigil.daemon.cli._args import backend
from vigil.daemon.demo import bundled_stream, run_demo

GROUP = None


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "demo", help="run the daemon pipeline on the bundled COMPAS stream (files, no broker)"
    )
    p.add_argument("--eps", type=float, default=0.04)
    p.add_argument("--metric", choices=["linf", "l2", "l1"], default="linf")
    p.add_argument("--backend", type=backend, default="auto")
    p.add_argument(
        "--workdir",
        type=Path,
        default=Path("vigil-demo"),
        help="where the decision events, alerts and state go (emptied first)",
    )
    p.set_defaults(handler=_demo)


def _demo(args: argparse.Namespace) -> int:
    summary = run_demo(bundled_stream(), args.workdir, args.eps, args.metric, args.backend)
    print(orjson.dumps(summary).decode(), flush=True)
    return 0
