"""`vigil explain`: counterfactual explanations, robust to plausible model shifts on request."""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import orjson
from tqdm import tqdm

from vigil.daemon.cli._args import load_npy, out_path, seed
from vigil.daemon.cli.certify_cfx import load_model
from vigil.rules.certify.cfx.certify import as_rows
from vigil.rules.certify.cfx.generate import nearest_cfx, robust_cfx

GROUP = None
ROBUST_OPTIONS = {"delta": None, "test": "apas", "gamma": 0.999, "R": 0.995, "max_iterations": 20}
"""Options of --robust and their defaults (left unset on the command line, to tell whether
they were given)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "explain",
        help="nearest counterfactual explanations (L1, MILP), optionally shift-robust",
        description="Writes one counterfactual per input row (NaN where none was found) and "
        'prints one JSON line per row: {"row", "found", "l1", "iterations", "seconds"}.',
    )
    p.add_argument("--model", type=Path, required=True, metavar="M.onnx")
    p.add_argument("--x", type=Path, required=True, metavar="X.npy", help="inputs, one per row")
    p.add_argument("--out", type=out_path, help="where to write them (default: X_cfx.npy beside X)")
    p.add_argument("--target", type=int, default=1, help="the class to reach")
    p.add_argument("--robust", action="store_true", help="robust to shifts of size --delta")
    p.add_argument("--delta", type=float, help="plausible shift size for --robust")
    p.add_argument(
        "--test",
        choices=["apas", "milp"],
        help="robustness test: APΔS sampling (default) or the exact MILP (worst case)",
    )
    p.add_argument("--gamma", type=float, help="APΔS confidence (default 0.999)")
    p.add_argument("--R", type=float, help="APΔS share of robust shifts (default 0.995)")
    p.add_argument("--max-iterations", type=int, help="relaxations tried (default 20)")
    p.add_argument("--lower", type=float, default=0.0, help="lower bound of every feature")
    p.add_argument("--upper", type=float, default=1.0, help="upper bound of every feature")
    p.add_argument(
        "--bounds",
        type=Path,
        metavar="B.npy",
        help="per-feature bounds, shape (2, features); overrides --lower/--upper",
    )
    p.add_argument(
        "--immutable", type=int, nargs="*", default=[], metavar="I", help="features kept as is"
    )
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    given = [f"--{k.replace('_', '-')}" for k in ROBUST_OPTIONS if getattr(args, k) is not None]
    if given and not args.robust:
        raise ValueError(f"{', '.join(given)} only apply with --robust")
    for key, default in ROBUST_OPTIONS.items():
        if getattr(args, key) is None:
            setattr(args, key, default)
    if args.robust and (args.delta is None or not (args.delta >= 0 and math.isfinite(args.delta))):
        raise ValueError(f"--robust needs a finite --delta >= 0, got {args.delta}")
    network = load_model(args.model)
    xs = as_rows(load_npy(args.x, "--x"), network, f"--x {args.x}")
    lower, upper = args.lower, args.upper
    if args.bounds is not None:
        bounds = load_npy(args.bounds, "--bounds")
        if bounds.shape != (2, network.input_dim):
            raise ValueError(
                f"--bounds: expected shape (2, {network.input_dim}), got {bounds.shape}"
            )
        lower, upper = bounds[0], bounds[1]
    lower, upper = (
        np.broadcast_to(lower, network.input_dim),
        np.broadcast_to(upper, network.input_dim),
    )
    if not (np.isfinite(lower).all() and np.isfinite(upper).all() and (lower <= upper).all()):
        raise ValueError("the feature bounds must be finite numbers with lower <= upper")
    out = args.out or args.x.with_name(f"{args.x.stem}_cfx.npy")
    found = np.full_like(xs, np.nan)
    streams = np.random.SeedSequence(args.seed).spawn(len(xs))
    for i in tqdm(range(len(xs)), disable=args.no_progress, unit="x"):
        start = time.perf_counter()
        if args.robust:
            result = robust_cfx(
                network,
                xs[i],
                args.delta,
                args.target,
                args.test,
                args.gamma,
                args.R,
                np.random.default_rng(streams[i]),
                args.max_iterations,
                lower,
                upper,
                args.immutable,
            )
            cfx, iterations = result.x, result.iterations
        else:
            cfx = nearest_cfx(
                network, xs[i], args.target, lower=lower, upper=upper, immutable=args.immutable
            )
            iterations = 1
        entry = {
            "row": i,
            "found": cfx is not None,
            "l1": None if cfx is None else float(np.abs(cfx - xs[i]).sum()),
            "iterations": iterations,
            "seconds": time.perf_counter() - start,
        }
        if cfx is not None:
            found[i] = cfx
        tqdm.write(orjson.dumps(entry).decode())
    with open(out, "wb") as f:  # np.save(path) would add ".npy" to another name
        np.save(f, found)
    return 0
