"""The serving join's own cost per request-response pair, without a broker: one-row Seldon
Core 2 traffic packed into join-topic records by the rule's forward stage, then paired and
checked by a fresh join stage in this process, with the collector scheduled as `vigil run`
schedules it.

    python bench/serving_join.py [--n 20000] [--repeats 5] [--headers]

Prints CPU microseconds per pair of the forward stage (``ServingForward.handle`` and
``release``: the time-ordered merge, framing and packing, 2,500 records a partition at a
time), of ``ServingJoin.handle`` (unpacking, reading the two messages, pairing, the
decision) and of the check of the pairs' decisions (1,000 at a time), best and median over
the repeats. ``--headers`` gives every record the headers
Seldon's gateway writes (``pipeline``, ``x-request-id``). The rows are 30 features of six
levels, the labels 0 or 1.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.test_serving_kafka import request_bytes, response_bytes
from vigil.connectors.events import Record
from vigil.daemon.adapters.base import RuleContext
from vigil.daemon.adapters.serving import ServingForward, ServingJoin, serving_rules
from vigil.daemon.collector import collect_between_batches
from vigil.daemon.config import parse_config
from vigil.daemon.malloc import keep_freed_memory
from vigil.daemon.metrics import Metrics

PREFIX = "seldon.t.model.compas"  # the model's inputs and outputs topics, less the suffix
STEP = 2_500
"""Records of each partition the forward stage takes at a time."""


def stages() -> tuple[ServingForward, ServingJoin]:
    """The two stages of a fresh one-row Seldon i.o.r. rule."""
    config = parse_config(
        {
            "kafka": {"bootstrap_servers": "127.0.0.1:9092", "group_id": "g"},
            "rules": [
                {"name": "r", "kind": "ior", "format": "seldon", "seldon_namespace": "t"}
                | {"model": "compas", "eps": 0.04, "metric": "linf"}
            ],
        }
    )
    context = RuleContext(Metrics(), None, lambda *a: None, dead_letter_topic="dead")
    forward, join = serving_rules(config.rules[0], config.seldon, "g", context)
    assert isinstance(forward, ServingForward) and isinstance(join, ServingJoin)
    return forward, join


def traffic(n: int, headers: bool) -> dict[str, list[Record]]:
    """``n`` one-row requests and their responses (each 1 ms after its request), by side."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 6, size=(n, 30)) / 6
    y = rng.integers(0, 2, size=n)
    sides = {"inputs": [], "outputs": []}
    for i in range(n):
        key = f"0.compas.r{i}".encode()
        extra = (("pipeline", b"compas"), ("x-request-id", f"r{i}".encode())) if headers else ()
        for offset, (side, value) in enumerate(
            (("inputs", request_bytes(x[i : i + 1])), ("outputs", response_bytes(y[i : i + 1])))
        ):
            record = Record(f"{PREFIX}.{side}", 0, i, value, key, extra, 1000 + 2 * i + offset)
            sides[side].append(record)
    return sides


async def forwarded(sides: dict[str, list[Record]]) -> tuple[float, list[Record]]:
    """CPU seconds of a fresh forward stage over the traffic, taken ``STEP`` records a
    partition at a time and released after each step as `vigil run` does, and the
    join-topic records it writes."""
    forward, _ = stages()
    started = time.process_time()
    events = []
    for at in range(0, max(map(len, sides.values())), STEP):
        for side, records in sides.items():
            await forward.handle((f"{PREFIX}.{side}", 0), records[at : at + STEP], 0)
        events += forward.release(lambda tp: True).events
    events += forward.release(lambda tp: False).events
    took = time.process_time() - started
    messages = [answer.message for answer in events]
    return took, [Record(m.topic, 0, i, m.value, m.key, m.headers) for i, m in enumerate(messages)]


async def once(records: list[Record]) -> tuple[float, float, int]:
    """CPU seconds of the join and of the check over the records, and the pairs made."""
    _, join = stages()
    tp = (records[0].topic, 0)
    started = time.process_time()
    batches = [(await join.handle(tp, [record], 0)).decisions for record in records]
    joined = time.process_time()
    for decisions in batches:
        for at in range(0, len(decisions), 1000):
            await join.check(tp, decisions[at : at + 1000], 0)
    return joined - started, time.process_time() - joined, sum(map(len, batches))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--headers", action="store_true")
    args = parser.parse_args()
    sides = traffic(args.n, args.headers)
    keep_freed_memory()  # as `vigil run` sets the allocator
    collect_between_batches()  # and schedules the collector
    forward, join, check = [], [], []
    for _ in range(args.repeats):
        took, records = asyncio.run(forwarded(sides))
        forward.append(1e6 * took / args.n)
        joined, checked, pairs = asyncio.run(once(records))
        if pairs != args.n:
            print(f"paired {pairs} of {args.n}", file=sys.stderr)
            return 1
        join.append(1e6 * joined / pairs)
        check.append(1e6 * checked / pairs)
    print(f"{args.n} one-row pairs in {len(records)} join-topic records, headers: {args.headers}")
    for name, runs in (("forward", forward), ("join", join), ("check", check)):
        print(f"{name:8} {min(runs):6.2f} us per pair best, {statistics.median(runs):6.2f} median")
    return 0


if __name__ == "__main__":
    sys.exit(main())
