"""The daemon's collector schedule: batches are not walked while alive, cycles still go."""

from __future__ import annotations

import subprocess
import sys

_BATCHES = """
import gc, sys
from vigil.daemon.collector import collect_between_batches
if sys.argv[1] == "tuned":
    collect_between_batches()
before = sum(s["collections"] for s in gc.get_stats())
for _ in range(20):  # batches of 5,000 parsed events, alive together, freed after each
    batch = [{"id": i, "x": [0.5] * 30} for i in range(5000)]
    del batch
batches = sum(s["collections"] for s in gc.get_stats()) - before
for _ in range(300_000):  # garbage that only the collector frees: self-referencing lists
    cycle = []
    cycle.append(cycle)
del cycle
freed = sum(s["collected"] for s in gc.get_stats())
print(batches, freed)
"""


def _collections(mode: str) -> tuple[int, int]:
    out = subprocess.run(
        [sys.executable, "-c", _BATCHES, mode], capture_output=True, text=True, check=True
    ).stdout.split()
    return int(out[0]), int(out[1])


def test_batches_are_freed_without_collections_and_cycles_are_still_collected():
    batches, freed = _collections("tuned")
    default_batches, _ = _collections("default")
    # 10,000 containers alive per batch: a young collection every 700 of them by default
    assert default_batches >= 20 * 10
    assert batches == 0
    # 300,000 cycles: at least two young collections' worth were found and freed
    assert freed >= 200_000
