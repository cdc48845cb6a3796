"""The offload pool and the certify rule's commit holds, on real worker processes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from tests import offload_jobs
from tests.delivery import answers_within_commits
from vigil.connectors.memory import MemorySink, MemorySource
from vigil.daemon.adapters import RuleContext, certify
from vigil.daemon.config import parse_config
from vigil.daemon.metrics import Metrics
from vigil.daemon.offload import OffloadPool, process_executor
from vigil.daemon.pipeline import Pipeline, PipelineSettings
from vigil.daemon.state import FileStore


@pytest.fixture
def pool():
    made = []

    def make(workers=2, max_pending=8, timeout=30.0):
        p = OffloadPool(
            lambda: process_executor(1), workers, Metrics(), max_pending, timeout, "test"
        )
        made.append(p)
        return p

    yield make
    for p in made:
        p.shutdown()


def requests_config():
    """A certify rule on topic "requests" (its job module is patched to tests.offload_jobs)."""
    return parse_config(
        {
            "files": {"decisions": "unused", "topic": "requests"},
            "outputs": {"alerts_file": "a", "dead_letter_file": "d", "certifications_file": "c"},
            "rules": [{"name": "c", "kind": "certify", "job": "knn", "topic": "requests"}],
        }
    )


async def test_jobs_of_one_batch_run_side_by_side(pool):
    p = pool(workers=2)
    await p.submit("warm", offload_jobs.interval, 0.0)  # start the workers
    a, b = await asyncio.gather(
        p.submit("sleep", offload_jobs.interval, 0.6), p.submit("sleep", offload_jobs.interval, 0.6)
    )
    (s1, e1), (s2, e2) = a.value, b.value
    assert max(s1, s2) < min(e1, e2)  # the two intervals overlap
    assert p.pending == 0


async def test_outcomes_timeout_invalid_and_metrics(pool):
    p = pool(workers=2, timeout=1.0)
    await asyncio.gather(*(p.submit("warm", offload_jobs.interval, 0.1) for _ in range(2)))
    slow, bad = await asyncio.gather(
        p.submit("slow", offload_jobs.run_job, {"sleep": 3.0}),
        p.submit("bad", offload_jobs.run_job, {"bad": True}),
    )
    assert slow.status == "timeout" and "1 s" in slow.error
    assert bad.status == "invalid" and "'bad'" in bad.error
    text = p.metrics.render().decode()
    assert 'vigil_offload_jobs_total{kind="slow",outcome="timeout",pool="test"} 1.0' in text
    assert 'vigil_offload_pending_jobs{pool="test"} 0.0' in text


async def test_a_timed_out_job_gives_its_worker_back(pool):
    """The stuck job's process is stopped and replaced: the next job does not queue behind
    it for the rest of its run (nor time out there)."""
    p = pool(workers=1, timeout=1.0)
    stuck_pid = await p.submit("pid", offload_jobs.pid)
    slow = await p.submit("slow", offload_jobs.run_job, {"sleep": 60.0})
    assert slow.status == "timeout"
    started = time.monotonic()
    after = await p.submit("pid", offload_jobs.pid)
    assert after.status == "ok" and time.monotonic() - started < 30
    assert after.value != stuck_pid.value
    assert not Path(f"/proc/{stuck_pid.value}").exists() or _zombie(stuck_pid.value)
    text = p.metrics.render().decode()
    assert 'vigil_offload_worker_restarts_total{pool="test",reason="timeout"} 1.0' in text


async def test_a_crashed_worker_is_replaced(pool):
    p = pool(workers=1)
    crashed = await p.submit("crash", offload_jobs.crash)
    assert crashed.status == "error" and "worker process died" in crashed.error
    after = await p.submit("sleep", offload_jobs.interval, 0.0)
    assert after.status == "ok"
    text = p.metrics.render().decode()
    assert 'vigil_offload_worker_restarts_total{pool="test",reason="worker_died"} 1.0' in text


def _zombie(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    return "State:\tZ" in status


async def test_saturation_is_reported_until_a_job_finishes(pool):
    p = pool(workers=1, max_pending=2)
    jobs = [p.submit("sleep", offload_jobs.run_job, {"sleep": 0.2}) for _ in range(2)]
    assert p.saturated
    await p.wait_for_space()
    assert not p.saturated
    await asyncio.gather(*jobs)


async def test_requests_commit_only_after_their_results_are_delivered(tmp_path, pool, monkeypatch):
    monkeypatch.setitem(certify.JOBS, "knn", "tests.offload_jobs")
    config = requests_config()
    shared = pool(workers=2)
    context = RuleContext(Metrics(), shared, lambda *a: shared, "v", "certs", "dead")
    rule = certify.CertifyRule(config.rules[0], context)
    assert rule.offload_jobs() == {shared.name: {"certify.knn"}}
    values = [
        orjson.dumps({"id": "slow", "sleep": 1.0}),
        orjson.dumps({"id": "fast", "sleep": 0.0}),
        b"not json",
        orjson.dumps({"id": "refused", "bad": True}),
    ]
    source, sink = MemorySource("requests", values), MemorySink()
    settings = PipelineSettings("dead", fetch_timeout_ms=10)
    pipeline = Pipeline([rule], source, sink, FileStore(tmp_path), context.metrics, settings)
    await source.start(pipeline.on_assign, pipeline.on_revoke)
    await pipeline.process(await source.fetch(10, 0))
    assert source.commits == []  # the slow request (offset 0) holds everything back
    for _ in range(600):
        await asyncio.sleep(0.05)
        await pipeline.deliver_completed()
        if not rule.in_flight():
            break
    assert source.commits[-1] == {("requests", 0): 4}
    results = {
        orjson.loads(m.value)["request_id"]: orjson.loads(m.value)
        for m in sink.messages
        if m.topic == "certs"
    }
    assert results["slow"]["status"] == "ok" and results["fast"]["status"] == "ok"
    assert results["refused"]["status"] == "invalid"
    dead = [orjson.loads(m.value) for m in sink.messages if m.topic == "dead"]
    assert sorted(d["reason"] for d in dead) == ["invalid_request", "undecodable"]
    # the fast job finished first but could not be committed past the slow one
    assert results["fast"]["completed_at"] <= results["slow"]["completed_at"]


async def test_exactly_once_answers_go_out_with_the_commit_of_their_record(
    tmp_path, pool, monkeypatch
):
    """Every result and dead letter is sent in the transaction whose commit passes its
    record, never before (a crash in between would answer the record twice), in request
    order, and none is left behind."""
    monkeypatch.setitem(certify.JOBS, "knn", "tests.offload_jobs")
    shared = pool(workers=2)
    context = RuleContext(Metrics(), shared, lambda *a: shared, "v", "certs", "dead")
    rule = certify.CertifyRule(requests_config().rules[0], context)
    values = [
        orjson.dumps({"id": "slow", "sleep": 1.5}),
        orjson.dumps({"id": "fast"}),
        b"not json",
        orjson.dumps({"id": "refused", "bad": True}),
        orjson.dumps({"id": "last"}),
    ]
    source, sink = MemorySource("requests", values), MemorySink(commits_offsets=True)
    settings = PipelineSettings("dead", fetch_timeout_ms=10)
    pipeline = Pipeline([rule], source, sink, FileStore(tmp_path), context.metrics, settings)
    await source.start(pipeline.on_assign, pipeline.on_revoke)
    await pipeline.process(await source.fetch(10, 0))
    for _ in range(600):
        await asyncio.sleep(0.05)
        await pipeline.deliver_completed()
        if not rule.in_flight():
            break
    events, committed = answers_within_commits(sink, ("requests", 0))
    answered = [(topic, event["source"]["offset"]) for topic, event in events]
    assert committed == 5
    assert [o for topic, o in answered if topic == "certs"] == [0, 1, 3, 4]  # request order
    assert sorted(answered) == sorted(
        [("certs", 0), ("certs", 1), ("dead", 2), ("certs", 3), ("dead", 3), ("certs", 4)]
    )


def test_workers_exit_when_the_daemon_is_killed(tmp_path):
    """A daemon killed without a shutdown (SIGKILL) must not leave worker processes behind."""
    script = tmp_path / "parent.py"
    script.write_text(
        "import os, sys, time\n"
        "from daemon.offload import process_executor\n"
        "from tests.offload_jobs import interval\n"
        "if __name__ == '__main__':\n"
        "    pool = process_executor(1)\n"
        "    pool.submit(interval, 0.0).result()\n"
        "    print(list(pool._processes)[0], flush=True)\n"
        "    time.sleep(60)\n"
    )
    root = Path(__file__).resolve().parents[1]
    parent = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    worker = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{worker}").exists():
        time.sleep(0.1)
    assert not Path(f"/proc/{worker}").exists()


def test_workers_run_below_the_daemons_priority():
    executor = process_executor(1, niceness=5)
    try:
        assert executor.submit(offload_jobs.niceness).result() == os.nice(0) + 5
    finally:
        executor.shutdown()
