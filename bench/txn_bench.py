"""Exactly-once delivery: latency of back-to-back transactions through the real broker.

    bash ops/kafka/dev-kafka.sh start
    python bench/txn_bench.py [--bootstrap 127.0.0.1:9092] [--transactions 300] [--repeats 3]

The daemon's exactly-once sink (``KafkaSink`` with a transactional id) delivers one batch per
transaction and begins the next as soon as the previous one commits. Each run here does the
same with ``--transactions`` deliveries in a row to a new topic, alternating a batch without
alerts (offsets only) and a batch with 20 alerts, and times every ``deliver``. The baseline
is the sink with aiokafka's retry backoffs (100 ms, and 20 ms after a refusal for a
partition), then the 20 ms of session 14, and the candidate the sink as shipped; they
alternate within one run. Reported: median, p90, p99 and max delivery time
of each kind, and how many deliveries took over 90 ms (medians over the repeats).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.daemon_harness import create_topic  # noqa: E402
from vigil.connectors import kafka  # noqa: E402
from vigil.connectors.base import OutMessage  # noqa: E402

KINDS = ("offsets only", "20 alerts + offsets")


async def run(bootstrap: str, backoff_ms: int, transactions: int) -> dict[str, list[float]]:
    """Milliseconds of each delivery, by kind, with the sink's transactions retrying after
    ``backoff_ms``."""
    topic = f"txn-bench-{uuid.uuid4().hex[:8]}"
    await create_topic(bootstrap, topic)
    shipped, kafka.TRANSACTION_RETRY_BACKOFF_MS = kafka.TRANSACTION_RETRY_BACKOFF_MS, backoff_ms
    try:
        sink = kafka.KafkaSink(bootstrap, f"{topic}-group", transactional_id=topic)
    finally:
        kafka.TRANSACTION_RETRY_BACKOFF_MS = shipped
    await sink.start()
    alerts = [OutMessage(topic, b"m", b"x" * 400) for _ in range(20)]
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    try:
        for i in range(transactions):
            kind = KINDS[i % 2]
            started = time.perf_counter()
            await sink.deliver(alerts if i % 2 else [], {(topic, 0): i + 1})
            times[kind].append((time.perf_counter() - started) * 1000)
    finally:
        await sink.stop()
    return times


def summary(ms: list[float]) -> tuple[float, float, float, float, int]:
    q = statistics.quantiles(ms, n=100)
    return statistics.median(ms), q[89], q[98], max(ms), sum(m > 90 for m in ms)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--bootstrap", default="127.0.0.1:9092")
    p.add_argument("--transactions", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    shipped = kafka.TRANSACTION_RETRY_BACKOFF_MS
    variants = {
        "baseline: aiokafka's backoffs (100 ms; 20 ms for a partition)": 100,
        "session 14: 20 ms backoff": 20,
        f"vigil: {shipped} ms backoff": shipped,
    }
    rows: dict[tuple[str, str], list[tuple]] = {}
    for r in range(args.repeats):
        for name, backoff in variants.items():
            times = asyncio.run(run(args.bootstrap, backoff, args.transactions))
            for kind, ms in times.items():
                stats = summary(ms)
                rows.setdefault((name, kind), []).append(stats)
                print(
                    f"[run {r + 1}/{args.repeats}] {name}, {kind}: median {stats[0]:.1f} ms, "
                    f"p99 {stats[2]:.1f} ms, {stats[4]} over 90 ms",
                    file=sys.stderr,
                )
    print(f"{args.transactions} back-to-back deliveries per run, medians of {args.repeats} runs")
    print("| sink | batch | median ms | p90 ms | p99 ms | max ms | over 90 ms |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for (name, kind), stats in rows.items():
        med = [statistics.median(s[k] for s in stats) for k in range(5)]
        print(
            f"| {name} | {kind} | {med[0]:.1f} | {med[1]:.1f} | {med[2]:.1f} | "
            f"{med[3]:.1f} | {med[4]:.0f} of {args.transactions // 2} |"
        )


if __name__ == "__main__":
    main()
