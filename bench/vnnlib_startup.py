"""What a small VNN-COMP instance's wall time is made of: one `vigil verify vnnlib` run as a
fresh process, again and again, beside the interpreter alone, its libraries' imports alone
(ended without teardown), and the same command ending through the interpreter's teardown
(as it did before ``exit_now``).

    python bench/vnnlib_startup.py [--model M.onnx --spec P.vnnlib] [--repeats 15]

The default instance is ACAS Xu 1_2 property 4, the benchmark's median instance. The cases
run in turn within each repeat, so a drift in the machine's speed touches them alike; the
script prints each case's median and minimum, and the median of the per-repeat differences
between the command with and without its teardown.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vnncomp import ROOT, compile_project

DATA = ROOT.parent / "shared" / "data" / "acasxu"


def cases(model: Path, spec: Path, out: Path) -> dict[str, list[str]]:
    py = sys.executable
    command = ["verify", "vnnlib", str(model), str(spec), "--timeout", "60", "--out", str(out)]
    with_teardown = "import sys\nfrom vigil.daemon.cli import main\nsys.exit(main())"
    return {
        "interpreter": [py, "-c", "pass"],
        "imports": [py, "-c", "import numpy, onnx, onnxruntime, highspy, os\nos._exit(0)"],
        "with teardown": [py, "-c", with_teardown, *command],
        "as shipped": [py, "-m", "vigil.daemon.cli", *command],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DATA / "ACASXU_run2a_1_2_batch_2000.onnx")
    parser.add_argument("--spec", type=Path, default=DATA / "prop_4.vnnlib")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    if not args.model.is_file() or not args.spec.is_file():
        print(f"no instance at {args.model}, {args.spec}: give --model, --spec", file=sys.stderr)
        return 1
    compile_project()
    env = {**os.environ, "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", "1")}
    with tempfile.TemporaryDirectory() as tmp:
        runs = cases(args.model, args.spec, Path(tmp) / "result.txt")
        times: dict[str, list[float]] = {name: [] for name in runs}
        for repeat in range(args.repeats):
            for name, command in runs.items():
                started = time.perf_counter()
                subprocess.run(command, env=env, check=True, capture_output=True)
                times[name].append(time.perf_counter() - started)
            print(f"repeat {repeat + 1}/{args.repeats}", file=sys.stderr)
    print(f"{args.model.name} {args.spec.name}, {args.repeats} repeats (wall ms, spawn to exit)")
    print(f"{'case':>14} {'median':>8} {'min':>8}")
    for name, seconds in times.items():
        print(f"{name:>14} {statistics.median(seconds) * 1e3:8.0f} {min(seconds) * 1e3:8.0f}")
    saved = [a - b for a, b in zip(times["with teardown"], times["as shipped"], strict=True)]
    print(f"teardown skipped: median {statistics.median(saved) * 1e3:.0f} ms a run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
