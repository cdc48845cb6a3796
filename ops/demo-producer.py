#!/usr/bin/env python3
"""Produce the bundled COMPAS demo stream to Kafka as decision events.

    .venv/bin/python ops/demo-producer.py                      # 127.0.0.1:9092, as fast as it can
    .venv/bin/python ops/demo-producer.py --rate 50            # 50 decisions per second
    .venv/bin/python ops/demo-producer.py --events vigil-demo/decisions.jsonl

Each message is one decision event, {"id", "model", "x", "y"}
(connectors/schemas/decision.json), keyed by its model so that a model's decisions stay in
one partition, in order. By default the events are the bundled stream
(daemon/data/compas-stream.csv, 5278 decisions of the model "compas"), converted exactly
as `vigil demo` does; `--events` sends a JSON-lines file of decision events instead (such as
the decisions.jsonl that `vigil demo` writes into its workdir), line by line, unchanged.

The script waits up to `--wait` seconds for the broker to answer, sends every event with
acks=all, and exits 0 once all are acknowledged (1 if the broker cannot be reached, 2 on a
bad events file). It runs with the Vigil package installed (it uses the package's
conversion and aiokafka), e.g. from the repository's .venv or in the image that
the root Dockerfile builds.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError

from vigil.daemon.demo import bundled_stream, write_decision_events


def load_events(path: Path) -> list[tuple[bytes, bytes]]:
    """(key, value) per line of a JSON-lines file of decision events; the key is the model."""
    out = []
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            line = line.strip()
            if not line:
                continue
            try:
                event = orjson.loads(line)
            except orjson.JSONDecodeError as e:
                raise ValueError(f"{path}:{number}: not JSON: {e}") from None
            if not isinstance(event, dict) or not isinstance(event.get("model"), str):
                raise ValueError(f"{path}:{number}: a decision event needs a string 'model'")
            out.append((event["model"].encode(), line))
    return out


def bundled_events(model: str) -> list[tuple[bytes, bytes]]:
    """The bundled COMPAS stream as decision events of ``model``."""
    stream = bundled_stream()
    with tempfile.TemporaryDirectory(prefix="vigil-demo-producer-") as tmp:
        out = Path(tmp) / "decisions.jsonl"
        write_decision_events(stream, out, model)
        return load_events(out)


async def connect(bootstrap: str, wait_seconds: float) -> AIOKafkaProducer:
    """A started producer; retries until the broker answers or ``wait_seconds`` pass."""
    deadline = time.monotonic() + wait_seconds
    while True:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            client_id="vigil-demo-producer",
            acks="all",
            enable_idempotence=True,
            linger_ms=5,
        )
        try:
            await producer.start()
            return producer
        except KafkaConnectionError as e:
            await producer.stop()
            if time.monotonic() >= deadline:
                raise ConnectionError(
                    f"cannot reach the Kafka broker at {bootstrap} after {wait_seconds:g} s: {e}"
                ) from None
            print(f"demo-producer: waiting for {bootstrap} ...", file=sys.stderr)
            await asyncio.sleep(1.0)


async def produce(
    events: list[tuple[bytes, bytes]], bootstrap: str, topic: str, rate: float, wait: float
) -> float:
    """Send ``events`` in order, at most ``rate`` per second (0: unpaced); seconds taken."""
    producer = await connect(bootstrap, wait)
    started = time.monotonic()
    try:
        pending = []
        for i, (key, value) in enumerate(events):
            if rate > 0:
                ahead = started + i / rate - time.monotonic()
                if ahead > 0:
                    await asyncio.sleep(ahead)
            pending.append(await producer.send(topic, value, key=key))
            if len(pending) >= 1000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return time.monotonic() - started


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Produce the bundled COMPAS demo stream (or a JSON-lines file of decision "
        "events) to a Kafka topic, keyed by model."
    )
    parser.add_argument(
        "--bootstrap", default="127.0.0.1:9092", help="Kafka bootstrap servers (host:port,...)"
    )
    parser.add_argument(
        "--topic",
        default="vigil.demo.decisions",
        help="decisions topic (default: the one ops/examples/dev-kafka.toml reads)",
    )
    parser.add_argument(
        "--rate", type=float, default=0.0, help="decisions per second; 0 sends them unpaced"
    )
    parser.add_argument(
        "--events", type=Path, help="JSON-lines decision events to send instead of the stream"
    )
    parser.add_argument(
        "--model", default="compas", help="model name of the bundled stream's decisions"
    )
    parser.add_argument(
        "--wait", type=float, default=60.0, help="seconds to wait for the broker to answer"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.rate < 0 or args.wait < 0:
        parser.error("--rate and --wait must be >= 0")
    try:
        events = load_events(args.events) if args.events else bundled_events(args.model)
    except (OSError, ValueError) as e:
        print(f"demo-producer: error: {e}", file=sys.stderr)
        return 2
    try:
        seconds = asyncio.run(produce(events, args.bootstrap, args.topic, args.rate, args.wait))
    except ConnectionError as e:
        print(f"demo-producer: error: {e}", file=sys.stderr)
        return 1
    print(
        f"demo-producer: {len(events)} decision events to {args.topic} on {args.bootstrap} "
        f"in {seconds:.1f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
