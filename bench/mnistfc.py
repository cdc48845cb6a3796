"""The VNN-COMP 2021 mnistfc benchmark through `vigil verify vnnlib`, one process per
instance, at the published timeouts (120 s for 256x2, 300 s for 256x4 and 256x6).

    python bench/mnistfc.py [--data ../shared/data/mnistfc] [--networks 256x2] [--eps 0.05]
                            [--published] [--only 256x2:prop_1_0.03,...] [--jobs 1]
                            [--memory-limit 2GiB] [--csv out.csv]

Each instance gets its share of the cores (``--cores``: all of them with ``--jobs 1``, as
VNN-COMP runs instances; one each with two jobs on two cores).

Each verdict is compared with ``published_verdicts.csv`` (``?``: no tool decided it), each
``sat`` result file is checked on its own against onnxruntime (bench/vnncomp.py), and each
instance's peak resident memory is read from the operating system. Prints per network:
instances, solved, wrong, median seconds of the solved ones and of all (wall, start-up
included), the longest, and the largest peak memory. Exit status 1 if any verdict is wrong,
a counterexample fails its check, or an instance went over the memory limit.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from vnncomp import (
    ROOT,
    collect,
    compile_project,
    header,
    run_instance,
    summary,
    threads,
    write_csv,
    wrong,
)

DATA = ROOT.parent / "shared" / "data" / "mnistfc"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--networks", help="comma-separated, e.g. 256x2,256x4 (default: all three)")
    p.add_argument("--eps", help="comma-separated, e.g. 0.05 (default: both, 0.03 and 0.05)")
    p.add_argument("--published", action="store_true", help="only instances some 2021 tool decided")
    p.add_argument(
        "--only", help="comma-separated instances, e.g. 256x2:prop_1_0.03 (default: all)"
    )
    p.add_argument(
        "--jobs", type=int, default=1, help="instances run at once, each on its share of the cores"
    )
    p.add_argument("--memory-limit", default="2GiB", help="passed to each instance")
    p.add_argument("--csv", type=Path, help="write one row per instance")
    args = p.parse_args()
    listing = args.data / "mnistfc_instances.csv"
    if not listing.exists():
        print(f"no {listing}: the mnistfc benchmark is not there", file=sys.stderr)
        return 2
    published = {
        (r["network"], r["property"]): r["verdict"]
        for r in csv.DictReader((args.data / "published_verdicts.csv").open())
    }
    rows = [r for r in csv.reader(listing.read_text().splitlines()) if r]
    if args.networks:
        wanted = {f"mnist-net_{n}.onnx" for n in args.networks.split(",")}
        rows = [r for r in rows if r[0] in wanted]
    if args.eps:
        wanted = {f"_{e}.vnnlib" for e in args.eps.split(",")}
        rows = [r for r in rows if any(r[1].endswith(w) for w in wanted)]
    if args.published:
        rows = [r for r in rows if published.get((r[0], r[1]), "?") != "?"]
    if args.only:
        wanted = {
            (f"mnist-net_{name.split(':')[0]}.onnx", f"{name.split(':')[-1]}.vnnlib")
            for name in args.only.split(",")
        }
        rows = [r for r in rows if (r[0], r[1]) in wanted]
    limit_mb = _megabytes(args.memory_limit)
    compile_project()
    cores = max(len(os.sched_getaffinity(0)) // args.jobs, 1)
    print(f"{len(rows)} instances, {args.jobs} at a time, --cores {cores}, --memory-limit "
          f"{args.memory_limit} (OPENBLAS_NUM_THREADS={threads()})", flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:

        def one(i: int, row: list[str]) -> dict:
            model, spec, timeout = row[0], row[1], float(row[2])
            record = {
                "network": model.removeprefix("mnist-net_").removesuffix(".onnx"),
                "property": spec.removesuffix(".vnnlib"),
                "timeout": timeout,
                "expected": published.get((model, spec), "?"),
            }
            out = Path(tmp) / f"{i}.txt"
            limit = ("--memory-limit", args.memory_limit, "--cores", str(cores))
            record.update(run_instance(args.data / model, args.data / spec, timeout, out, *limit))
            if record["peak_mb"] > limit_mb:
                record["problem"] += f" peak {record['peak_mb']:.0f} MiB over the limit"
            return record

        futures = [pool.submit(one, i, r) for i, r in enumerate(rows)]
        records = collect(
            futures,
            lambda r: (
                f"{r['network']} {r['property']}: {r['result']} (published "
                f"{r['expected']}) {r['wall']:.1f} s wall, {r['peak_mb']:.0f} MiB"
            ),
        )
    write_csv(args.csv, records)
    header("network")
    for network in sorted({r["network"] for r in records}):
        summary(network, [r for r in records if r["network"] == network])
    summary("all", records)
    failed = any(wrong(r) or "over the limit" in r["problem"] for r in records)
    return 1 if failed else 0


def _megabytes(text: str) -> float:
    from vigil.daemon.cli._args import byte_size

    return byte_size(text) / 2**20


if __name__ == "__main__":
    sys.exit(main())
