"""How the daemon scales: several `vigil run` instances in one consumer group.

    KAFKA_PORT=9892 KAFKA_CONTROLLER_PORT=9893 bash ops/kafka/dev-kafka.sh start
    python bench/scale_bench.py [--section instances|restore|snapshot|all]
        [--bootstrap 127.0.0.1:9892] [--n 200000] [--history 1000000] [--repeats 3]
        [--mode eos|alo|both]

Section ``instances``: 1 versus 2 instances in one consumer group. Each run writes N
decisions to a new topic with 4 partitions, decision i as model m(i mod 4) to partition
i mod 4, inside one open transaction, so they are in the log but invisible to the daemon
(read_committed); starts a fresh group of 1 or 2 daemons (one i.o.r. rule per model: linf,
eps 0.04, auto; 2 instances with their own client_id, hence transactional id, and state
dir), waits until they have split the partitions (``partition_assigned`` and
``partition_revoked`` lines of their JSON logs), then commits the transaction and times the
drain: from the commit to the sample at which all N are checked. Samples every 50 ms read
each daemon's ``vigil_events_total`` counters (/metrics) and the CPU time (user + system,
all threads) of each daemon process and of the broker's JVM from /proc/<pid>/stat.
Reported: decisions/s, daemon CPU microseconds per decision (what shows whether the work
splits without overhead when, as on a 2-core machine that also runs the broker, wall-clock
throughput cannot double), the broker's CPU over the same window, and each instance's
share; medians over the repeats with the 2-instance/1-instance ratios, then every run. The
stream is adult-base-P1 from ../shared/data when present (repeated with shifts to reach
N), else a synthetic stream of the same shape. The instances keep their state in the
Kafka store (``[state] store = "kafka"``), as a scaled-out group does.

Section ``restore``: one partition with ``--history`` decisions, all committed by a first
instance that snapshotted every 100,000; then new instances with empty state dirs are timed
from their start to /readyz: with the Kafka store (restores the snapshot, replays nothing)
and with the file store (nothing on disk: replays the whole partition), alternately.

Section ``snapshot`` (in process): an i.o.r. history grown to 100,000 and to ``--history``
decisions; after each further 100,000 decisions, the Kafka store's snapshot (a segment of
the new decisions, written and acknowledged) is timed against a whole snapshot as the file
store writes it. The segment's cost must not grow with the history.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from pipeline_bench import stream  # noqa: E402

from tests.daemon_harness import Daemon, create_topic, metric_samples, wait_http  # noqa: E402
from vigil.daemon.adapters import IorRule  # noqa: E402
from vigil.daemon.config import parse_config  # noqa: E402
from vigil.daemon.state import FileStore, KafkaStore  # noqa: E402
from vigil.rules.ior import Monitor, MonitorSpec  # noqa: E402

MODELS = 4
SAMPLE_SECONDS = 0.05
CLOCK_TICK = os.sysconf("SC_CLK_TCK")
MODES = {"eos": True, "alo": False}


@dataclass
class ScaleDaemon(Daemon):
    """A daemon reading a shared ``decisions`` topic with one i.o.r. rule per model m0..m3;
    ``tag`` names its group and output topics, ``client_id`` its transactional id."""

    decisions: str = ""
    state_settings: str = 'store = "kafka"'

    @property
    def topic(self) -> str:
        return self.decisions

    def rules_toml(self) -> str:
        return "".join(
            f"""
[[rules]]
name = "m{k}"
kind = "ior"
topic = "{self.decisions}"
model = "m{k}"
metric = "linf"
eps = {self.eps}
backend = "auto"
"""
            for k in range(MODELS)
        )

    def assignments(self) -> int:
        """How many partition assignments the log shows (4 in total when nothing moved)."""
        return self.log_text().count('"partition_assigned"')


@dataclass
class Sample:
    """One observation of every daemon and the broker."""

    at: float
    checked: list[float]
    replayed: list[float]
    cpu: list[float]
    broker_cpu: float
    machine_cpu: float
    own_cpu: float  # this script's


@dataclass
class Run:
    """One drain of the topic by one group."""

    mode: str
    instances: int
    startup: float  # seconds from starting the daemons until they split the partitions
    decisions: float
    seconds: float
    cpu: list[float]  # per instance
    broker_cpu: float
    machine_cpu: float  # every process on the machine
    own_cpu: float
    checked: list[float]  # per instance
    replayed: list[float]
    partitions: list[set[int]]
    assignments: list[int]

    @property
    def rate(self) -> float:
        return self.decisions / self.seconds

    @property
    def cpu_us(self) -> float:
        """Daemon CPU microseconds per decision."""
        return 1e6 * sum(self.cpu) / self.decisions


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICK


def machine_cpu_seconds() -> float:
    """CPU seconds spent by every process on the machine (not idle, not I/O wait)."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(
        int, Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    )
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICK


def broker_pid(run_dir: Path) -> int:
    """The dev broker's JVM, found by its run dir's server.properties on the command line."""
    out = subprocess.run(
        ["pgrep", "-f", f"kafka\\.Kafka {run_dir}/server\\.properties"],
        capture_output=True,
        text=True,
    ).stdout.split()
    if len(out) != 1:
        raise SystemExit(f"expected one Kafka broker with run dir {run_dir}, found {out}")
    return int(out[0])


def machine() -> str:
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = re.search(r"model name\s*:\s*(.+)", cpuinfo)
    return f"{os.cpu_count()} cores ({model.group(1).strip() if model else 'unknown CPU'})"


def decision_events(x: np.ndarray, y: np.ndarray) -> list[list[bytes]]:
    """Decision i as model m(i mod MODELS); one list per partition, in stream order."""
    return [
        [
            orjson.dumps({"id": i, "model": f"m{k}", "x": x[i].tolist(), "y": int(y[i])})
            for i in range(k, len(x), MODELS)
        ]
        for k in range(MODELS)
    ]


@contextlib.asynccontextmanager
async def staged(
    bootstrap: str, topic: str, per_partition: list[list[bytes]]
) -> AsyncIterator[AIOKafkaProducer]:
    """A new topic holding the decisions (list k in partition k) written in one open
    transaction: in the log, but invisible to read_committed consumers (the daemon) until
    the caller commits it. The topic is deleted on exit."""
    await create_topic(bootstrap, topic, len(per_partition))
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        transactional_id=f"stage-{topic}",
        transaction_timeout_ms=600_000,
        linger_ms=20,
        max_batch_size=1 << 20,
    )
    try:
        await producer.start()
        await producer.begin_transaction()
        for k, values in enumerate(per_partition):
            key = f"m{k}".encode()
            for v in values:
                await producer.send(topic, v, key=key, partition=k)
        await producer.flush()
        yield producer
    finally:
        await producer.stop()
        await delete_topics(bootstrap, [topic])


async def counts(port: int) -> tuple[float, float]:
    """(checked, replayed) decisions over all rules, from the daemon's /metrics."""
    body = await wait_http(port, "/metrics")
    total = {"checked": 0.0, "replayed": 0.0}
    for s in metric_samples(body):
        if s.name == "vigil_events_total" and s.labels.get("outcome") in total:
            total[s.labels["outcome"]] += s.value
    return total["checked"], total["replayed"]


def check_alive(daemons: list[ScaleDaemon]) -> None:
    for d in daemons:
        if d.proc.poll() is not None:
            tail = "\n".join(d.log_text().splitlines()[-20:])
            raise RuntimeError(f"daemon {d.client_id} exited ({d.proc.returncode}):\n{tail}")


async def sample(daemons: list[ScaleDaemon], broker: int) -> Sample:
    check_alive(daemons)
    got = [await counts(d.port) for d in daemons]
    return Sample(
        time.perf_counter(),
        [c for c, _ in got],
        [r for _, r in got],
        [cpu_seconds(d.proc.pid) for d in daemons],
        cpu_seconds(broker),
        machine_cpu_seconds(),
        cpu_seconds(os.getpid()),
    )


async def wait_split(daemons: list[ScaleDaemon], deadline: float) -> None:
    """Until every daemon holds partitions and together they hold each one exactly once."""
    while True:
        check_alive(daemons)
        held = [d.held_partitions() for d in daemons]
        if all(held) and sorted(p for h in held for p in h) == list(range(MODELS)):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"partitions not split after timeout: {held}")
        await asyncio.sleep(SAMPLE_SECONDS)


async def drain(
    args: argparse.Namespace, mode: str, instances: int, per_partition: list[list[bytes]]
) -> Run:
    """Stage the decisions in a new topic, start ``instances`` daemons in a fresh group on
    it, and once they have split the partitions, release the decisions and time the drain."""
    tag = uuid.uuid4().hex[:8]
    n = sum(map(len, per_partition))
    broker = broker_pid(args.broker_run_dir)
    deadline = time.monotonic() + args.timeout
    with tempfile.TemporaryDirectory() as tmp:
        daemons = []
        for i in range(instances):
            workdir = Path(tmp) / f"instance{i}"
            workdir.mkdir()
            daemons.append(
                ScaleDaemon(
                    args.bootstrap,
                    workdir,
                    exactly_once=MODES[mode],
                    snapshot_every_events=10**9,
                    tag=tag,
                    decisions=f"scale-decisions-{tag}",
                    client_id=f"scale{i}",
                )
            )
        async with staged(args.bootstrap, daemons[0].topic, per_partition) as producer:
            try:
                started = time.perf_counter()
                for d in daemons:
                    d.start()
                await wait_split(daemons, deadline)
                first = await sample(daemons, broker)
                await producer.commit_transaction()
                while True:
                    s = await sample(daemons, broker)
                    if sum(s.checked) >= n:
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{sum(s.checked):.0f} of {n} checked by timeout")
                    await asyncio.sleep(SAMPLE_SECONDS)
                return Run(
                    mode,
                    instances,
                    first.at - started,
                    sum(s.checked) - sum(first.checked),
                    s.at - first.at,
                    [b - a for a, b in zip(first.cpu, s.cpu, strict=True)],
                    s.broker_cpu - first.broker_cpu,
                    s.machine_cpu - first.machine_cpu,
                    s.own_cpu - first.own_cpu,
                    s.checked,
                    s.replayed,
                    [d.held_partitions() for d in daemons],
                    [d.assignments() for d in daemons],
                )
            finally:
                for d in daemons:
                    d.kill()


def split(run: Run) -> str:
    """Each instance's checked decisions and partitions, e.g. ``100000 p0,2 / 100000 p1,3``."""
    return " / ".join(
        f"{c:.0f} p{','.join(map(str, sorted(p)))}"
        for c, p in zip(run.checked, run.partitions, strict=True)
    )


def print_instances(runs: list[Run], modes: list[str]) -> None:
    print(
        "\n| mode | instances | decisions/s | x 1 instance | daemon CPU us/decision"
        " | x 1 instance | broker CPU us/decision | cores busy: daemons | broker"
        " | whole machine | split (checked, partitions) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for mode in modes:
        base = None
        for instances in (1, 2):
            rs = [r for r in runs if r.mode == mode and r.instances == instances]
            rate = statistics.median(r.rate for r in rs)
            cpu_us = statistics.median(r.cpu_us for r in rs)
            base = base or (rate, cpu_us)
            broker_us = statistics.median(1e6 * r.broker_cpu / r.decisions for r in rs)
            cores = [
                statistics.median(busy(r) / r.seconds for r in rs)
                for busy in (lambda r: sum(r.cpu), lambda r: r.broker_cpu, lambda r: r.machine_cpu)
            ]
            splits = sorted({split(r) for r in rs}) if instances > 1 else ["-"]
            print(
                f"| {mode} | {instances} | {rate:,.0f} ({min(r.rate for r in rs):,.0f}-"
                f"{max(r.rate for r in rs):,.0f}) | {rate / base[0]:.2f} | {cpu_us:.2f} | "
                f"{cpu_us / base[1]:.2f} | {broker_us:.2f} | "
                f"{' | '.join(f'{c:.2f}' for c in cores)} | {'; '.join(splits)} |"
            )
    print(
        "\nEvery run (from the release of the decisions to the last check; CPU in seconds):"
        "\n\n| mode | instances | start to split s | decisions | seconds | decisions/s"
        " | daemon CPU | broker CPU | this script CPU | machine CPU | replayed"
        " | partition assignments | split |"
    )
    print("|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---|---|---|")
    for r in runs:
        print(
            f"| {r.mode} | {r.instances} | {r.startup:.2f} | {r.decisions:.0f} | {r.seconds:.2f}"
            f" | {r.rate:,.0f} | {' + '.join(f'{c:.2f}' for c in r.cpu)} | {r.broker_cpu:.2f}"
            f" | {r.own_cpu:.2f} | {r.machine_cpu:.2f}"
            f" | {'/'.join(f'{v:.0f}' for v in r.replayed)}"
            f" | {'/'.join(map(str, r.assignments))} | {split(r)} |"
        )


async def instances(args: argparse.Namespace) -> None:
    """1 vs 2 daemon instances in one group on one 4-partition topic."""
    x, y, name = stream(args.n)
    per_partition = decision_events(x, y)
    print(
        f"\n## instances\n\nstream: {name}, {len(x)} decisions, {x.shape[1]} features, "
        f"{MODELS} models on {MODELS} partitions; one i.o.r. rule per model (linf, eps 0.04, "
        f"auto); medians of {args.repeats} runs (range in parentheses)"
    )
    modes = ["eos", "alo"] if args.mode == "both" else [args.mode]
    runs = []
    for mode in modes:
        for repeat in range(args.repeats):
            for count in (1, 2):
                print(f"[instances] {mode} x{count}: staging, starting", file=sys.stderr)
                run = await drain(args, mode, count, per_partition)
                runs.append(run)
                print(
                    f"[instances] {mode} x{count} run {repeat + 1}/{args.repeats}: "
                    f"{run.rate:,.0f}/s, {run.cpu_us:.2f} us CPU/decision, {split(run)}",
                    file=sys.stderr,
                )
    print_instances(runs, modes)


async def produce_partition(bootstrap: str, topic: str, values: list[bytes]) -> None:
    """A new one-partition topic holding ``values`` as model m0's decisions."""
    await create_topic(bootstrap, topic)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=1 << 20)
    await producer.start()
    try:
        for v in values:
            await producer.send(topic, v, key=b"m0", partition=0)
        await producer.flush()
    finally:
        await producer.stop()


async def wait_ready(daemon: ScaleDaemon, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        check_alive([daemon])
        with contextlib.suppress(AssertionError):
            await wait_http(daemon.port, "/readyz", timeout=SAMPLE_SECONDS)
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"not ready after {timeout} s")


def stop(daemon: ScaleDaemon) -> None:
    daemon.signal(signal.SIGTERM)
    if daemon.wait(timeout=120) != 0:
        raise RuntimeError(f"daemon exited {daemon.proc.returncode}:\n{daemon.log_text()[-3000:]}")


def state_read(daemon: ScaleDaemon) -> tuple[float, float]:
    """(MB, seconds) of the Kafka store's read of the partition, from the log."""
    for line in daemon.log_text().splitlines():
        if '"state_read"' in line:
            entry = orjson.loads(line)
            return entry["bytes"] / 1e6, entry["seconds"]
    return 0.0, 0.0


async def restore(args: argparse.Namespace) -> None:
    """Restore time of one partition's history on an empty host: Kafka store vs replay."""
    n = args.history
    x, y, name = stream(n)
    values = [
        orjson.dumps({"id": i, "model": "m0", "x": x[i].tolist(), "y": int(y[i])}) for i in range(n)
    ]
    tag, topic = uuid.uuid4().hex[:8], f"scale-restore-{uuid.uuid4().hex[:8]}"
    print(
        f"\n## restore\n\nstream: {name}, one partition with {n} decisions of model m0 "
        f"({x.shape[1]} features); the group has committed them all and its state topic "
        f"holds snapshots written every 100,000 decisions; a new instance with an empty "
        f"state dir is started and timed from its start to /readyz (process start, group "
        f"join, restore, replay); {args.repeats} runs each"
    )
    print(f"[restore] producing {n} decisions", file=sys.stderr)
    await produce_partition(args.bootstrap, topic, values)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        first = ScaleDaemon(
            args.bootstrap,
            Path(tmp) / "build",
            decisions=topic,
            tag=tag,
            snapshot_every_events=100_000,
        )
        first.workdir.mkdir()
        first.start()
        try:
            print("[restore] building the history (first instance)", file=sys.stderr)
            while (await counts(first.port))[0] < n:
                check_alive([first])
                await asyncio.sleep(0.5)
            stop(first)
        finally:
            first.kill()
        for repeat in range(args.repeats):
            for store in ("kafka", "file"):
                workdir = Path(tmp) / f"{store}-{repeat}"
                workdir.mkdir()
                daemon = ScaleDaemon(
                    args.bootstrap,
                    workdir,
                    decisions=topic,
                    tag=tag,
                    state_settings=f'store = "{store}"',
                    snapshot_every_events=10**9,
                )
                started = time.perf_counter()
                daemon.start()
                try:
                    await wait_ready(daemon, args.timeout)
                    seconds = time.perf_counter() - started
                    _, replayed = await counts(daemon.port)
                    stop(daemon)
                finally:
                    daemon.kill()
                rows.append((store, seconds, replayed, *state_read(daemon)))
                print(f"[restore] {store} run {repeat + 1}: {seconds:.2f} s", file=sys.stderr)
    await delete_topics(args.bootstrap, [topic, f"vigil-{tag}-state"])
    print(
        "\n| store | seconds to ready | x Kafka store | decisions replayed "
        "| state read MB | state read s |\n|---|---:|---:|---:|---:|---:|"
    )
    kafka = statistics.median(r[1] for r in rows if r[0] == "kafka")
    for store, label in (("kafka", "Kafka store"), ("file", "empty dir: full replay")):
        mine = [r for r in rows if r[0] == store]
        seconds = [r[1] for r in mine]
        print(
            f"| {label} | {statistics.median(seconds):.2f} ({min(seconds):.2f}-"
            f"{max(seconds):.2f}) | {statistics.median(seconds) / kafka:.1f} "
            f"| {statistics.median(r[2] for r in mine):,.0f} "
            f"| {statistics.median(r[3] for r in mine):.0f} "
            f"| {statistics.median(r[4] for r in mine):.2f} |"
        )


async def delete_topics(bootstrap: str, topics: list[str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics(topics)
    finally:
        await admin.close()


async def snapshot(args: argparse.Namespace) -> None:
    """Cost of one snapshot after 100,000 new decisions, at 100k and at 1M of history."""
    step, points = 100_000, (100_000, args.history)
    total = points[-1] + step * (args.repeats + 1)
    x, y, name = stream(total)
    rule = IorRule(
        parse_config(
            {
                "files": {"decisions": "unused", "topic": "t"},
                "outputs": {"alerts_file": "a", "dead_letter_file": "d"},
                "rules": [{"name": "m0", "kind": "ior", "topic": "t", "eps": 0.04}],
            }
        ).rules[0]
    )
    tp = ("t", 0)
    monitor = rule.monitors[tp] = Monitor(MonitorSpec(dim=x.shape[1], eps=0.04, metric="linf"))
    topic = f"scale-snapshot-{uuid.uuid4().hex[:8]}"
    store = KafkaStore(args.bootstrap, topic, [], max_segments=10**6)
    await store.start()
    await store.open(tp)
    print(
        f"\n## snapshot\n\nstream: {name} ({x.shape[1]} features); one snapshot after each "
        f"{step:,} new decisions, {args.repeats} at each history size: the Kafka store's "
        f"segment (take + save, acknowledged by the broker) vs a whole snapshot as the "
        f"file store writes it (serialise + write + fsync)\n"
    )
    position, rows = 0, []

    def grow(to: int) -> None:
        nonlocal position
        for start in range(position, to, 50_000):
            stop_ = min(to, start + 50_000)
            monitor.check_batch(x[start:stop_], y[start:stop_], list(range(start, stop_)))
        position = to

    with tempfile.TemporaryDirectory() as tmp:
        files = FileStore(Path(tmp))
        try:
            for history in points:
                print(f"[snapshot] history {history:,}", file=sys.stderr)
                grow(history)
                part = store.take("m0", tp, partial(rule.snapshot, tp))
                await store.save("m0", tp, position, part, committed=position)
                for _ in range(args.repeats):
                    held = position
                    grow(position + step)
                    started = time.perf_counter()
                    part = store.take("m0", tp, partial(rule.snapshot, tp))
                    await store.save("m0", tp, position, part, committed=position)
                    segment = time.perf_counter() - started
                    assert not part.base
                    started = time.perf_counter()
                    whole = rule.snapshot(tp)
                    await files.save("m0", tp, position, whole, committed=position)
                    full = time.perf_counter() - started
                    rows.append((history, held, segment, len(part.blob), full, len(whole.blob)))
        finally:
            await store.stop()
    await delete_topics(args.bootstrap, [topic])
    print(
        "| history before | segment s (Kafka store) | segment MB | whole snapshot s (file "
        "store) | whole MB | whole / segment |\n|---:|---:|---:|---:|---:|---:|"
    )
    medians = {}
    for history in points:
        mine = [r for r in rows if r[0] == history]
        seg, full = (statistics.median(r[i] for r in mine) for i in (2, 4))
        medians[history] = seg
        print(
            f"| {history:,}-{max(r[1] for r in mine):,} | {seg:.3f} ({min(r[2] for r in mine):.3f}"
            f"-{max(r[2] for r in mine):.3f}) | {statistics.median(r[3] for r in mine) / 1e6:.1f} "
            f"| {full:.3f} | {statistics.median(r[5] for r in mine) / 1e6:.1f} | {full / seg:.1f} |"
        )
    a, b = medians[points[0]], medians[points[-1]]
    print(f"\nsegment cost at {points[-1]:,} / at {points[0]:,} of history: {b / a:.2f}")


SECTIONS: dict[str, Callable[[argparse.Namespace], Awaitable[None]]] = {
    "instances": instances,
    "restore": restore,
    "snapshot": snapshot,
}


async def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--section", choices=[*SECTIONS, "all"], default="all")
    p.add_argument("--bootstrap", default="127.0.0.1:9892")
    p.add_argument(
        "--broker-run-dir",
        type=Path,
        help="the dev broker's run dir (default: $VIGIL_KAFKA_RUN or /tmp/vigil-kafka-<port>)",
    )
    p.add_argument("--n", type=int, default=200_000, help="decisions per instances run")
    p.add_argument(
        "--history", type=int, default=1_000_000, help="decisions of history (restore, snapshot)"
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--mode", choices=[*MODES, "both"], default="both")
    p.add_argument("--timeout", type=float, default=300, help="seconds allowed per drain")
    args = p.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # tables and stderr progress in order
    port = args.bootstrap.rpartition(":")[2]
    args.broker_run_dir = args.broker_run_dir or Path(
        os.environ.get("VIGIL_KAFKA_RUN", f"/tmp/vigil-kafka-{port}")
    )
    print(
        f"command: python {shlex.join(['bench/scale_bench.py', *sys.argv[1:]])}; "
        f"machine: {machine()}, Python {sys.version.split()[0]}"
    )
    for name in SECTIONS if args.section == "all" else [args.section]:
        await SECTIONS[name](args)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
