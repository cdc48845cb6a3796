"""Catching up on a serving stack's backlog: an hour of one-row Seldon Core 2 traffic already
in its topics when a fresh exactly-once `vigil run` starts.

    bash ops/kafka/dev-kafka.sh start
    python bench/serving_backlog.py [--bootstrap 127.0.0.1:9092] [--n 45222] [--repeats 3]

N requests spread over an hour of CreateTime, each answered 5-60 ms later, one partition
per topic (Seldon's default), written in one of two layouts: every request before every
response, or the reverse. The daemon then joins and checks them; catch-up rate = N / (time
of the N-th check - time the daemon first moved), from its own metrics, and its CPU
microseconds per row over the same interval; medians over ``--repeats``. Each run also
reports the rows checked and the `unmatched` dead letters, which must be N and 0: the
forward stage merges the two topics in time, so no request expires for being read early.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from aiokafka import AIOKafkaProducer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from pipeline_bench import cpu_seconds, stream  # noqa: E402
from serving_bench import RULE, counts  # noqa: E402

from tests.daemon_harness import Daemon, create_topic, metric_samples, wait_http  # noqa: E402
from tests.test_serving_kafka import request_bytes, response_bytes  # noqa: E402

HOUR_MS = 3_600_000
LAYOUTS = ("requests-first", "responses-first")


async def produce_backlog(bootstrap: str, tag: str, x, y, layout: str, seed: int) -> None:
    inputs = f"seldon.{tag}.model.compas.inputs"
    outputs = f"seldon.{tag}.model.compas.outputs"
    for topic in (inputs, outputs):
        await create_topic(bootstrap, topic)
    rng = np.random.default_rng(seed)
    start = int(time.time() * 1000) - 2 * HOUR_MS
    asked = start + np.sort(rng.integers(0, HOUR_MS, size=len(x)))
    answered = asked + rng.integers(5, 61, size=len(x))
    sides = [(inputs, asked, request_bytes, x), (outputs, answered, response_bytes, y)]
    if layout == "responses-first":
        sides.reverse()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=1 << 20)
    await producer.start()
    try:
        for topic, times, encode, values in sides:
            for i in range(len(x)):
                key = f"0.compas.r{i}".encode()
                value = encode(values[i : i + 1])
                await producer.send(topic, value, key=key, partition=0, timestamp_ms=int(times[i]))
        await producer.flush()
    finally:
        await producer.stop()


async def catch_up(port: int, pid: int, n: int) -> tuple[float, float, float, float]:
    """(rows/s, CPU us/row, rows checked, unmatched dead letters) once n rows are checked
    (or nothing moved for 30 s)."""
    first = None
    last_move, seen = time.monotonic(), -1.0
    while True:
        mine, moved = await counts(port, "served")
        now, cpu = time.perf_counter(), cpu_seconds(pid)
        if moved and first is None:
            first = (now, cpu)
        if moved != seen:
            seen, last_move = moved, time.monotonic()
        if mine >= n or time.monotonic() - last_move > 30:
            break
        await asyncio.sleep(0.05)
    samples = metric_samples(await wait_http(port, "/metrics"))
    unmatched = sum(s.value for s in samples if s.name == "vigil_serving_unmatched_total")
    elapsed = now - first[0]
    return mine / elapsed, 1e6 * (cpu - first[1]) / max(mine, 1), mine, unmatched


async def run(args, layout: str, x, y, seed: int) -> tuple[float, float, float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        daemon = Daemon(args.bootstrap, Path(tmp), snapshot_every_events=10**9)
        daemon.extra_rules = RULE
        await produce_backlog(args.bootstrap, daemon.tag, x, y, layout, seed)
        daemon.start()
        try:
            return await catch_up(daemon.port, daemon.proc.pid, len(x))
        finally:
            daemon.kill()


async def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--bootstrap", default="127.0.0.1:9092")
    p.add_argument("--n", type=int, default=45_222)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    x, y, name = stream(args.n)
    print(f"stream: {name}, {len(x)} one-row requests over an hour, {x.shape[1]} features")
    results: dict[str, list[tuple[float, float, float, float]]] = {k: [] for k in LAYOUTS}
    for r in range(args.repeats):
        for layout in LAYOUTS:
            results[layout].append(got := await run(args, layout, x, y, seed=r))
            rate, cpu, rows, unmatched = got
            print(
                f"  run {r + 1} {layout:<16} {rate:>8.0f} rows/s {cpu:>7.1f} CPU us/row "
                f"{rows:>8.0f} checked {unmatched:>5.0f} unmatched"
            )
    print(f"{'layout':<18}{'rows/s':>10}{'CPU us/row':>12}{'s per 1M':>10}{'all joined':>12}")
    for layout in LAYOUTS:
        rate = statistics.median(g[0] for g in results[layout])
        cpu = statistics.median(g[1] for g in results[layout])
        whole = all(g[2] == len(x) and g[3] == 0 for g in results[layout])
        print(f"{layout:<18}{rate:>10.0f}{cpu:>12.1f}{1e6 / rate:>10.0f}{whole!s:>12}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
