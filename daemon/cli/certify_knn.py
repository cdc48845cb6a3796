"""`vigil certify knn`: certify KNN decisions fair under biased labels (FairKNN)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import orjson
from tqdm import tqdm

from vigil.daemon.cli._args import add_cluster_options, out_path
from vigil.daemon.offload import ClusterError, DaskCluster
from vigil.rules.certify.knn import (
    VARIANTS,
    Enumerator,
    FairKnnCertifier,
    Table,
    read_csv,
    split_target,
)
from vigil.rules.certify.knn.certifier import DEFAULT_FOLDS
from vigil.rules.certify.knn.summary import format_summary, summarize
from vigil.rules.certify.knn.table import target_column

GROUP = "certify"
PROGRESS_STEP = 16
"""Inputs certified between progress bar updates."""
CHUNK_SIZE = 256
"""Inputs per cluster task, by default."""
ENUMERATED = ("label", "individual")
"""Variants that --check compares against enumerating every flipped training set."""


def _names(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _ints(text: str) -> list[int]:
    try:
        return [int(t) for t in _names(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def _variants(text: str) -> list[str]:
    names = list(VARIANTS) if text == "all" else _names(text)
    bad = [v for v in names if v not in VARIANTS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"variants are {', '.join(VARIANTS)} or all, got {text!r}")
    return names


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "knn",
        help="certify KNN decisions fair under label bias (FairKNN)",
        description="Writes one JSON line per input to --out: "
        '{"index", "label", "group", "k", "kset", "variants": {variant: {"certified", '
        '"status", "failed_k", "seconds", "truth"?}}}; prints a summary table per variant and '
        "demographic group, then the summary as one JSON line.",
    )
    p.add_argument("--train", type=Path, required=True, metavar="DATA.csv")
    p.add_argument("--target", required=True, help="label column, or COL>=VALUE (e.g. G3>=10)")
    p.add_argument("--protected", type=_names, required=True, help="protected columns: sex[,race]")
    p.add_argument("--flips", type=int, required=True, help="n, the number of biased labels")
    p.add_argument(
        "--eps", type=float, default=0.01, help="fraction of each numeric attribute's range"
    )
    p.add_argument(
        "--variant", type=_variants, default=list(VARIANTS), help="label,individual,epsilon or all"
    )
    p.add_argument("--inputs", type=Path, required=True, metavar="TEST.csv")
    p.add_argument("--out", type=out_path, required=True, metavar="results.jsonl")
    p.add_argument("--categorical", type=_names, default=[], help="columns forced to one-hot")
    p.add_argument("--k", type=_ints, help="candidate K values (default: see docs/knn.md)")
    p.add_argument("--folds", type=int, default=DEFAULT_FOLDS, help="p of p-fold validation")
    p.add_argument("--metric", choices=["euclidean", "manhattan"], default="euclidean")
    p.add_argument(
        "--scaling",
        choices=["minmax", "standard"],
        default="minmax",
        help="numeric columns onto [0, 1] or to zero mean and unit variance",
    )
    p.add_argument("--sep", help="CSV separator (default: sniffed)")
    p.add_argument(
        "--check",
        action="store_true",
        help="soundness check: also enumerate every flipped training set (and protected value) "
        "for the label and individual variants; exit 1 if anything certified is not truly fair",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    add_cluster_options(
        p,
        "learn and certify on this Dask cluster's workers: one task learns, then one "
        "task per chunk of inputs certifies",
        CHUNK_SIZE,
        "inputs per task",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    table = read_csv(args.train, args.sep)
    features, labels = split_target(table, args.target)
    learning = (
        features,
        labels,
        args.protected,
        args.flips,
        args.categorical,
        args.k,
        args.folds,
        args.metric,
        args.scaling,
    )
    cert = None if args.scheduler else _learn(*learning)
    inputs = read_csv(args.inputs, args.sep)
    target_col = target_column(args.target)
    if target_col in inputs.columns:
        inputs = inputs.drop(target_col)
    if inputs.columns != features.columns:
        raise ValueError(
            f"--inputs {args.inputs}: columns must be the training features "
            f"({', '.join(features.columns)})"
        )
    groups = [
        ",".join(f"{p}={inputs.rows[i][inputs.index(p)]}" for p in args.protected)
        for i in range(len(inputs.rows))
    ]
    enumerated = args.check and any(v in ENUMERATED for v in args.variant)
    bar = tqdm(
        total=len(inputs.rows) * len(args.variant),
        disable=args.no_progress,
        desc="certify knn",
        unit="input",
    )
    cluster = None
    try:
        if cert is None:
            learned, rows, cluster = _on_cluster(args, learning, inputs, enumerated, bar.update)
        else:
            enumerator = Enumerator(cert.model, cert.flips) if enumerated else None
            x = cert.encoder.transform(inputs)
            learned = _describe(cert)
            rows = _certify_rows(cert, enumerator, x, args.variant, args.eps, bar.update)
    except ClusterError as e:  # not the input's fault: the cluster is unreachable or failing
        print(f"vigil certify knn: error: {e}", file=sys.stderr)
        return 1
    finally:
        bar.close()
    k, kset = learned["k"], learned["kset"]
    lines = [
        {"index": i, "group": groups[i], "k": k, "kset": kset, "variants": entries, "label": label}
        for i, (label, entries) in enumerate(rows)
    ]
    records = [
        {"variant": variant, "group": groups[i], **entries[variant]}
        for variant in args.variant
        for i, (_, entries) in enumerate(rows)
    ]
    with args.out.open("wb") as f:
        for line in lines:
            f.write(orjson.dumps(line) + b"\n")
    summary = summarize(records)
    print(f"K = {k}, KSet = {kset}, learned in {learned['learn_seconds']:.2f}s", file=sys.stderr)
    print(format_summary(summary), file=sys.stderr)
    printed = {"k": k, "kset": kset, "summary": summary}
    if cluster is not None:
        printed["cluster"] = cluster
    print(orjson.dumps(printed).decode())
    unsound = sum(e.get("unsound", 0) for e in summary.values())
    return 1 if unsound else 0


def _learn(
    features: Table,
    labels: np.ndarray,
    protected: list[str],
    flips: int,
    categorical: list[str],
    k: list[int] | None,
    folds: int,
    metric: str,
    scaling: str,
) -> FairKnnCertifier:
    """Train the KNN and its KSet (a cluster task with --scheduler; its result stays there)."""
    return FairKnnCertifier.from_table(
        features, labels, protected, flips, categorical, k, folds, metric, scaling
    )


def _describe(cert: FairKnnCertifier) -> dict:
    return {"k": cert.k, "kset": [int(k) for k in cert.kset], "learn_seconds": cert.learn_seconds}


def _enumerator(cert: FairKnnCertifier) -> Enumerator:
    return Enumerator(cert.model, cert.flips)


def _certify_rows(
    cert: FairKnnCertifier,
    enumerator: Enumerator | None,
    x: np.ndarray,
    variants: Sequence[str],
    eps: float,
    progress: Callable[[int], object] | None = None,
) -> list[tuple[object, dict]]:
    """Each encoded input's label and its entry per variant (with ``truth`` where
    ``enumerator`` is given and the variant is enumerated). Certificates do not depend on
    the inputs beside them, so any split of the inputs gives the same entries."""
    labels: list[object] = [None] * len(x)
    entries: list[dict] = [{} for _ in range(len(x))]
    for variant in variants:
        truth = None
        if enumerator is not None and variant in ENUMERATED:
            truth = cert.ground_truth(x, variant, enumerator)
        for start in range(0, len(x), PROGRESS_STEP):
            certs = cert.certify(x[start : start + PROGRESS_STEP], variant, eps)
            for i, c in enumerate(certs, start):
                entry = {
                    "certified": c.certified,
                    "status": "certified" if c.certified else "unknown",
                    "failed_k": c.failed_k,
                    "seconds": c.seconds,
                }
                if truth is not None:
                    entry["truth"] = truth[i]
                labels[i] = cert.label_value(c.label)
                entries[i][variant] = entry
            if progress is not None:
                progress(len(certs))
    return list(zip(labels, entries, strict=True))


def _certify_chunk(
    cert: FairKnnCertifier,
    enumerator: Enumerator | None,
    variants: Sequence[str],
    eps: float,
    inputs: Table,
) -> list[tuple[object, dict]]:
    """One cluster task: encode and certify one chunk of the inputs."""
    return _certify_rows(cert, enumerator, cert.encoder.transform(inputs), variants, eps)


def _on_cluster(
    args: argparse.Namespace,
    learning: tuple,
    inputs: Table,
    enumerated: bool,
    progress: Callable[[int], object],
) -> tuple[dict, list[tuple[object, dict]], dict]:
    """Learn and certify on the Dask cluster: one task trains (the certifier stays on the
    cluster; the tasks that need it get it from there), one builds the enumerator for
    --check, and each chunk of inputs is one task; results come back in input order."""
    size = args.chunk_size
    chunks = [
        Table(inputs.columns, inputs.rows[s : s + size]) for s in range(0, len(inputs.rows), size)
    ]
    with DaskCluster(args.scheduler) as cluster:
        data = [cluster.scatter(learning[0]), cluster.scatter(learning[1])]
        cert = cluster.submit(_learn, *data, *learning[2:])
        learned = cluster.result(cluster.submit(_describe, cert))
        enumerator = cluster.submit(_enumerator, cert) if enumerated else None
        parts = cluster.fan_out(
            _certify_chunk,
            [(chunk,) for chunk in chunks],
            cert,
            enumerator,
            args.variant,
            args.eps,
            progress=lambda i, _: progress(len(chunks[i].rows) * len(args.variant)),
        )
        workers = dict(sorted(cluster.workers.items()))
    rows = [row for part in parts for row in part]
    return learned, rows, {"scheduler": args.scheduler, "tasks": len(chunks), "workers": workers}
