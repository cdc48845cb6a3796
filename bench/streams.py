"""Decision streams for benchmarks: the shared Certifair streams and synthetic ones; and the
machine's speed at the moment, to read a benchmark's numbers beside."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
CERTIFAIR_ZIP = SHARED_DATA / "fairness-streams-certifair.zip"


def certifair(name: str) -> tuple[np.ndarray, np.ndarray]:
    """(features, predicted labels) of e.g. ``adult-base-P1``; features exclude the label."""
    with zipfile.ZipFile(CERTIFAIR_ZIP) as z, z.open(f"predictions/{name}-combined.csv") as f:
        data = np.loadtxt(f, delimiter=",", skiprows=1)
    return np.ascontiguousarray(data[:, 2:]), data[:, 0].astype(np.int64)


def synthetic(n: int, dim: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A mixed stream shaped like tabular decision data: a third of the features categorical
    (4 levels, 1/3 apart), the rest continuous in [0, 1] on a noisy 2-d manifold (so that
    near neighbours exist, as in real data); labels from a linear rule on the manifold with
    2% label noise, so some close decisions disagree."""
    rng = np.random.default_rng(seed)
    cat = dim // 3
    z = rng.random((n, 2))
    cont = z @ rng.normal(size=(2, dim - cat))
    cont = (cont - cont.min(axis=0)) / np.ptp(cont, axis=0)
    cont += rng.normal(0, 0.003, size=cont.shape)
    cats = rng.integers(0, 4, size=(n, cat)) / 3
    w = rng.normal(size=2)
    y = (z @ w > np.median(z[: min(n, 10_000)] @ w)).astype(np.int64)
    flip = rng.random(n) < 0.02
    y[flip] = 1 - y[flip]
    return np.hstack([cats, cont]), y


def machine_reference(n: int = 50_000, repeats: int = 2) -> float:
    """The machine's speed at the moment: CPU microseconds a decision of
    bench/pipeline_cpu.py's broker-free drain of ``n`` decisions (best of ``repeats``), in a
    process of its own. The Kafka benchmarks print it before and after their runs: this
    machine's speed drifts by half within minutes, so their numbers are read beside the
    reference taken with them (docs/benchmarks.md). It moves with the daemon's own in-loop
    path, not with Kafka's clients or the decode worker."""
    script = Path(__file__).with_name("pipeline_cpu.py")
    command = [sys.executable, str(script), "--n", str(n), "--repeats", str(repeats)]
    out = subprocess.run([*command, "--steady", "0"], capture_output=True, text=True, check=True)
    found = re.search(r"([\d.]+) us CPU per decision best", out.stdout)
    if found is None:
        raise RuntimeError(f"no drain time in the reference's output: {out.stdout!r}")
    return float(found.group(1))
