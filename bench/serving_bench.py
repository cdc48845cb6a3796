"""Daemon throughput on a serving stack's own traffic beside Vigil JSON, in one run.

    bash ops/kafka/dev-kafka.sh start
    python bench/serving_bench.py [--bootstrap 127.0.0.1:9092] [--n 100000] [--repeats 3]

The same N decisions are produced first, as
- Vigil JSON decision events (one record each), checked by an i.o.r. rule;
- Seldon Core 2 model traffic, requests of 1 row and of 32 rows (``ModelInferRequest`` with
  raw FP64 contents, ``ModelInferResponse`` with INT64 labels, keyed as the gateway keys
  them), checked by an i.o.r. rule with ``format = "seldon"`` (forward, then join and check);
then a fresh exactly-once `vigil run` drains them. Decisions per second = N / (time of the
rule's N-th check - time the daemon first moved: its first forward or check), from its own
metrics; CPU microseconds per decision of the whole daemon over the same interval. Medians
over ``--repeats`` runs, the formats alternating; "paired" is the median over repeats of a
format's rate over the Vigil JSON rate of the same repeat. The machine's speed is printed
before and after (``streams.machine_reference``).
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
from pipeline_bench import cpu_seconds, events, poll_interval, produce_all, stream  # noqa: E402
from streams import machine_reference  # noqa: E402

from tests.daemon_harness import Daemon, create_topic, metric_samples, wait_http  # noqa: E402
from tests.test_serving_kafka import request_bytes, response_bytes  # noqa: E402

RULE = """
[[rules]]
name = "served"
kind = "ior"
format = "seldon"
seldon_namespace = "{tag}"
model = "compas"
metric = "linf"
eps = 0.04
"""


async def produce_seldon(bootstrap: str, tag: str, x: np.ndarray, y: np.ndarray, rows: int):
    inputs = f"seldon.{tag}.model.compas.inputs"
    outputs = f"seldon.{tag}.model.compas.outputs"
    for topic in (inputs, outputs):
        await create_topic(bootstrap, topic)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=1 << 20)
    await producer.start()
    try:
        for i, start in enumerate(range(0, len(x), rows)):
            part = slice(start, start + rows)
            key = f"0.compas.r{i}".encode()
            await producer.send(inputs, request_bytes(x[part]), key=key, partition=0)
            await producer.send(outputs, response_bytes(y[part]), key=key, partition=0)
        await producer.flush()
    finally:
        await producer.stop()


async def counts(port: int, rule: str) -> tuple[float, float]:
    """(decisions the rule checked, records any rule of the daemon handled)."""
    samples = metric_samples(await wait_http(port, "/metrics"))
    checked = [s for s in samples if s.name == "vigil_events_total"]
    mine = sum(s.value for s in checked if s.labels == {"outcome": "checked", "rule": rule})
    moved = sum(s.value for s in checked if s.labels.get("outcome") == "checked")
    return mine, moved


async def drain(port: int, pid: int, rule: str, n: int) -> tuple[float, float]:
    """Decisions per second and CPU microseconds per decision, first move to n-th check,
    polled as bench/pipeline_bench.py polls (each poll renders the daemon's metrics, which
    costs it CPU in proportion to its series: a serving rule has two stages' worth)."""
    first = None
    while True:
        mine, moved = await counts(port, rule)
        now, cpu = time.perf_counter(), cpu_seconds(pid)
        if moved and first is None:
            first = (now, cpu)
        if mine >= n:
            return n / (now - first[0]), 1e6 * (cpu - first[1]) / n
        await asyncio.sleep(0.005 if first is None else poll_interval((first[0], 0), now, mine, n))


async def run(args, fmt: str, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        loop = "decode_worker = false" if fmt == "vigil:loop" else ""
        daemon = Daemon(args.bootstrap, Path(tmp), snapshot_every_events=10**9, kafka_settings=loop)
        if fmt.startswith("vigil"):
            rule = "compas-fairness"
            await produce_all(args.bootstrap, daemon.topic, events(x, y))
        else:
            rule = "served"
            daemon.extra_rules = RULE
            await produce_seldon(args.bootstrap, daemon.tag, x, y, int(fmt.split(":")[1]))
        daemon.start()
        try:
            return await drain(daemon.port, daemon.proc.pid, rule, len(x))
        finally:
            daemon.kill()


async def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--bootstrap", default="127.0.0.1:9092")
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--formats",
        default="vigil,seldon:1,seldon:32",
        help="comma-separated: vigil, vigil:loop (the decode worker off), seldon:<rows per "
        "request> (default: %(default)s)",
    )
    args = p.parse_args()
    x, y, name = stream(args.n)
    formats = args.formats.split(",")
    if "vigil" not in formats:
        p.error("--formats must include vigil, the baseline")
    print(f"stream: {name}, {len(x)} decisions, {x.shape[1]} features; exactly-once")
    print(f"machine reference before: {machine_reference():.2f} us CPU a decision", flush=True)
    results: dict[str, list[tuple[float, float]]] = {f: [] for f in formats}
    for r in range(args.repeats):
        for fmt in formats:
            results[fmt].append(await run(args, fmt, x, y))
            rate, cpu = results[fmt][-1]
            print(f"  run {r + 1} {fmt:<10} {rate:>9.0f} decisions/s {cpu:>7.1f} CPU us/dec")
    print(f"{'format':<12}{'decisions/s':>12}{'CPU us/dec':>12}{'vs vigil':>10}{'paired':>8}")
    base = statistics.median(rate for rate, _ in results["vigil"])
    for fmt in formats:
        rate = statistics.median(r for r, _ in results[fmt])
        cpu = statistics.median(c for _, c in results[fmt])
        # each run against the Vigil JSON run of its repeat: the machine's speed drifts
        # between repeats more than it does within one
        paired = statistics.median(
            r / v for (r, _), (v, _) in zip(results[fmt], results["vigil"], strict=True)
        )
        print(f"{fmt:<12}{rate:>12.0f}{cpu:>12.1f}{rate / base:>10.2f}{paired:>8.2f}")
    print(f"machine reference after: {machine_reference():.2f} us CPU a decision")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
