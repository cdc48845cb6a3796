"""`vigil certify cfx`: how large a model shift each counterfactual explanation survives."""

from __future__ import annotations

import argparse
from pathlib import Path

import orjson
from tqdm import tqdm

from vigil.daemon.cli._args import load_npy, seed
from vigil.rules.certify.cfx.certify import as_rows, certify_rows
from vigil.rules.reach.network import Network, load_checked

GROUP = "certify"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "cfx",
        help="largest plausible model shift each counterfactual survives (APΔS, optional MILP)",
        description="Prints one JSON line per counterfactual: "
        '{"row", "delta_max", "samples", "provable_delta"?, "seconds"}.',
    )
    p.add_argument("--model", type=Path, required=True, metavar="M.onnx")
    p.add_argument(
        "--cfx", type=Path, required=True, metavar="CFX.npy", help="one counterfactual per row"
    )
    p.add_argument("--target", type=int, default=1, help="the class the counterfactuals claim")
    p.add_argument("--gamma", type=float, default=0.999, help="confidence of the guarantee")
    p.add_argument("--R", type=float, default=0.995, help="fraction of shifts guaranteed robust")
    p.add_argument(
        "--provable", action="store_true", help="also the largest provable delta (MILP, slower)"
    )
    p.add_argument("--seed", type=seed, default=0, help="seed of the sampled realisations")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(handler=run)


def load_model(path: Path) -> Network:
    """The network behind an ONNX file, checked against onnxruntime; ValueError naming it."""
    if not path.is_file():
        raise ValueError(f"--model {path}: no such file")
    try:
        return load_checked(path)[0]
    except ValueError as e:
        raise ValueError(f"--model {path}: {e}") from None


def run(args: argparse.Namespace) -> int:
    network = load_model(args.model)
    rows = as_rows(load_npy(args.cfx, "--cfx"), network, f"--cfx {args.cfx}")
    results = certify_rows(network, rows, args.target, args.gamma, args.R, args.provable, args.seed)
    for entry in tqdm(results, total=len(rows), disable=args.no_progress, unit="cfx"):
        tqdm.write(orjson.dumps(entry).decode())
    return 0
