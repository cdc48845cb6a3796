"""The serving join's own cost per request-response pair, without a broker: one-row Seldon
Core 2 traffic packed into join-topic records as the forward stage packs them, paired and
checked by a fresh i.o.r. rule's join stage in this process.

    python bench/serving_join.py [--n 20000] [--repeats 5] [--headers]

Prints CPU microseconds per pair of ``ServingJoin.handle`` (unpacking, reading the two
messages, pairing, the decision) and of the check of the pairs' decisions (1,000 at a
time), best and median over the repeats. ``--headers`` gives every record the headers
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
from vigil.daemon.adapters.serving import ServingJoin, serving_rules
from vigil.daemon.config import parse_config
from vigil.daemon.forwarded import PACK_BYTES, PACK_HEADER, frame
from vigil.daemon.metrics import Metrics

JOIN = ("g.r.join", 0)


def packed(n: int, headers: bool) -> list[Record]:
    """``n`` one-row requests, each followed by its response, as join-topic records."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 6, size=(n, 30)) / 6
    y = rng.integers(0, 2, size=n)
    values, frames, size = [], [], 0
    for i in range(n):
        key = f"0.compas.r{i}".encode()
        extra = (("pipeline", b"compas"), ("x-request-id", f"r{i}".encode())) if headers else ()
        for offset, (topic, value) in enumerate(
            (("inputs", request_bytes(x[i : i + 1])), ("outputs", response_bytes(y[i : i + 1])))
        ):
            name = f"seldon.t.model.compas.{topic}"
            record = Record(name, 0, 2 * i + offset, value, key, extra, 1000 + 2 * i + offset)
            data = frame(record, name.encode())
            if frames and size + len(data) > PACK_BYTES:
                values.append(b"".join(frames))
                frames, size = [], 0
            frames.append(data)
            size += len(data)
    values.append(b"".join(frames))
    header = ((PACK_HEADER, b"1"),)
    return [Record(JOIN[0], 0, i, v, b"compas", header) for i, v in enumerate(values)]


def join_stage() -> ServingJoin:
    config = parse_config(
        {
            "kafka": {"bootstrap_servers": "127.0.0.1:9092", "group_id": "g"},
            "rules": [
                {"name": "r", "kind": "ior", "format": "seldon", "model": "compas"}
                | {"eps": 0.04, "metric": "linf"}
            ],
        }
    )
    context = RuleContext(Metrics(), None, lambda *a: None, dead_letter_topic="dead")
    rules = serving_rules(config.rules[0], config.seldon, "g", context)
    return next(r for r in rules if isinstance(r, ServingJoin))


async def once(records: list[Record]) -> tuple[float, float, int]:
    """CPU seconds of the join and of the check over the records, and the pairs made."""
    join = join_stage()
    started = time.process_time()
    batches = [(await join.handle(JOIN, [record], 0)).decisions for record in records]
    joined = time.process_time()
    for decisions in batches:
        for at in range(0, len(decisions), 1000):
            await join.check(JOIN, decisions[at : at + 1000], 0)
    return joined - started, time.process_time() - joined, sum(map(len, batches))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--headers", action="store_true")
    args = parser.parse_args()
    records = packed(args.n, args.headers)
    join, check = [], []
    for _ in range(args.repeats):
        joined, checked, pairs = asyncio.run(once(records))
        if pairs != args.n:
            print(f"paired {pairs} of {args.n}", file=sys.stderr)
            return 1
        join.append(1e6 * joined / pairs)
        check.append(1e6 * checked / pairs)
    print(f"{args.n} one-row pairs in {len(records)} join-topic records, headers: {args.headers}")
    for name, runs in (("join", join), ("check", check)):
        print(f"{name:6} {min(runs):6.2f} us per pair best, {statistics.median(runs):6.2f} median")
    return 0


if __name__ == "__main__":
    sys.exit(main())
