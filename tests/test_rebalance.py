"""Scaling out with exactly-once: partitions move between instances and replaced hosts.

Four models on four partitions of one topic; instances join, leave cleanly, are replaced by
hosts with empty state dirs after the head of every partition was deleted, and one is
SIGKILLed while decisions flow. Every partition changes owner at least twice, yet the
committed alerts equal a single instance's (the offline monitor's) exactly, none twice.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import time

import numpy as np
import orjson
from aiokafka import TopicPartition as KafkaTP
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete

from tests.daemon_harness import (
    Daemon,
    consume_all,
    decision_events,
    expected_alerts,
    metric_samples,
    produce,
    wait_http,
    witness_map,
)

MODELS = ("compas", "m1", "m2", "m3")
"""Model k is sent to partition k; "compas" is checked by the harness's own rule."""
RULE_OF = {"compas": "compas-fairness", **{m: f"{m}-fairness" for m in MODELS[1:]}}
RULES = "".join(
    f"""
[[rules]]
name = "{RULE_OF[m]}"
kind = "ior"
topic = "decisions-{{tag}}"
model = "{m}"
metric = "linf"
eps = 0.04
backend = "auto"
"""
    for m in MODELS[1:]
)
CHUNK = 600  # each model's 3000 decisions go out in five chunks
CUT = 1500  # the head deleted from every partition once snapshots cover 1800 records


async def settle(running: dict[str, Daemon], want: dict[str, int]) -> dict[int, str]:
    """Wait until the rebalance gave each running instance ``want[name]`` partitions (all
    of them, none twice) and each is ready; the owner of each partition."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        holdings = {name: d.held_partitions() for name, d in running.items()}
        owners = {p: name for name, ps in holdings.items() for p in ps}
        counts = {name: len(ps) for name, ps in holdings.items()}
        if counts == want and sorted(owners) == list(range(len(MODELS))):
            for d in running.values():
                await wait_http(d.port, "/readyz", timeout=60)
            return owners
        await asyncio.sleep(0.2)
    raise AssertionError(f"no assignment {want}: {holdings}")


async def wait_committed(daemon: Daemon, offset: int, partitions: range | list[int]) -> None:
    """Wait until the group committed ``offset`` (or more) on each of ``partitions``."""
    admin = AIOKafkaAdminClient(bootstrap_servers=daemon.bootstrap)
    await admin.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            offsets = await admin.list_consumer_group_offsets(f"vigil-{daemon.tag}")
            done = {tp.partition: m.offset for tp, m in offsets.items() if tp.topic == daemon.topic}
            if all(done.get(p, -1) >= offset for p in partitions):
                return
            await asyncio.sleep(0.2)
        raise AssertionError(f"committed {done}, not {offset} on {list(partitions)}")
    finally:
        await admin.close()


def metric(body: str, name: str, **labels: str) -> float:
    """The sample of ``name`` with exactly ``labels`` in a /metrics page."""
    for s in metric_samples(body):
        if s.name == name and s.labels == labels:
            return s.value
    raise AssertionError(f"no {name}{labels} in the metrics")


def replayed(body: str) -> float:
    """Decisions the rules applied again on assignment (records before the commit)."""
    return sum(
        s.value
        for s in metric_samples(body)
        if s.name == "vigil_events_total" and s.labels.get("outcome") == "replayed"
    )


async def test_moved_partitions_and_replaced_hosts_keep_alerts_exactly_once(
    kafka_bootstrap, tmp_path, compas
):
    x, y = compas
    events: list[list[bytes]] = []
    expected: dict[str, list[str]] = {}
    for k, m in enumerate(MODELS):  # each model's stream starts elsewhere in the data
        xs, ys = np.roll(x, -750 * k, axis=0), np.roll(y, -750 * k)
        events.append(decision_events(xs, ys, m, f"{m}-"))
        expected |= expected_alerts(xs, ys, 0.04, prefix=f"{m}-")
    tag = Daemon(kafka_bootstrap, tmp_path).tag
    started: list[Daemon] = []

    def instance(name: str, client_id: str) -> Daemon:
        """A host with an empty state dir of its own."""
        (tmp_path / name).mkdir()
        daemon = Daemon(
            kafka_bootstrap,
            tmp_path / name,
            tag=tag,
            client_id=client_id,
            partitions=len(MODELS),
            snapshot_every_events=250,
            extra_rules=RULES,
            state_settings='store = "kafka"',  # snapshots move with the partitions
        )
        daemon.start()
        started.append(daemon)
        return daemon

    def send(chunk: int, pace: float = 0.0) -> asyncio.Future[list[None]]:
        """Produce chunk ``chunk`` of every model, to its partition, all at once."""
        return asyncio.gather(
            *(
                produce(
                    kafka_bootstrap,
                    f"decisions-{tag}",
                    events[k][chunk * CHUNK : (chunk + 1) * CHUNK],
                    key=m.encode(),
                    pace=pace,
                    partition=k,
                )
                for k, m in enumerate(MODELS)
            )
        )

    async def stop(daemon: Daemon) -> None:
        daemon.signal(signal.SIGTERM)
        assert await asyncio.to_thread(daemon.wait, 30) == 0, daemon.log_text()[-3000:]

    everything = range(len(MODELS))
    owners: list[dict[int, str]] = []
    try:
        # A alone; B joins while chunk 1 arrives (half the partitions move to B)
        a = instance("a", "a")
        await send(0)
        owners.append(await settle({"a": a}, {"a": 4}))
        await wait_committed(a, CHUNK, everything)
        producing = send(1, pace=0.1)
        b = instance("b", "b")
        owners.append(await settle({"a": a, "b": b}, {"a": 2, "b": 2}))
        await producing
        await wait_committed(a, 2 * CHUNK, everything)

        # A leaves cleanly while chunk 2 arrives: B holds all
        producing = send(2, pace=0.1)
        await stop(a)
        owners.append(await settle({"b": b}, {"b": 4}))
        await producing
        await wait_committed(b, 3 * CHUNK, everything)

        # B's host goes away (its shutdown snapshots cover 1800 records of every partition),
        # retention deletes the head, and two hosts with empty state dirs take over
        await stop(b)
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            heads = await admin.delete_records(
                {KafkaTP(b.topic, p): RecordsToDelete(CUT) for p in everything}
            )
        finally:
            await admin.close()
        assert list(heads.values()) == [CUT] * len(MODELS)
        c, d = instance("c", "c"), instance("d", "d")
        owners.append(await settle({"c": c, "d": d}, {"c": 2, "d": 2}))
        handover = {n: await wait_http(i.port, "/metrics") for n, i in (("c", c), ("d", d))}

        # D is killed mid-stream: C takes its partitions; D's host comes back empty (the
        # same transactional id fences the transaction D left open) and takes some back
        producing = asyncio.ensure_future(send(3, pace=0.15))
        d_parts = sorted(d.held_partitions())
        await wait_committed(d, 3 * CHUNK + 40, d_parts)
        assert not producing.done(), "chunk 3 was sent before the kill"
        d.kill()
        owners.append(await settle({"c": c}, {"c": 4}))
        d2 = instance("d2", "d")
        owners.append(await settle({"c": c, "d2": d2}, {"c": 2, "d2": 2}))
        handover["d2"] = await wait_http(d2.port, "/metrics")
        await producing
        await send(4)
        await wait_committed(c, 5 * CHUNK, everything)
        alerts = await consume_all(kafka_bootstrap, c.alerts_topic, len(expected), 120)
        final = {n: await wait_http(i.port, "/metrics") for n, i in (("c", c), ("d2", d2))}
        await stop(c)
        await stop(d2)
    finally:
        for daemon in started:
            daemon.kill()

    moves = {p: sum(o[p] != n[p] for o, n in itertools.pairwise(owners)) for p in everything}
    assert all(n >= 2 for n in moves.values()), f"partitions did not move twice: {owners}"
    assert all(owner == "c" for owner in owners[4].values())
    ids = [a["decision"]["id"] for a in alerts]
    assert len(ids) == len(set(ids)), "an alert was duplicated"
    assert witness_map(alerts) == expected, "an alert was lost or differs"
    assert all(a["history_complete"] is True for a in alerts)
    assert all(a["source"]["partition"] == MODELS.index(a["model"]) for a in alerts)
    # empty hosts restored after the head was deleted: from the Kafka store, with no gap
    # and no replay (each handover was clean, so the newest snapshot is at the commit); the
    # rules of the other models, with no state on a partition, resume where it stood too
    for daemon in started:
        assert '"history_gap"' not in daemon.log_text(), daemon.workdir
    for daemon in (c, d, d2):
        for line in daemon.log_text().splitlines():
            if '"partition_assigned"' in line:
                assert orjson.loads(line)["replay_from"] > CUT, line
    for name, body in handover.items():
        assert replayed(body) == 0, f"{name} replayed {replayed(body)} decisions"
        assert metric(body, "vigil_snapshots_total", outcome="loaded") >= 2, name
    for name, body in final.items():
        for k in (p for p, owner in owners[-1].items() if owner == name):
            labels = {"rule": RULE_OF[MODELS[k]], "topic": c.topic, "partition": str(k)}
            assert metric(body, "vigil_history_complete", **labels) == 1
