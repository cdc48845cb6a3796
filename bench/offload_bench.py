"""Decision throughput of the daemon with and without certification jobs running in its pool.

    bash ops/kafka/dev-kafka.sh start
    python bench/offload_bench.py [--bootstrap 127.0.0.1:9092] [--n 46033] [--repeats 3]

Each run produces N decisions — in the "with jobs" runs after a set of slow KNN
certification requests (a training set of --rows rows each, learned in the worker) — then starts a
fresh `vigil run` (at-least-once; an i.o.r. rule on the decisions and a certify rule with
job = "knn" on the requests topic) that drains both. Decisions per second are read from
the daemon's own `vigil_events_total` counter; the jobs must still be running when the last
decision is checked, which the script verifies. Medians over the repeats, both conditions
in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import re
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from pipeline_bench import drain_rate, events, produce_all, stream  # noqa: E402

from tests.daemon_harness import KNN_RULE, Daemon, wait_http  # noqa: E402


def slow_requests(workdir: Path, count: int, rows: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    x = rng.random((rows, 4)).round(3)
    sex = rng.integers(0, 2, len(x))
    y = ((x[:, 0] + x[:, 1] + 0.3 * rng.random(len(x))) > 1.1).astype(int)
    path = workdir / "train.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["a", "b", "c", "d", "sex", "y"])
        writer.writerows([*r, s, t] for r, s, t in zip(x.tolist(), sex, y, strict=True))
    inputs = [[*r, int(s)] for r, s in zip(x[:5].tolist(), sex[:5], strict=True)]
    return [
        orjson.dumps(
            {
                "id": f"job{i}",
                "train_path": str(path),
                "target": "y",
                "protected": ["sex"],
                "flips": 2 + i,
                "inputs": inputs,
            }  # distinct flips: no cache hits between jobs
        )
        for i in range(count)
    ]


async def pending_jobs(port: int) -> float:
    body = await wait_http(port, "/metrics")
    m = re.search(r'vigil_offload_pending_jobs\{pool="default"\} ([0-9.e+]+)', body)
    return float(m.group(1)) if m else 0.0


async def one_run(args, x, y, with_jobs: bool) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        daemon = Daemon(
            args.bootstrap,
            workdir,
            exactly_once=False,
            snapshot_every_events=10**9,
            extra_rules=KNN_RULE,
            offload_workers=args.workers,
        )
        try:
            if with_jobs:  # requests first: the jobs start as the decisions are drained
                requests = slow_requests(workdir, args.jobs, args.rows)
                await produce_all(args.bootstrap, daemon.topic_for("knn"), requests)
            await produce_all(args.bootstrap, daemon.topic, events(x, y))
            daemon.start()
            rate = await drain_rate(daemon.port, len(x))
            if with_jobs and await pending_jobs(daemon.port) == 0:
                raise SystemExit("the jobs finished before the decisions: use more --jobs")
            return rate
        finally:
            daemon.kill()


async def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--bootstrap", default="127.0.0.1:9092")
    p.add_argument("--n", type=int, default=138_099, help="decisions (adult, repeated)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, default=1, help="offload pool processes")
    p.add_argument("--jobs", type=int, default=6, help="slow certification requests")
    p.add_argument("--rows", type=int, default=15_000, help="training rows of each job")
    args = p.parse_args()
    x, y, name = stream(args.n)
    print(
        f"stream: {name}, {len(x)} decisions; offload workers: {args.workers}; "
        f"{args.jobs} KNN jobs ({args.rows} training rows each) in the 'with jobs' runs"
    )
    rates: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.repeats):
        for with_jobs in (False, True):
            rates[with_jobs].append(await one_run(args, x, y, with_jobs))
    base, loaded = statistics.median(rates[False]), statistics.median(rates[True])
    print(f"{'condition':<12}{'decisions/s (median)':>22}{'runs':>40}")
    for label, key in (("no jobs", False), ("with jobs", True)):
        runs = ", ".join(f"{r:.0f}" for r in rates[key])
        print(f"{label:<12}{statistics.median(rates[key]):>22.0f}{runs:>40}")
    print(f"ratio with/without: {loaded / base:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
