"""`vigil verify batch`: complete robustness verdicts for a set of inputs (BaVerLy MILP)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson
from tqdm import tqdm

from vigil.daemon.cli._args import load_npy, out_path, seed
from vigil.rules.certify.batch import (
    BOUNDS,
    METHODS,
    SIZERS,
    Solver,
    VerificationError,
    verify_inputs,
)

GROUP = "verify"


def _clip(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LO,HI, got {text!r}") from None
    return lo, hi


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "batch",
        help="complete L-inf robustness of every input (mini-batch MILP, BaVerLy)",
        description="Decide for every input whether the network is robust in its eps-ball.",
    )
    p.add_argument("--model", type=Path, required=True, metavar="M.onnx")
    p.add_argument("--inputs", type=Path, required=True, metavar="X.npy", help="(n, d) array")
    p.add_argument("--labels", type=Path, required=True, metavar="y.npy", help="(n,) classes")
    p.add_argument("--eps", type=float, required=True, help="L-inf radius of each ball")
    p.add_argument("--clip", type=_clip, metavar="LO,HI", help="valid input range, e.g. 0,1")
    p.add_argument("--max-batch", type=int, default=16, help="largest mini-batch")
    p.add_argument(
        "--baseline",
        choices=[m for m in METHODS if m != "baverly"],
        help="verify one input at a time instead (the MIPVerify-style baseline)",
    )
    p.add_argument("--sizer", choices=SIZERS, default="thompson", help="batch-size policy")
    p.add_argument(
        "--bounds",
        choices=BOUNDS,
        default="lp",
        help="tighten unstable neurons by LP (fast) or by MILP (tighter; MIPVerify's strongest)",
    )
    p.add_argument(
        "--bound-time",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds per neuron bound with --bounds milp (a stopped search stays sound)",
    )
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--out", type=out_path, metavar="verdicts.jsonl", help="one JSON line per input")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if not args.model.is_file():
        raise ValueError(f"model {args.model}: no such file")
    inputs = load_npy(args.inputs, "--inputs")
    labels = load_npy(args.labels, "--labels")
    if inputs.ndim < 2:
        raise ValueError(f"--inputs: expected an (n, d) array, got shape {inputs.shape}")
    if not args.bound_time > 0:
        raise ValueError(f"--bound-time must be positive, got {args.bound_time}")
    bar = tqdm(total=len(inputs), unit="input", disable=args.no_progress, file=sys.stderr)
    try:
        report = verify_inputs(
            args.model.read_bytes(),
            inputs.reshape(len(inputs), -1) if inputs.ndim > 2 else inputs,
            labels,
            args.eps,
            clip=args.clip,
            max_batch=args.max_batch,
            method=args.baseline or "baverly",
            sizer=args.sizer,
            seed=args.seed,
            solver=Solver(bounds=args.bounds, bound_time=args.bound_time),
            progress=bar.update,
        )
    except VerificationError as e:
        print(f"vigil verify batch: no verdict: {e}", file=sys.stderr)
        return 1
    finally:
        bar.close()
    if args.out:
        with args.out.open("wb") as f:
            for verdict in report.verdicts:
                f.write(orjson.dumps(verdict) + b"\n")
    print(orjson.dumps(report.summary).decode(), flush=True)
    return 0
