"""Every i.o.r. backend on the same streams: ms per decision, peak memory, auto's choice.

    python bench/ior_backends.py [--budget 60] [--rows a,b12-0.02,...]

Rows: (a) adult-base-P1 (eps 0.04; needs ../shared/data), (b) synthetic 12-d and 24-d
streams of 1,000,000 decisions at eps 0.02 and 0.1 (bench/streams.py), (c) a 3,072-d stream
of 20,000 decisions (CIFAR-sized: smooth random 32x32x3 images, eps 0.03). L-inf, label
outputs, batch size 4096. Each (row, backend) runs in a fresh subprocess so its peak
resident memory (VmHWM) is its own; a backend that has not finished within ``--budget``
seconds is stopped at the next batch and reported on the prefix it processed (``n``), next
to auto's time on the same prefix, so both are compared on the same work.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from streams import CERTIFAIR_ZIP, certifair, synthetic  # noqa: E402

BACKENDS = ["auto", "grid", "bruteforce", "kdtree", "snn", "bdd", "parallel:2", "parallel:4"]
ROWS = {
    "a": ("adult-base-P1", 0.04),
    "b12-0.02": ("synthetic 12-d", 0.02),
    "b12-0.1": ("synthetic 12-d", 0.1),
    "b24-0.02": ("synthetic 24-d", 0.02),
    "b24-0.1": ("synthetic 24-d", 0.1),
    "c": ("synthetic 3072-d", 0.03),
}
BATCH = 4096


def images(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Smooth random 32x32x3 images in [0, 1] (low-frequency noise), labels by brightness."""
    rng = np.random.default_rng(seed)
    coarse = rng.random((n, 4, 4, 3))
    x = np.repeat(np.repeat(coarse, 8, axis=1), 8, axis=2)
    x = np.clip(x + rng.normal(0, 0.01, size=x.shape), 0, 1).reshape(n, -1)
    y = (x.mean(axis=1) > 0.5).astype(np.int64)
    return x, y


def load(row: str) -> tuple[np.ndarray, np.ndarray, float]:
    eps = ROWS[row][1]
    if row == "a":
        x, y = certifair("adult-base-P1")
    elif row == "c":
        x, y = images(20_000)
    else:
        x, y = synthetic(1_000_000, int(row[1:3]), seed=1)
    return x, y, eps


def one(row: str, backend: str, budget: float) -> dict:
    """Run in a subprocess: feed the stream until done or out of budget."""
    from vigil.rules.ior import Monitor, MonitorSpec
    from vigil.rules.ior.backends import parse_backend

    x, y, eps = load(row)
    name, options = parse_backend(backend)
    monitor = Monitor(MonitorSpec(dim=x.shape[1], eps=eps), name, **options)
    times, pairs, done = [], 0, 0
    started = time.perf_counter()

    def overtime(*_) -> None:
        raise TimeoutError

    signal.signal(signal.SIGALRM, overtime)
    signal.alarm(int(3 * budget) + 1)  # a batch may not end in time: stop within it
    try:
        for s in range(0, len(x), BATCH):
            w = monitor.check_batch(x[s : s + BATCH], y[s : s + BATCH])
            pairs += w.pairs
            done = min(s + BATCH, len(x))
            times.append((done, time.perf_counter() - started))
            if times[-1][1] > budget:
                break
    except TimeoutError:
        if not times:
            return {"error": f"no batch of {BATCH} finished within {3 * budget:.0f} s"}
    signal.alarm(0)
    status = Path("/proc/self/status").read_text()
    chosen = getattr(monitor.backend, "chosen", None)
    return {
        "n": done,
        "total": len(x),
        "seconds": times[-1][1],
        "times": times,
        "pairs": pairs,
        "rss_mib": int(re.search(r"VmHWM:\s+(\d+)", status)[1]) / 1024,
        "chosen": chosen.name if chosen else None,
    }


def _failure(proc: subprocess.CompletedProcess) -> str:
    """One line on why a backend's subprocess failed: its last stderr line, or the signal
    that ended it (a SIGKILL with nothing on stderr is usually the out-of-memory killer)."""
    lines = proc.stderr.strip().splitlines()
    if lines:
        return lines[-1]
    if proc.returncode < 0:
        return f"killed by {signal.Signals(-proc.returncode).name} (out of memory?)"
    return f"exit code {proc.returncode}"


def run_row(row: str, budget: float) -> None:
    name, eps = ROWS[row]
    results = {}
    for backend in BACKENDS:
        proc = subprocess.run(
            [sys.executable, __file__, "--one", row, backend, "--budget", str(budget)],
            capture_output=True,
            text=True,
        )
        if proc.returncode:
            results[backend] = {"error": _failure(proc)}
        else:
            results[backend] = json.loads(proc.stdout)
    auto = results["auto"]
    n_total = auto.get("total")
    print(f"\n({row}) {name}, eps {eps}: {n_total} decisions; auto chose {auto.get('chosen')}")
    print(
        f"{'backend':<13}{'decisions':>10}{'ms/decision':>13}{'auto same n':>13}"
        f"{'ratio':>7}{'peak MiB':>10}{'pairs':>10}"
    )
    for backend, r in results.items():
        if "error" in r:
            print(f"{backend:<13}  {r['error'][:80]}")
            continue
        ms = 1e3 * r["seconds"] / r["n"]
        auto_s = next((t for n, t in auto["times"] if n >= r["n"]), auto["seconds"])
        auto_ms = 1e3 * auto_s / r["n"]
        print(
            f"{backend:<13}{r['n']:>10}{ms:>13.4f}{auto_ms:>13.4f}{auto_ms / ms:>7.2f}"
            f"{r['rss_mib']:>10.0f}{r['pairs']:>10}"
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--budget", type=float, default=60.0, help="seconds per backend and row")
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--one", nargs=2, metavar=("ROW", "BACKEND"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(one(*args.one, args.budget)))
        return 0
    for row in args.rows.split(","):
        if row == "a" and not CERTIFAIR_ZIP.exists():
            print(f"(a) skipped: {CERTIFAIR_ZIP} is absent")
            continue
        run_row(row, args.budget)
    return 0


if __name__ == "__main__":
    sys.exit(main())
