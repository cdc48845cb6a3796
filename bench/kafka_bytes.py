"""What a record costs the Kafka client (aiokafka) by its size: CPU microseconds per record
produced and per record consumed, for values of 100 B (the baseline), 600 B (a Vigil JSON
decision of 30 features) and 8 KB (a Seldon request of 32 such rows), in one run.

    bash ops/kafka/dev-kafka.sh start
    python bench/kafka_bytes.py [--bootstrap 127.0.0.1:9092] [--records 20000] [--repeats 3]

Why it matters: every stage a serving-stack rule's rows pass through is one produce and one
consume of their bytes (docs/architecture.md). The process uses the daemon's allocator
settings (daemon/malloc.py). Medians over ``--repeats``.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import time
import uuid

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from vigil.connectors.kafka import BATCH_BYTES
from vigil.daemon.malloc import keep_freed_memory

SIZES = (100, 600, 8000)


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def produce(bootstrap: str, topic: str, size: int, records: int) -> float:
    """CPU microseconds per record to produce ``records`` values of ``size`` bytes."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_batch_size=BATCH_BYTES)
    await producer.start()
    try:
        value = bytes(size)
        started = cpu()
        sent = [
            await producer.send(topic, value, key=b"k%d" % i, partition=0) for i in range(records)
        ]
        await asyncio.gather(*sent)
        return 1e6 * (cpu() - started) / records
    finally:
        await producer.stop()


async def consume(bootstrap: str, topic: str, records: int) -> float:
    """CPU microseconds per record to read ``records`` records, from the first fetch."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_partition_fetch_bytes=16 << 20,
    )
    await consumer.start()
    try:
        got, started = 0, None
        deadline = time.monotonic() + 120
        while got < records and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=1000, max_records=5000)
            if started is None and batch:
                started = cpu()
            got += sum(map(len, batch.values()))
        if got < records:
            raise SystemExit(f"{topic}: read {got} of {records} records")
        return 1e6 * (cpu() - started) / records
    finally:
        await consumer.stop()


async def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--bootstrap", default="127.0.0.1:9092")
    p.add_argument("--records", type=int, default=20_000)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    keep_freed_memory()
    runs: dict[int, list[tuple[float, float]]] = {size: [] for size in SIZES}
    for _ in range(args.repeats):
        for size in SIZES:
            topic = f"bench-bytes-{uuid.uuid4().hex[:8]}"
            made = await produce(args.bootstrap, topic, size, args.records)
            read = await consume(args.bootstrap, topic, args.records)
            runs[size].append((made, read))
    print(f"{args.records} records per run, medians of {args.repeats}")
    print(f"{'value':>8}{'produce us':>12}{'consume us':>12}{'ns/byte':>10}{'vs 100 B':>10}")
    base = statistics.median(a + b for a, b in runs[SIZES[0]])
    for size in SIZES:
        made = statistics.median(a for a, _ in runs[size])
        read = statistics.median(b for _, b in runs[size])
        extra = 1000 * (made + read - base) / (size - SIZES[0]) if size > SIZES[0] else 0.0
        print(f"{size:>7}B{made:>12.1f}{read:>12.1f}{extra:>10.2f}{(made + read) / base:>10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
