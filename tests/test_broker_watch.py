"""The broker watch's story of an outage, from probe results (the real probe against a
real broker is exercised by tests/test_broker_outage.py)."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pytest
from aiokafka.errors import NodeNotReadyError
from structlog.testing import capture_logs

from tests.daemon_harness import metric_samples
from vigil.connectors.kafka_security import BrokerRejected, BrokerUnavailable, KafkaSecurity
from vigil.daemon.broker import BrokerWatch
from vigil.daemon.logs import CLIENT_LOGS
from vigil.daemon.metrics import Metrics


class _Probe:
    async def answers(self, timeout: float) -> bool:
        return True

    async def close(self) -> None:
        pass


def _value(metrics: Metrics, name: str) -> float:
    body = metrics.render().decode()
    return next(s.value for s in metric_samples(body) if s.name == name)


def test_an_outage_is_one_warning_one_info_line_and_counted(monkeypatch):
    from vigil.daemon import broker as module

    now = [100.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: now[0])
    metrics = Metrics()

    async def story() -> tuple[list[dict], BrokerWatch]:
        watch = BrokerWatch(_Probe(), metrics, "b:9092")
        with capture_logs() as logs:
            watch.observe(True)  # the first answer: nothing to tell
            assert watch.up and watch.answered and _value(metrics, "vigil_broker_up") == 1
            for _ in range(3):
                now[0] += 1
                watch.observe(False)
                CLIENT_LOGS.filter(logging.LogRecord("aiokafka", 40, "", 1, "x", None, None))
            assert watch.unreachable_for() == 2 and _value(metrics, "vigil_broker_up") == 0
            now[0] += 5
            watch.observe(True)
            now[0] += 5
            watch.observe(True)
        return logs, watch

    logs, watch = asyncio.run(story())
    assert [e["event"] for e in logs] == ["broker_unreachable", "broker_reachable"]
    assert logs[1]["outage_seconds"] == 7.0 and logs[1]["client_lines_suppressed"] == 3
    assert _value(metrics, "vigil_broker_unreachable_seconds_total") == 7.0
    assert watch.unreachable_for() == 0 and watch.outages == 1 and not CLIENT_LOGS.quiet


def test_vigils_own_broker_verdicts_are_final_not_waited_out():
    from aiokafka.errors import KafkaTimeoutError, NodeNotReadyError, UnknownTopicOrPartitionError

    from vigil.connectors.kafka import broker_gone
    from vigil.connectors.kafka_security import BrokerRejected, BrokerUnavailable

    assert broker_gone(NodeNotReadyError()) and broker_gone(KafkaTimeoutError())
    assert broker_gone(ConnectionRefusedError()) and broker_gone(TimeoutError())
    assert not broker_gone(BrokerUnavailable("gone for 60 s"))  # an OSError, yet final
    assert not broker_gone(BrokerRejected("wrong password"))
    assert not broker_gone(ValueError("a message too large"))
    assert broker_gone(UnknownTopicOrPartitionError()) is bool(
        UnknownTopicOrPartitionError.retriable
    )


def _starting(timeout: float) -> tuple[SimpleNamespace, SimpleNamespace]:
    """The pipeline and config ``_start_client`` reads: a broker that answers."""
    pipeline = SimpleNamespace(
        settings=SimpleNamespace(startup_timeout_seconds=timeout), broker=SimpleNamespace(up=True)
    )
    kafka = SimpleNamespace(
        bootstrap_servers="b:9092", security=KafkaSecurity, startup_timeout_seconds=timeout
    )
    return pipeline, SimpleNamespace(kafka=kafka)


def test_a_client_start_the_broker_interrupts_is_tried_again(monkeypatch):
    from vigil.daemon import service

    monkeypatch.setattr(service, "_RESTART_SECONDS", 0)
    errors = [BrokerUnavailable("metadata names no broker yet"), NodeNotReadyError()]
    calls = []

    async def step() -> None:
        calls.append(1)
        if errors:
            raise errors.pop(0)

    async def story() -> bool:
        return await service._start_client(step, *_starting(60), asyncio.Event())

    with capture_logs() as logs:
        assert asyncio.run(story()) is True
    assert len(calls) == 3
    assert [e["event"] for e in logs] == ["client_start_retried"] * 2
    assert "names no broker" in logs[0]["reason"]


@pytest.mark.parametrize(
    ("error", "timeout"),
    [
        (BrokerRejected("wrong password"), 60),
        (ValueError("a setting"), 60),
        (BrokerUnavailable("gone"), 0),
    ],
)
def test_a_refused_start_or_one_past_the_startup_timeout_is_not_tried_again(
    monkeypatch, error, timeout
):
    from vigil.daemon import service

    monkeypatch.setattr(service, "_RESTART_SECONDS", 0)
    calls = []

    async def step() -> None:
        calls.append(1)
        raise error

    async def story() -> bool:
        return await service._start_client(step, *_starting(timeout), asyncio.Event())

    with pytest.raises(type(error)):
        asyncio.run(story())
    assert len(calls) == 1
