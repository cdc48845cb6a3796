"""`vigil verify batch`: complete robustness verdicts for a set of inputs (BaVerLy MILP)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson
from tqdm import tqdm

from vigil.daemon.cli._args import add_cluster_options, load_npy, out_path, seed
from vigil.daemon.offload import ClusterError, DaskCluster
from vigil.rules.certify.batch import (
    BOUNDS,
    METHODS,
    SIZERS,
    Report,
    Solver,
    VerificationError,
    verify_inputs,
)
from vigil.rules.certify.batch.runner import check_inputs, label_chunks, merge_reports

GROUP = "verify"
CHUNK_SIZE = 128
"""Inputs of one label per cluster task, by default."""


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
    add_cluster_options(
        p,
        "run the verification on this Dask cluster's workers, one task per chunk of a "
        "label's inputs",
        CHUNK_SIZE,
        "most inputs of one label per task",
    )
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
    model = args.model.read_bytes()
    x = inputs.reshape(len(inputs), -1) if inputs.ndim > 2 else inputs
    options = {
        "eps": args.eps,
        "clip": args.clip,
        "max_batch": args.max_batch,
        "method": args.baseline or "baverly",
        "sizer": args.sizer,
        "seed": args.seed,
        "solver": Solver(bounds=args.bounds, bound_time=args.bound_time),
    }
    bar = tqdm(total=len(inputs), unit="input", disable=args.no_progress, file=sys.stderr)
    cluster = None
    try:
        if args.scheduler:
            report, cluster = _on_cluster(args, model, x, labels, options, bar.update)
        else:
            report = verify_inputs(model, x, labels, progress=bar.update, **options)
    except VerificationError as e:
        print(f"vigil verify batch: no verdict: {e}", file=sys.stderr)
        return 1
    except ClusterError as e:  # not the input's fault: the cluster is unreachable or failing
        print(f"vigil verify batch: error: {e}", file=sys.stderr)
        return 1
    finally:
        bar.close()
    if args.out:
        with args.out.open("wb") as f:
            for verdict in report.verdicts:
                f.write(orjson.dumps(verdict) + b"\n")
    summary = report.summary
    if cluster is not None:
        summary = {**summary, "cluster": cluster}
    print(orjson.dumps(summary).decode(), flush=True)
    return 0


def _verify_chunk(model: bytes, options: dict, inputs: np.ndarray, labels: np.ndarray) -> Report:
    """One cluster task: ``verify_inputs`` on one chunk of one label's inputs."""
    return verify_inputs(model, inputs, labels, **options)


def _on_cluster(
    args: argparse.Namespace,
    model: bytes,
    x: np.ndarray,
    labels: np.ndarray,
    options: dict,
    progress: Callable[[int], object],
) -> tuple[Report, dict]:
    """Verify on the Dask cluster: bad input is refused here as a local run refuses it, then
    each label's inputs (in chunks of at most --chunk-size) are one task; the verdicts come
    back in input order. The cluster part of the summary names the workers that ran tasks."""
    opts = {k: v for k, v in options.items() if k not in ("seed", "solver")}
    check_inputs(model, x, labels, **opts)
    chunks = label_chunks(labels, args.chunk_size)
    started = time.perf_counter()
    with DaskCluster(args.scheduler) as cluster:
        reports = cluster.fan_out(
            _verify_chunk,
            [(x[idx], labels[idx]) for idx in chunks],
            cluster.scatter(model),
            options,
            progress=lambda i, _: progress(len(chunks[i])),
        )
        workers = dict(sorted(cluster.workers.items()))
    report = merge_reports(list(zip(chunks, reports, strict=True)), time.perf_counter() - started)
    return report, {"scheduler": args.scheduler, "tasks": len(chunks), "workers": workers}
