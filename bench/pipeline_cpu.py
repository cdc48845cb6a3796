"""The daemon's own cost per decision, without a broker: the pipeline (decode, route, check,
alert, commit) over an in-memory source and sink, with the i.o.r. rule of
bench/pipeline_bench.py.

    python bench/pipeline_cpu.py [--n 150000] [--repeats 5] [--steady 40000] [--profile 25]

1. drain: N decisions in batches of the daemon's ``max_batch`` (5000); CPU seconds of this
   process per decision, best and median over the repeats (the broker-free part of the
   drain throughput: Kafka's client adds its own per-record cost on top);
2. steady: after draining N, ``--steady`` more decisions in batches of 50-200 (what a batch
   holds at 10,000 decisions/s): the median batch and the five slowest, with the history
   size where each ended (a stall there is added to the latency of every decision
   waiting behind it);
3. with ``--profile K``: the top K functions of one drain by own time (cProfile).

The allocator thresholds are set as `vigil run` sets them (daemon/malloc.py), unless
``--glibc-defaults``, and so is the collector's schedule (daemon/collector.py).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from pipeline_bench import events, stream

from vigil.connectors.events import Record
from vigil.connectors.memory import MemorySink, MemorySource
from vigil.daemon.adapters import IorRule
from vigil.daemon.collector import collect_between_batches
from vigil.daemon.config import parse_config
from vigil.daemon.logs import configure_logging
from vigil.daemon.malloc import keep_freed_memory
from vigil.daemon.metrics import Metrics
from vigil.daemon.pipeline import Pipeline, PipelineSettings
from vigil.daemon.state import FileStore

MAX_BATCH = 5000


def pipeline(source: MemorySource, workdir: Path) -> Pipeline:
    config = parse_config(
        {
            "files": {"decisions": "unused", "topic": "t"},
            "outputs": {"alerts_file": "a", "dead_letter_file": "d"},
            "rules": [
                {
                    "name": "compas-fairness",
                    "kind": "ior",
                    "topic": "t",
                    "model": "compas",
                    "metric": "linf",
                    "eps": 0.04,
                    "backend": "auto",
                }
            ],
        }
    )
    settings = PipelineSettings("dead", max_batch=MAX_BATCH, snapshot_every_events=10**9)
    return Pipeline(
        [IorRule(config.rules[0])], source, MemorySink(), FileStore(workdir), Metrics(), settings
    )


async def drain(values: list[bytes], profile: cProfile.Profile | None = None) -> float:
    """CPU seconds of one drain of ``values``."""
    with tempfile.TemporaryDirectory() as tmp:
        source = MemorySource("t", values)
        daemon = pipeline(source, Path(tmp))
        await source.start(daemon.on_assign, daemon.on_revoke)
        started = time.process_time()
        if profile:
            profile.enable()
        await daemon.run(asyncio.Event(), until_idle=True)
        if profile:
            profile.disable()
        return time.process_time() - started


async def steady(values: list[bytes], n: int, seed: int = 0) -> list[tuple[float, int]]:
    """(seconds, history size after it) of each small batch after draining ``n``."""
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        source = MemorySource("t", values[:n])
        daemon = pipeline(source, Path(tmp))
        await source.start(daemon.on_assign, daemon.on_revoke)
        await daemon.run(asyncio.Event(), until_idle=True)
        times, offset = [], n
        while offset < len(values):
            size = min(int(rng.integers(50, 201)), len(values) - offset)
            records = [Record("t", 0, i, values[i]) for i in range(offset, offset + size)]
            started = time.perf_counter()
            await daemon.process(records)
            times.append((time.perf_counter() - started, offset + size))
            offset += size
        return times


async def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=150_000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steady", type=int, default=40_000)
    p.add_argument("--profile", type=int, default=0, metavar="K")
    p.add_argument("--glibc-defaults", action="store_true", help="leave malloc's thresholds")
    args = p.parse_args()
    configure_logging("warning")
    tuned = not args.glibc_defaults and keep_freed_memory()
    collect_between_batches()
    x, y, name = stream(args.n + args.steady)
    values = events(x, y)
    print(
        f"stream: {name}; rule: i.o.r. linf eps 0.04 auto; max_batch {MAX_BATCH}; "
        f"allocator thresholds {'set' if tuned else 'glibc defaults'}"
    )
    runs = [await drain(values[: args.n]) for _ in range(args.repeats)]
    per = [1e6 * t / args.n for t in runs]
    print(
        f"drain of {args.n} decisions: {min(per):.2f} us CPU per decision best, "
        f"{statistics.median(per):.2f} median ({', '.join(f'{v:.2f}' for v in per)})"
    )
    if args.steady:
        times = await steady(values, args.n)
        slow = sorted(times, reverse=True)[:5]
        print(
            f"steady, {args.steady} decisions in {len(times)} batches of 50-200: median batch "
            f"{1e3 * statistics.median(t for t, _ in times):.1f} ms; slowest: "
            + ", ".join(f"{1e3 * t:.1f} ms (at {size})" for t, size in slow)
        )
    if args.profile:
        profile = cProfile.Profile()
        await drain(values[: args.n], profile)
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
