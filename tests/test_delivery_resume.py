"""A delivery the broker did not take, resumed in-process (daemon/pipeline.py ``_resume``):
with transactional delivery every alert goes out exactly once, and a stop before the broker
is back commits nothing past what went out."""

from __future__ import annotations

import asyncio

import numpy as np
import orjson
import pytest
from aiokafka.errors import KafkaTimeoutError

from tests.oracle import witness_sets
from tests.test_daemon_units import _decisions, _pipeline
from vigil.connectors.memory import MemorySink, MemorySource
from vigil.daemon.broker import BrokerWatch
from vigil.daemon.metrics import Metrics
from vigil.daemon.state import FileStore


class _Answers:
    async def answers(self, timeout: float) -> bool:
        return True

    async def close(self) -> None:
        pass


class _TransactionalSink(MemorySink):
    """A transactional sink (messages and offsets together, the offsets committed to the
    source as Kafka's transaction would) whose ``fail``-th delivery times out."""

    def __init__(self, source: MemorySource, fail: int) -> None:
        super().__init__(commits_offsets=True)
        self.source, self.fail, self.calls, self.restarts = source, fail, 0, 0

    async def deliver(self, messages, offsets) -> None:
        self.calls += 1
        if self.calls == self.fail:
            raise KafkaTimeoutError("the broker did not answer")
        await super().deliver(messages, offsets)
        if offsets:
            self.source.commits.append(dict(offsets))

    async def restart(self, close_timeout: float) -> None:
        self.restarts += 1


def _setup(tmp_path, fail: int, every: int = 40):
    rng = np.random.default_rng(5)
    x = rng.integers(0, 6, size=(300, 3)) / 6
    y = rng.integers(0, 2, size=300)
    truth = witness_sets(x, y, 0.25)
    expected = {i: [j for j, _ in ws] for i, ws in enumerate(truth) if ws}
    source = MemorySource("t", _decisions(x, y))
    sink = _TransactionalSink(source, fail)
    pipeline, _, _ = _pipeline([], FileStore(tmp_path), sink, every=every, source=source)
    pipeline.broker = BrokerWatch(_Answers(), Metrics(), "b:9092")
    return pipeline, source, sink, expected


@pytest.mark.parametrize("every", [40, 10**9], ids=["from a snapshot", "from the origin"])
def test_a_delivery_the_broker_did_not_take_is_resumed_exactly_once(tmp_path, every):
    pipeline, source, sink, expected = _setup(tmp_path, fail=4, every=every)

    async def run() -> None:
        pipeline.broker.observe(True)
        await source.start(pipeline.on_assign, pipeline.on_revoke)
        await pipeline.run(asyncio.Event(), until_idle=True)

    asyncio.run(run())
    assert sink.restarts == 1 and not pipeline.failed
    alerts = [orjson.loads(m.value) for m in sink.messages if m.topic == "vigil.alerts"]
    delivered = [a["decision"]["id"] for a in alerts]
    assert sorted(delivered) == sorted(expected), "an alert was lost or sent twice"
    witnesses = {a["decision"]["id"]: sorted(w["id"] for w in a["witnesses"]) for a in alerts}
    assert witnesses == {i: sorted(ws) for i, ws in expected.items()}  # no doubled history
    assert source.commits[-1] == {("t", 0): 300}


def test_a_stop_while_the_broker_is_away_commits_nothing_more(tmp_path):
    pipeline, source, sink, _ = _setup(tmp_path, fail=3)
    stop = asyncio.Event()

    async def run() -> None:
        pipeline.broker.observe(True)
        pipeline.broker.observe(False)  # away: the resume waits for it
        await source.start(pipeline.on_assign, pipeline.on_revoke)
        asyncio.get_running_loop().call_later(0.3, stop.set)
        await pipeline.run(stop)

    asyncio.run(run())
    assert pipeline.failed and sink.restarts == 0
    committed = source.commits[-1][("t", 0)]
    assert sink.calls == 3 and len(source.commits) == 2  # the two deliveries before the failure
    assert committed == 2 * 37
