"""`vigil certify knn`: certify KNN decisions fair under biased labels (FairKNN)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson
from tqdm import tqdm

from vigil.daemon.cli._args import out_path
from vigil.rules.certify.knn import VARIANTS, Enumerator, FairKnnCertifier, read_csv, split_target
from vigil.rules.certify.knn.certifier import DEFAULT_FOLDS
from vigil.rules.certify.knn.summary import format_summary, summarize
from vigil.rules.certify.knn.table import target_column

GROUP = "certify"
PROGRESS_STEP = 16
"""Inputs certified between progress bar updates."""
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
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    table = read_csv(args.train, args.sep)
    features, labels = split_target(table, args.target)
    cert = FairKnnCertifier.from_table(
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
    inputs = read_csv(args.inputs, args.sep)
    target_col = target_column(args.target)
    if target_col in inputs.columns:
        inputs = inputs.drop(target_col)
    if inputs.columns != features.columns:
        raise ValueError(
            f"--inputs {args.inputs}: columns must be the training features "
            f"({', '.join(features.columns)})"
        )
    x = cert.encoder.transform(inputs)
    groups = [
        ",".join(f"{p}={inputs.rows[i][inputs.index(p)]}" for p in args.protected)
        for i in range(len(x))
    ]
    enumerated = args.check and any(v in ENUMERATED for v in args.variant)
    enumerator = Enumerator(cert.model, cert.flips) if enumerated else None
    lines: list[dict] = [
        {
            "index": i,
            "group": groups[i],
            "k": cert.k,
            "kset": [int(k) for k in cert.kset],
            "variants": {},
        }
        for i in range(len(x))
    ]
    records = []
    bar = tqdm(
        total=len(x) * len(args.variant), disable=args.no_progress, desc="certify knn", unit="input"
    )
    for variant in args.variant:
        truth = None
        if enumerator is not None and variant in ENUMERATED:
            truth = cert.ground_truth(x, variant, enumerator)
        certs = []
        for start in range(0, len(x), PROGRESS_STEP):
            certs.extend(cert.certify(x[start : start + PROGRESS_STEP], variant, args.eps))
            bar.update(min(PROGRESS_STEP, len(x) - start))
        for i, c in enumerate(certs):
            entry = {
                "certified": c.certified,
                "status": "certified" if c.certified else "unknown",
                "failed_k": c.failed_k,
                "seconds": c.seconds,
            }
            if truth is not None:
                entry["truth"] = truth[i]
            lines[i]["label"] = cert.label_value(c.label)
            lines[i]["variants"][variant] = entry
            records.append({"variant": variant, "group": groups[i], **entry})
    bar.close()
    with args.out.open("wb") as f:
        for line in lines:
            f.write(orjson.dumps(line) + b"\n")
    summary = summarize(records)
    kset = [int(k) for k in cert.kset]
    print(f"K = {cert.k}, KSet = {kset}, learned in {cert.learn_seconds:.2f}s", file=sys.stderr)
    print(format_summary(summary), file=sys.stderr)
    print(
        orjson.dumps(
            {"k": cert.k, "kset": [int(k) for k in cert.kset], "summary": summary}
        ).decode()
    )
    unsound = sum(e.get("unsound", 0) for e in summary.values())
    return 1 if unsound else 0
