"""``vigil-vnnlib``: the solver command line of the VNN-LIB standard (chapter 5), so tools
that drive VNN-LIB solvers can drive Vigil.

    vigil-vnnlib --name | --version
    vigil-vnnlib verify QUERY --network NAME=MODEL.onnx [--timeout SECONDS]
    vigil-vnnlib supports --onnx-operators | --vnnlib-versions | ...

``verify`` prints the result (``sat``, ``unsat``, ``unknown`` or ``timed-out``) as the first
line of its output; after ``sat``, every declared variable in declaration order as a line
``NAME TYPE [DIMS]`` and its values one per line, row-major. The standard fixes no exit
codes: this command exits 0 with a result, 2 when the query, the network or the command line
cannot be used (the reason on stderr), 1 on an internal error.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import NoReturn

import numpy as np
import onnx

from vigil import __version__
from vigil.daemon.cli import exit_now
from vigil.daemon.cli.verify_vnnlib import solve
from vigil.rules.graph import CONVERTERS
from vigil.rules.graph.folding import FOLDED
from vigil.rules.graph.merge import merge
from vigil.rules.graph.precision import PRECISIONS
from vigil.rules.reach.complete import Verdict
from vigil.rules.reach.query import Query
from vigil.rules.reach.vnnlib import read_query

NAME = "Vigil (runtime assurance of AI models): complete branch and bound on ReLU networks"
RESULTS = {"sat": "sat", "unsat": "unsat", "unknown": "unknown", "timeout": "timed-out"}
CAPABILITIES = {
    "onnx-opset-versions": ["9", "21"],
    # real, or a floating-point type whose rounding the bounds enclose (docs/vnnlib.md)
    "onnx-element-types": ["real", *PRECISIONS],
    "onnx-operators": sorted(set(CONVERTERS) | FOLDED),
    "vnnlib-versions": ["1.0", "2.0"],
    "hidden-node-theories": ["NH", "H"],
    "multiple-input-output-theories": ["SIO", "MIO"],
    "multiple-network-theories": ["SNET", "MNET", "MENET", "MINET"],
    "multiple-node-comparison-theories": ["SNC", "MNC"],
    "arithmetic-complexity-theories": ["BND", "OUTC", "LIN"],
    "optimised-disjunctive-reasoning": ["true"],
    "serialise-assignments": ["false"],
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vigil-vnnlib", description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", action="store_true", help="print the solver's name")
    parser.add_argument("--version", action="store_true", help="print the solver's version")
    sub = parser.add_subparsers(dest="command")
    v = sub.add_parser("verify", help="decide a query")
    v.add_argument("query", type=Path, help="VNN-LIB query (.vnnlib or .vnnlib.gz)")
    v.add_argument(
        "--network",
        action="append",
        default=[],
        metavar="NAME=MODEL.onnx",
        help="the ONNX file of a network the query declares",
    )
    v.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds (default 300); a real number, as solver drivers pass it",
    )
    s = sub.add_parser("supports", help="what this solver handles")
    which = s.add_mutually_exclusive_group(required=True)
    for capability in CAPABILITIES:
        which.add_argument(f"--{capability}", action="store_true")
    return parser


def console() -> NoReturn:
    """The ``vigil-vnnlib`` executable: ``main``, its output flushed, then its exit code
    (``exit_now``: one query of a driver's loop each)."""
    exit_now(main())


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.name:
        print(NAME)
        return 0
    if args.version:
        print(__version__)
        return 0
    if args.command == "supports":
        for capability, answer in CAPABILITIES.items():
            if getattr(args, capability.replace("-", "_")):
                print("\n".join(answer))
        return 0
    if args.command != "verify":
        build_parser().print_usage(sys.stderr)
        return 2
    started = time.monotonic()
    try:
        query = read_query(args.query)
        model = _network(query, args.network)
        verdict = solve(model, query, args.timeout, started)
    except ValueError as e:
        print(f"vigil-vnnlib verify: error: {e}", file=sys.stderr)
        return 2
    print(RESULTS[verdict.result])
    if verdict.reason:  # why no verdict: for the log, not the driver
        print(f"vigil-vnnlib verify: {verdict.result}: {verdict.reason}", file=sys.stderr)
    if verdict.result == "sat":
        print(assignment(query, verdict), end="")
    return 0


def _network(query: Query, given: list[str]) -> Path | bytes:
    """The ONNX file of the query's network, or for several networks one model merging
    them (``rules/graph/merge.py``); a network ``equal-to`` another needs no file."""
    declared = [name for name, _ in query.networks] or [query.network or "network"]
    sources = {name: equal for name, equal in query.networks if equal}
    needed = [name for name in declared if name not in sources]
    files: dict[str, Path] = {}
    for text in given:
        name, sep, path = text.rpartition("=")
        if not sep and len(needed) == 1:
            name = needed[0]
        if name not in needed:
            raise ValueError(
                f"--network names {name!r}, the query declares {', '.join(map(repr, needed))}"
            )
        files[name] = Path(path if sep else text)
        if not files[name].is_file():
            raise ValueError(f"--network {text}: no such file")
    missing = [name for name in needed if name not in files]
    if missing:
        raise ValueError(f"no --network NAME=MODEL.onnx for {', '.join(map(repr, missing))}")
    if len(declared) == 1:
        return files[declared[0]]

    def source(name: str) -> Path:
        return files[name] if name in files else source(sources[name])

    models = [(name, onnx.load(str(source(name)))) for name in declared]
    return merge(models, query.aliases).SerializeToString()


def assignment(query: Query, verdict: Verdict) -> str:
    """Every declared variable of a counterexample in declaration order, as the standard
    prints them: inputs from X, outputs and hidden nodes from Y."""
    assert verdict.x is not None and verdict.y is not None
    lines = []
    for v in query.variables:
        size = int(np.prod(v.shape))
        source = verdict.x if v.role == "input" else verdict.y
        dims = ",".join(str(d) for d in v.shape)
        lines.append(f"{v.name} {v.dtype} [{dims}]")
        lines += [repr(float(value)) for value in source[v.offset : v.offset + size]]
    return "\n".join(lines) + "\n"
