"""i.o.r. monitor throughput: Vigil's backends against a per-decision Faiss brute force.

    python bench/ior_bench.py [--stream adult-base-P1] [--eps 0.04] [--repeats 3]
                              [--batch-size 4096] [--backends auto,grid]
    python bench/ior_bench.py --scaling [--n 1000000]

The baseline is the research tool's BF strategy: one Faiss ``IndexFlat`` per label, one
range query per decision, then the decision is added. Every Vigil backend must return the
same witness sets; the script fails if one does not.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import faiss
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from streams import CERTIFAIR_ZIP, certifair, synthetic

from vigil.rules.ior import BACKENDS, Monitor, MonitorSpec
from vigil.rules.ior.distance import float32_search_radius, input_distance
from vigil.rules.ior.spec import InputMetric


def per_decision_bruteforce(x: np.ndarray, y: np.ndarray, eps: float) -> list[tuple[int, int]]:
    """The baseline: one query per decision against a flat index per label."""
    radius = float32_search_radius(eps, float(np.abs(x).max()), x.shape[1], InputMetric.LINF)
    x32 = x.astype(np.float32)
    indexes: dict[int, tuple[faiss.IndexFlat, list[int]]] = {}
    pairs = []
    for n in range(len(x)):
        for label, (index, positions) in indexes.items():
            if label == y[n] or not index.ntotal:
                continue
            _, _, found = index.range_search(x32[n : n + 1], radius)
            if len(found):
                cand = np.asarray(positions)[found]
                d = input_distance(
                    x[cand], np.broadcast_to(x[n], (len(cand), x.shape[1])), InputMetric.LINF
                )
                pairs.extend((n, int(j)) for j in cand[d <= eps])
        entry = indexes.setdefault(int(y[n]), (faiss.IndexFlat(x.shape[1], faiss.METRIC_Linf), []))
        entry[0].add(x32[n : n + 1])
        entry[1].append(n)
    return sorted(pairs)


def run_monitor(x, y, eps, backend, batch_size):
    monitor = Monitor(MonitorSpec(dim=x.shape[1], eps=eps), backend)
    pairs = []
    for s in range(0, len(x), batch_size):
        w = monitor.check_batch(x[s : s + batch_size], y[s : s + batch_size])
        q = np.repeat(np.arange(w.first, w.first + len(w)), w.counts)
        pairs.append(np.stack([q, w.index], axis=1))
    return monitor, sorted(map(tuple, np.concatenate(pairs).tolist()))


def timed(fn, repeats):
    times, result = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), result


def compare(args) -> int:
    if not CERTIFAIR_ZIP.exists():
        print(f"skipped: {CERTIFAIR_ZIP} is absent", file=sys.stderr)
        return 0
    x, y = certifair(args.stream)
    n = len(x)
    print(
        f"stream {args.stream}: {n} decisions, {x.shape[1]} features, eps {args.eps}, L-inf, "
        f"batch size {args.batch_size}, medians of {args.repeats} runs"
    )
    base_t, truth = timed(lambda: per_decision_bruteforce(x, y, args.eps), args.baseline_repeats)
    flagged = len({q for q, _ in truth})
    print(f"{'backend':<28}{'ms/decision':>12}{'speed-up':>10}{'flagged':>9}{'pairs':>8}")
    print(
        f"{'per-decision faiss BF':<28}{1e3 * base_t / n:>12.4f}{1.0:>10.1f}{flagged:>9}"
        f"{len(truth):>8}"
    )
    ok = True
    for name in args.backends.split(","):
        reps = args.repeats if name == "auto" else 1
        t, (monitor, pairs) = timed(
            lambda name=name: run_monitor(x, y, args.eps, name, args.batch_size), reps
        )
        same = pairs == truth
        ok &= same
        note = "" if same else "  MISMATCH"
        plan = getattr(monitor.backend, "plan", None)
        print(
            f"{'vigil ' + name:<28}{1e3 * t / n:>12.4f}{base_t / t:>10.1f}"
            f"{len({q for q, _ in pairs}):>9}{len(pairs):>8}{note}"
        )
        if plan is not None:
            print(
                f"    auto plan: keys={list(plan.keys)} grid={list(plan.grid)} "
                f"by_label={plan.by_label}"
            )
    return 0 if ok else 1


def scaling(args) -> int:
    x, y = synthetic(args.n, args.dim, seed=1)
    monitor = Monitor(MonitorSpec(dim=args.dim, eps=args.eps), "auto")
    block, flagged = 100_000, 0
    print(
        f"length scaling: {args.n} synthetic decisions, {args.dim} features, eps {args.eps}, "
        f"L-inf, auto, batch size {args.batch_size}"
    )
    print(f"{'decisions':>10}{'ms/decision':>13}{'flagged':>9}  plan")
    for b in range(0, args.n, block):
        t = time.perf_counter()
        for s in range(b, min(b + block, args.n), args.batch_size):
            w = monitor.check_batch(x[s : s + args.batch_size], y[s : s + args.batch_size])
            flagged += len(w.flagged)
        dt = time.perf_counter() - t
        plan = monitor.backend.plan
        print(
            f"{min(b + block, args.n):>10}{1e3 * dt / block:>13.4f}{flagged:>9}"
            f"  keys={list(plan.keys)} grid={list(plan.grid)}"
        )
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--stream", default="adult-base-P1")
    p.add_argument("--eps", type=float, default=None)
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated (default: all)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--baseline-repeats", type=int, default=1)
    p.add_argument("--scaling", action="store_true")
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=12)
    args = p.parse_args()
    if args.scaling:
        args.eps = 0.02 if args.eps is None else args.eps
        return scaling(args)
    args.eps = 0.04 if args.eps is None else args.eps
    return compare(args)


if __name__ == "__main__":
    sys.exit(main())
