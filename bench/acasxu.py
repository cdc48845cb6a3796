"""The VNN-COMP ACAS Xu benchmark through `vigil verify vnnlib`, one process per instance.

    python bench/acasxu.py [--data ../shared/data/acasxu] [--jobs 1] [--props 1,2] [--csv out.csv]

Every instance of ``acasxu_instances.csv`` runs as a fresh ``vigil verify vnnlib MODEL SPEC
--timeout T --out RESULT`` (start-up included, as VNN-COMP times tools). Each verdict is
compared with the published one, and every ``sat`` result file is checked here on its own:
X inside the property's box, onnxruntime's outputs at X within 1e-4 of the reported Y and
in the unsafe region (within 1e-4, VNN-COMP's tolerance). Prints per property: instances,
solved, wrong, median and max seconds (wall, start-up included; and the solver's own).
"""

from __future__ import annotations

import argparse
import csv
import re
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

DATA = ROOT.parent / "shared" / "data" / "acasxu"
SAT_EXCEPT_PROP_2 = {"1_1", "1_7", "1_8", "1_9", "3_3", "4_2"}
SAT_PROPS_3_4 = {"1_7", "1_8", "1_9"}


def expected(network: str, prop: int) -> str:
    """The published verdict (Katz et al.; VNN-COMP)."""
    if prop == 1:
        return "unsat"
    if prop == 2:
        return "unsat" if network in SAT_EXCEPT_PROP_2 else "sat"
    if prop in (3, 4):
        return "sat" if network in SAT_PROPS_3_4 else "unsat"
    return "sat" if prop in (7, 8) else "unsat"


def run_one(data: Path, row: list[str], workdir: Path) -> dict:
    model_name, spec_name, timeout = row[0], row[1], float(row[2])
    network = re.search(r"run2a_(\d_\d)_", model_name).group(1)
    prop = int(re.search(r"prop_(\d+)", spec_name).group(1))
    out = workdir / f"{network}-{prop}.txt"
    record = {"network": network, "prop": prop, "expected": expected(network, prop)}
    record.update(run_instance(data / model_name, data / spec_name, timeout, out))
    return record


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--jobs", type=int, default=1, help="instances run at once")
    p.add_argument("--props", help="comma-separated property numbers (default: all)")
    p.add_argument("--csv", type=Path, help="write one row per instance")
    args = p.parse_args()
    listing = args.data / "acasxu_instances.csv"
    if not listing.exists():
        print(f"no {listing}: the ACAS Xu benchmark is not there", file=sys.stderr)
        return 2
    rows = [r for r in csv.reader(listing.read_text().splitlines()) if r]
    if args.props:
        wanted = {int(x) for x in args.props.split(",")}
        rows = [r for r in rows if int(re.search(r"prop_(\d+)", r[1]).group(1)) in wanted]
    compile_project()
    print(f"{len(rows)} instances, {args.jobs} at a time (OPENBLAS_NUM_THREADS={threads()})")
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run_one, args.data, r, Path(tmp)) for r in rows]
        records = collect(
            futures,
            lambda r: (
                f"{r['network']} prop {r['prop']}: {r['result']} (expected "
                f"{r['expected']}) {r['wall']:.2f} s wall, {r['seconds']:.2f} s solver"
            ),
        )
    write_csv(args.csv, records)
    header("prop")
    for prop in sorted({r["prop"] for r in records}):
        summary(str(prop), [r for r in records if r["prop"] == prop])
    summary("all", records)
    return 1 if any(wrong(r) for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
