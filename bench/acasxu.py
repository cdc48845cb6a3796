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
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from vigil.rules.reach.network import OnnxRunner  # noqa: E402
from vigil.rules.reach.vnnlib import read_query  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "acasxu"
TOLERANCE = 1e-4
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


def check_counterexample(model: Path, spec: Path, text: str) -> str | None:
    """What is wrong with a sat result file, or None when it holds."""
    values = dict(re.findall(r"\(([XY]_\d+)\s+([^\s()]+)\)", text))
    query = read_query(spec)
    try:
        x = np.array([float(values[f"X_{i}"]) for i in range(query.inputs)])
        y = np.array([float(values[f"Y_{j}"]) for j in range(query.outputs)])
    except KeyError as e:
        return f"the result file lacks {e}"
    reference = OnnxRunner(model)(x[None])[0]
    if np.max(np.abs(reference - y)) > TOLERANCE:
        return f"Y differs from onnxruntime's by {np.max(np.abs(reference - y)):.3g}"
    if not query.counterexample(x, reference, TOLERANCE):
        return "onnxruntime's output at X is not in the unsafe region of a box holding X"
    return None


def run_one(data: Path, row: list[str], workdir: Path) -> dict:
    model_name, spec_name, timeout = row[0], row[1], float(row[2])
    network = re.search(r"run2a_(\d_\d)_", model_name).group(1)
    prop = int(re.search(r"prop_(\d+)", spec_name).group(1))
    out = workdir / f"{network}-{prop}.txt"
    command = [
        sys.executable, "-m", "vigil.daemon.cli", "verify", "vnnlib",
        str(data / model_name), str(data / spec_name),
        "--timeout", str(timeout), "--out", str(out),
    ]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout + 60)
    wall = time.perf_counter() - started
    record = {"network": network, "prop": prop, "wall": wall, "expected": expected(network, prop)}
    if done.returncode != 0:
        record.update(result="error", seconds=wall, problem=done.stderr.strip()[-300:])
        return record
    result = orjson.loads(done.stdout.strip().splitlines()[-1])
    record.update(result=result["result"], seconds=result["seconds"], problem="")
    if result["result"] == "sat":
        record["problem"] = (
            check_counterexample(data / model_name, data / spec_name, out.read_text()) or ""
        )
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
    env_threads = os.environ.get("OPENBLAS_NUM_THREADS")
    print(
        f"{len(rows)} instances, {args.jobs} at a time (OPENBLAS_NUM_THREADS={env_threads})",
        flush=True,
    )
    records = []
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run_one, args.data, r, Path(tmp)) for r in rows]
        for i, future in enumerate(futures, 1):
            r = future.result()
            records.append(r)
            wrong = _wrong(r)
            flag = " WRONG" if wrong else ""
            print(
                f"[{i}/{len(rows)}] {r['network']} prop {r['prop']}: {r['result']} "
                f"(expected {r['expected']}) {r['wall']:.2f} s wall, {r['seconds']:.2f} s "
                f"solver{flag} {r['problem']}",
                flush=True,
            )
    if args.csv:
        with args.csv.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(records[0]))
            writer.writeheader()
            writer.writerows(records)
    print(
        f"\n{'prop':>4} {'inst':>5} {'solved':>7} {'wrong':>6} {'median s':>9} {'max s':>8} "
        f"{'median solver s':>16}"
    )
    for prop in sorted({r["prop"] for r in records}):
        _summary(str(prop), [r for r in records if r["prop"] == prop])
    _summary("all", records)
    return 1 if any(_wrong(r) for r in records) else 0


def _wrong(r: dict) -> bool:
    decided = r["result"] in ("sat", "unsat")
    return (decided and r["result"] != r["expected"]) or bool(r["problem"] and decided)


def _summary(name: str, rs: list[dict]) -> None:
    solved = [r for r in rs if r["result"] in ("sat", "unsat")]
    walls = [r["wall"] for r in rs]
    solver = [r["seconds"] for r in rs]
    print(
        f"{name:>4} {len(rs):>5} {len(solved):>7} {sum(map(_wrong, rs)):>6} "
        f"{statistics.median(walls):>9.2f} {max(walls):>8.2f} {statistics.median(solver):>16.2f}"
    )


if __name__ == "__main__":
    sys.exit(main())
