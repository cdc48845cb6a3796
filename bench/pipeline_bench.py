"""End-to-end daemon throughput and latency through a real Kafka broker.

    bash ops/kafka/dev-kafka.sh start
    python bench/pipeline_bench.py [--bootstrap 127.0.0.1:9092] [--n 200000] [--rate 10000]
        [--repeats 3]

For each delivery mode (at-least-once, exactly-once; with ``:loop``, the decode worker off,
so that the loop reads every event: the baseline of daemon/decoding.py), in one run:
1. throughput: N decisions are produced first; a fresh `vigil run` subprocess then drains
   them; decisions per second = N / (time of the last check - time of the first check),
   read from the daemon's own `vigil_events_total` counter; over the same interval, the
   daemon's CPU time per decision (user + system, from /proc, of the daemon and its child
   processes: the decode worker's time counts), the garbage collections it ran
   (`python_gc_collections_total`) and the time its loop waited for deliveries to be
   acknowledged (`vigil_delivery_wait_seconds_total`) and for the decode worker's reading
   (`vigil_decode_wait_seconds_total`), per decision: waits the machine's
   speed moves less than the rate;
2. latency: with the daemon caught up, decisions are produced at ``--rate`` per second and
   every alert's arrival (read_committed, timed in a process of its own) is matched with
   its decision's send time: p50/p99. First, the same decisions at the same rate into a
   topic of their own, timed to their arrival there ("broker alone"): the round trip the
   broker and the clients take without the daemon, measured in the same run. A decision's
   alert makes two such trips.
The daemon's peak resident memory (VmHWM) is reported after each mode, and its child
processes' (the decode worker) beside it. The machine's speed is printed before and after
(``streams.machine_reference``): read the rates beside it. The stream is
adult-base-P1 from ../shared/data when present (repeated to reach N), else a synthetic
stream of the same shape (30 features, 26 binary).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import multiprocessing
import os
import re
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from streams import CERTIFAIR_ZIP, certifair, machine_reference  # noqa: E402

from tests.daemon_harness import Daemon, create_topic, metric_samples, wait_http  # noqa: E402


def stream(n: int) -> tuple[np.ndarray, np.ndarray, str]:
    if CERTIFAIR_ZIP.exists():
        x, y = certifair("adult-base-P1")
        name = "adult-base-P1"
    else:
        rng = np.random.default_rng(0)
        x = np.hstack(
            [
                rng.integers(0, 60, size=(46_033, 4)) / 60,
                rng.integers(0, 2, size=(46_033, 26)).astype(float),
            ]
        )
        y = rng.integers(0, 2, size=46_033)
        name = "synthetic adult-shaped"
    reps = -(-n // len(x))
    if reps > 1:  # later repetitions are shifted so they are new decisions, not duplicates
        x = np.vstack([x + 0.5 * r for r in range(reps)])
        y = np.tile(y, reps)
    return x[:n], y[:n], name


def events(x: np.ndarray, y: np.ndarray, start: int = 0) -> list[bytes]:
    return [
        orjson.dumps({"id": start + i, "model": "compas", "x": x[i].tolist(), "y": int(y[i])})
        for i in range(len(x))
    ]


async def produce_all(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=1 << 20)
    await producer.start()
    try:
        for v in values:
            await producer.send(topic, v, key=b"compas")
        await producer.flush()
    finally:
        await producer.stop()


async def checked(port: int) -> tuple[float, float, float, float]:
    """(decisions checked, garbage collections run, seconds waited for deliveries, seconds
    waited for the decode worker) so far, from the daemon's metrics."""
    samples = metric_samples(await wait_http(port, "/metrics"))
    done = sum(
        s.value
        for s in samples
        if s.name == "vigil_events_total"
        and s.labels == {"outcome": "checked", "rule": "compas-fairness"}
    )
    collections = sum(s.value for s in samples if s.name == "python_gc_collections_total")
    waited = sum(s.value for s in samples if s.name == "vigil_delivery_wait_seconds_total")
    read = sum(s.value for s in samples if s.name == "vigil_decode_wait_seconds_total")
    return done, collections, waited, read


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time so far of process ``pid`` and of its live descendants."""
    total = 0
    for p in [pid, *descendants(pid)]:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # ended meanwhile
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def descendants(pid: int) -> list[int]:
    try:
        children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []
    return [p for c in children for p in (c, *descendants(c))]


async def drain_rate(port: int, pid: int, n: int) -> dict:
    """From the first to the n-th checked decision (daemon metrics): decisions per second,
    the daemon's CPU microseconds per decision, its garbage collections and its loop's
    microseconds of waiting for deliveries and for the decode worker per decision."""
    first = None
    while True:
        done, collections, waited, read = await checked(port)
        now, cpu = time.perf_counter(), cpu_seconds(pid)
        if done and first is None:
            first = (now, done, cpu, collections, waited, read)
        if done >= n:
            break
        await asyncio.sleep(poll_interval(first, now, done, n))
    if now <= first[0]:
        nan = float("nan")
        return {
            "per_second": nan,
            "cpu_us": nan,
            "collections": 0,
            "wait_us": nan,
            "read_wait_us": nan,
        }
    return {
        "per_second": (n - first[1]) / (now - first[0]),
        "cpu_us": 1e6 * (cpu - first[2]) / (n - first[1]),
        "collections": collections - first[3],
        "wait_us": 1e6 * (waited - first[4]) / (n - first[1]),
        "read_wait_us": 1e6 * (read - first[5]) / (n - first[1]),
    }


def poll_interval(first: tuple | None, now: float, done: float, n: int) -> float:
    """Half the time the drain's rate so far says is left, within 5-250 ms: the daemon
    renders its metrics for each poll (about 1 ms of its CPU; every 50 ms, that was 3% of
    its samples), and the end is still seen within a few milliseconds."""
    if first is None or done <= first[1]:
        return 0.02
    left = (n - done) * (now - first[0]) / (done - first[1])
    return min(0.25, max(0.005, left / 2))


def peak_rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024


def children_peak_rss_mib(pid: int) -> float:
    return sum(peak_rss_mib(p) for p in descendants(pid))


async def run_mode(args, mode: str, x, y) -> dict:
    delivery, _, where = mode.partition(":")
    with tempfile.TemporaryDirectory() as tmp:
        daemon = Daemon(
            args.bootstrap,
            Path(tmp),
            exactly_once=delivery == "exactly-once",
            snapshot_every_events=10**9,
            kafka_settings="decode_worker = false" if where == "loop" else "",
        )
        n = len(x)
        await produce_all(args.bootstrap, daemon.topic, events(x, y))
        daemon.start()
        try:
            drain = await drain_rate(daemon.port, daemon.proc.pid, n)
            latencies = await latency_phase(args, daemon, x, y)
            rss = peak_rss_mib(daemon.proc.pid)
            workers_rss = children_peak_rss_mib(daemon.proc.pid)
        finally:
            daemon.kill()
    return {
        "mode": mode,
        "decisions": n,
        **drain,
        "rss_mib": rss,
        "workers_rss_mib": workers_rss,
        **latencies,
    }


async def latency_phase(args, daemon: Daemon, x, y) -> dict:
    """Decisions at ``--rate`` into the daemon, each timed to its alert (read_committed)."""
    count = min(len(x), args.rate * args.latency_seconds)
    # a shifted copy of the stream's start: new decisions with the same witness structure
    values = events(x[:count] + 10.0, y[:count], start=10**9)
    return await round_trips(args, daemon.topic, values, daemon.alerts_topic, ALERT_ID)


async def broker_round_trip(args, x, y) -> dict:
    """The same decisions at the same rate into a topic of their own, each timed to its
    arrival there: what the broker and the Kafka clients alone take, the floor under the
    daemon's latency (which adds a second such trip, for its alert)."""
    topic = f"round-trip-{uuid.uuid4().hex[:8]}"
    await create_topic(args.bootstrap, topic)
    count = min(len(x), args.rate * args.latency_seconds)
    values = events(x[:count], y[:count], start=10**9)
    return await round_trips(args, topic, values, topic, DECISION_ID)


ALERT_ID = ("decision", "id")
DECISION_ID = ("id",)


async def round_trips(args, topic: str, values: list[bytes], read: str, ident: tuple) -> dict:
    """Send ``values`` to ``topic`` at ``--rate``; p50/p99 of the time from each send to
    the arrival on ``read`` of the record whose ``ident`` path names it."""
    spawn = multiprocessing.get_context("spawn")
    ready, stop = spawn.Event(), spawn.Event()
    received, sender = spawn.Pipe(duplex=False)
    timer = spawn.Process(
        target=time_arrivals, args=(args.bootstrap, read, ident, ready, stop, sender)
    )
    timer.start()
    while not ready.wait(0):
        await asyncio.sleep(0.05)
    producer = AIOKafkaProducer(bootstrap_servers=args.bootstrap, linger_ms=1)
    await producer.start()
    sent: dict[int, float] = {}
    gc.disable()  # the producing loop's own pauses would be counted as latency
    try:
        start = time.monotonic()
        for i, v in enumerate(values):
            delay = start + i / args.rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await producer.send(topic, v, key=b"compas")
            sent[10**9 + i] = time.monotonic()
        await producer.flush()
    finally:
        gc.enable()
        await producer.stop()
    await asyncio.sleep(3)
    stop.set()
    arrivals = await asyncio.to_thread(received.recv)
    timer.join()
    latencies = [at - sent[i] for i, at in arrivals if i in sent]
    if not latencies:
        return {"alerts_timed": 0, "p50_ms": float("nan"), "p99_ms": float("nan")}
    q = statistics.quantiles(latencies, n=100)
    return {"alerts_timed": len(latencies), "p50_ms": 1e3 * q[49], "p99_ms": 1e3 * q[98]}


def time_arrivals(bootstrap: str, topic: str, ident: tuple, ready, stop, out) -> None:
    """In a process of its own (so that producing does not delay the clock on arrivals):
    (id, monotonic time) of every record read (read_committed) until ``stop``, its id at
    the JSON path ``ident``."""

    def named(value: bytes) -> int:
        item = orjson.loads(value)
        for key in ident:
            item = item[key]
        return item

    async def collect() -> list[tuple[int, float]]:
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            isolation_level="read_committed",
            auto_offset_reset="latest",
        )
        await consumer.start()
        arrivals = []
        try:
            await consumer.getmany(timeout_ms=500)
            ready.set()
            while not stop.is_set():
                batches = await consumer.getmany(timeout_ms=100)
                now = time.monotonic()
                for records in batches.values():
                    arrivals += [(named(r.value), now) for r in records]
        finally:
            await consumer.stop()
        return arrivals

    out.send(asyncio.run(collect()))


async def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--bootstrap", default="127.0.0.1:9092")
    p.add_argument(
        "--n",
        type=int,
        default=200_000,
        help="decisions drained (the adult stream repeated, shifted): 40 full batches, so that "
        "one slow batch or a poll's timing moves the rate by a few per cent, not tens",
    )
    p.add_argument("--rate", type=int, default=10_000, help="decisions/s in the latency phase")
    p.add_argument("--latency-seconds", type=int, default=4)
    p.add_argument(
        "--modes",
        default="at-least-once,exactly-once,at-least-once:loop",
        help="comma-separated, the first the reference of the ratios; ':loop' reads every "
        "event in the loop (decode worker off)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs of every mode, the order rotated each time (this machine's speed drifts "
        "over minutes): medians and each repeat's ratios to the first mode are printed",
    )
    args = p.parse_args()
    x, y, name = stream(args.n)
    modes = args.modes.split(",")
    print(
        f"stream: {name}, {len(x)} decisions, {x.shape[1]} features; rule: i.o.r. linf "
        f"eps 0.04 auto; latency phase {args.rate}/s for {args.latency_seconds} s"
    )
    print(f"machine reference before: {machine_reference():.2f} us CPU a decision", flush=True)
    print(
        f"{'mode':<20}{'decisions/s':>12}{'CPU us/dec':>11}{'wait us/dec':>12}"
        f"{'worker us/dec':>14}{'GCs':>6}"
        f"{'p50 ms':>9}{'p99 ms':>9}{'alerts timed':>14}{'peak RSS MiB':>14}{'worker MiB':>12}"
    )
    floor = await broker_round_trip(args, x, y)
    print(
        f"{'broker alone':<20}{'':>12}{'':>11}{'':>12}{'':>14}{'':>6}{floor['p50_ms']:>9.1f}"
        f"{floor['p99_ms']:>9.1f}"
        f"{floor['alerts_timed']:>14}{'':>14}"
    )
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for repeat in range(args.repeats):
        for mode in modes[repeat % len(modes) :] + modes[: repeat % len(modes)]:
            r = await run_mode(args, mode, x, y)
            runs[mode].append(r)
            print(
                f"{r['mode']:<20}{r['per_second']:>12.0f}{r['cpu_us']:>11.1f}{r['wait_us']:>12.2f}"
                f"{r['read_wait_us']:>14.2f}"
                f"{r['collections']:>6.0f}{r['p50_ms']:>9.1f}{r['p99_ms']:>9.1f}"
                f"{r['alerts_timed']:>14}{r['rss_mib']:>14.0f}{r['workers_rss_mib']:>12.0f}",
                flush=True,
            )
    if args.repeats > 1:
        summarize(runs, modes)
    print(f"machine reference after: {machine_reference():.2f} us CPU a decision")
    return 0


def summarize(runs: dict[str, list[dict]], modes: list[str]) -> None:
    """Each mode's medians over the repeats, and its decisions/s as a ratio of the first
    mode's in the same repeat (runs minutes apart compare poorly on a drifting machine)."""
    print(f"medians over {len(runs[modes[0]])} repeats:")
    for mode in modes:
        rs = runs[mode]
        keys = ("per_second", "cpu_us", "wait_us", "read_wait_us", "p99_ms")
        med = {k: statistics.median(r[k] for r in rs) for k in keys}
        line = (
            f"  {mode:<20}{med['per_second']:>10.0f}/s{med['cpu_us']:>7.1f} us/dec"
            f" (waiting {med['wait_us']:.2f}, for the worker {med['read_wait_us']:.2f})"
            f"  p99 {med['p99_ms']:.1f} ms (max {max(r['p99_ms'] for r in rs):.1f})"
        )
        if mode != modes[0]:
            base = runs[modes[0]]
            ratios = [r["per_second"] / b["per_second"] for r, b in zip(rs, base, strict=True)]
            line += f"  /{modes[0]}: median {statistics.median(ratios):.2f}, each " + " ".join(
                f"{q:.2f}" for q in ratios
            )
        print(line)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
