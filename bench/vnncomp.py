"""What the VNN-COMP benchmarks (bench/acasxu.py, bench/mnistfc.py) share: one instance
run as a fresh `vigil verify vnnlib` process (start-up included, as VNN-COMP times tools)
with its wall time and peak resident memory, each `sat` result file checked on its own, and
the summary table."""

from __future__ import annotations

import compileall
import csv
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from vigil.rules.reach.network import OnnxRunner  # noqa: E402
from vigil.rules.reach.vnnlib import read_query  # noqa: E402

TOLERANCE = 1e-4


def check_counterexample(model: Path, spec: Path, text: str) -> str | None:
    """What is wrong with a sat result file, or None when it holds: X inside the property's
    box, onnxruntime's outputs at X within 1e-4 of the reported Y and in the unsafe region
    (as the query's version defines it: VNN-LIB 1.0 within VNN-COMP's 1e-4)."""
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
    if not query.counterexample(x, reference):
        return "onnxruntime's output at X is not in the unsafe region of a box holding X"
    return None


def compile_project() -> None:
    """Write the project's bytecode before anything is timed, as installing a package does:
    an editable install leaves it to the first import, which never writes it where
    ``PYTHONDONTWRITEBYTECODE`` is set, so every instance would compile the modules it
    imports (about 30 ms of each run here)."""
    for part in ("vigil", "rules", "connectors", "daemon"):
        compileall.compile_dir(ROOT / part, quiet=1)


MEASURED = """
import os, subprocess, sys, time
started = time.perf_counter()
child = subprocess.Popen(sys.argv[1:])
_, status, usage = os.wait4(child.pid, 0)
wall = time.perf_counter() - started
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss, wall, file=sys.stderr)
"""
"""Runs the command as its child and reports its exit code, peak resident KiB and wall
seconds, from its start to its exit: the instance's own time, not this launcher's start-up
(about 45 ms here)."""


def run_instance(model: Path, spec: Path, timeout: float, out: Path, *extra: str) -> dict:
    """``vigil verify vnnlib`` on one instance: result, solver seconds, wall seconds, peak
    resident MiB, and what is wrong with its counterexample ("" when nothing)."""
    command = [
        sys.executable, "-m", "vigil.daemon.cli", "verify", "vnnlib", str(model), str(spec),
        "--timeout", f"{timeout:g}", "--out", str(out), *extra,
    ]  # fmt: skip
    stdout, stderr = out.with_suffix(".stdout"), out.with_suffix(".stderr")
    started = time.perf_counter()
    with stdout.open("w") as so, stderr.open("w") as se:
        # through a small process: Linux counts in a spawned process's peak memory what its
        # parent held, and this one holds a network and onnxruntime
        launcher = subprocess.Popen(
            [sys.executable, "-c", MEASURED, *command], stdout=so, stderr=se, start_new_session=True
        )
        try:
            launcher.wait(timeout + 60)
        except subprocess.TimeoutExpired:  # its own --timeout failed: end both
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    wall = time.perf_counter() - started
    lines = stderr.read_text().strip().splitlines()
    code, peak_kib = 1, 0
    if launcher.returncode == 0:
        code_text, peak_text, wall_text = lines[-1].split()
        code, peak_kib, wall = int(code_text), int(peak_text), float(wall_text)
    record = {"wall": wall, "peak_mb": peak_kib / 1024, "problem": ""}
    if code != 0:
        record.update(result="error", seconds=wall, problem="\n".join(lines[:-1])[-300:])
        return record
    result = orjson.loads(stdout.read_text().strip().splitlines()[-1])
    record.update(result=result["result"], seconds=result["seconds"])
    if result["result"] == "sat":
        record["problem"] = check_counterexample(model, spec, out.read_text()) or ""
    return record


def collect(futures: list[Future], line: Callable[[dict], str]) -> list[dict]:
    """The instances' records in order, each printed as it comes: ``line(record)``, then
    WRONG for a wrong verdict and what is wrong with its counterexample."""
    records = []
    for i, future in enumerate(futures, 1):
        r = future.result()
        records.append(r)
        flag = " WRONG" if wrong(r) else ""
        print(f"[{i}/{len(futures)}] {line(r)}{flag} {r['problem']}", flush=True)
    return records


def write_csv(path: Path | None, records: list[dict]) -> None:
    if path is not None:
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(records[0]))
            writer.writeheader()
            writer.writerows(records)


def wrong(r: dict) -> bool:
    decided = r["result"] in ("sat", "unsat")
    known = r["expected"] in ("sat", "unsat")
    return (decided and known and r["result"] != r["expected"]) or bool(r["problem"] and decided)


def summary(name: str, rs: list[dict]) -> None:
    solved = [r for r in rs if r["result"] in ("sat", "unsat")]
    walls = [r["wall"] for r in rs]
    solved_walls = [r["wall"] for r in solved] or [float("nan")]
    print(
        f"{name:>8} {len(rs):>5} {len(solved):>7} {sum(map(wrong, rs)):>6} "
        f"{statistics.median(solved_walls):>15.2f} {statistics.median(walls):>9.2f} "
        f"{max(walls):>8.2f} {max(r['peak_mb'] for r in rs):>12.0f}"
    )


def header(what: str) -> None:
    print(
        f"\n{what:>8} {'inst':>5} {'solved':>7} {'wrong':>6} {'median solved s':>15} "
        f"{'median s':>9} {'max s':>8} {'peak RSS MiB':>12}"
    )


def threads() -> str:
    return os.environ.get("OPENBLAS_NUM_THREADS", "unset")
