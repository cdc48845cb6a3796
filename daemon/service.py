"""Wiring: config -> source, sink, rules, snapshot store, metrics endpoint; run; shut down."""

from __future__ import annotations

import asyncio
import contextlib
import signal

import structlog

from connectors.files import JsonLinesSink, JsonLinesSource
from connectors.kafka import KafkaSink, KafkaSource
from daemon.config import Config
from daemon.http import OpsServer
from daemon.metrics import Metrics
from daemon.pipeline import Pipeline, PipelineSettings
from daemon.rules import RULE_KINDS
from daemon.state import SnapshotStore

log = structlog.get_logger("vigil")


def build_pipeline(config: Config, metrics: Metrics) -> Pipeline:
    rules = [RULE_KINDS[r.kind](r) for r in config.rules]
    out = config.outputs
    if config.kafka is not None:
        k = config.kafka
        source = KafkaSource(
            sorted({t for r in rules for t in r.topics}),
            k.bootstrap_servers,
            k.group_id,
            k.client_id,
            k.auto_offset_reset,
            "read_committed",
            k.session_timeout_ms,
        )
        transactional_id = (
            (k.transactional_id or f"{k.group_id}-{k.client_id}") if k.exactly_once else None
        )
        sink = KafkaSink(k.bootstrap_servers, k.group_id, k.client_id, transactional_id)
        max_batch, timeout = k.max_batch, k.fetch_timeout_ms
    else:
        f = config.files
        source = JsonLinesSource(f.decisions, f.topic, config.state.dir / "file-offsets.json")
        sink = JsonLinesSink(
            {out.alerts_topic: out.alerts_file, out.dead_letter_topic: out.dead_letter_file}
        )
        max_batch, timeout = f.max_batch, 0
    settings = PipelineSettings(
        alerts_topic=out.alerts_topic,
        dead_letter_topic=out.dead_letter_topic,
        max_batch=max_batch,
        fetch_timeout_ms=timeout,
        snapshot_every_events=config.state.snapshot_every_events,
        snapshot_every_seconds=config.state.snapshot_every_seconds,
    )
    store = SnapshotStore(config.state.dir, config.state.keep)
    return Pipeline(rules, source, sink, store, metrics, settings)


async def run_daemon(
    config: Config, until_idle: bool = False, stop: asyncio.Event | None = None
) -> Pipeline:
    """Run until SIGTERM/SIGINT (or ``stop``; or, with ``until_idle``, until the source is
    drained), then drain, snapshot, commit and close within the shutdown deadline."""
    metrics = Metrics()
    pipeline = build_pipeline(config, metrics)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    server = None
    if config.metrics.enabled:
        server = OpsServer(config.metrics.host, config.metrics.port, metrics.render, pipeline.ready)
        await server.start()
    await pipeline.sink.start()
    await pipeline.source.start(pipeline.on_assign, pipeline.on_revoke)
    log.info(
        "started",
        rules=[r.name for r in pipeline.rules],
        metrics_port=server.port if server else None,
    )
    try:
        await pipeline.run(stop, until_idle)
    finally:
        log.info("stopping", deadline_seconds=config.shutdown.deadline_seconds)
        try:
            await asyncio.wait_for(_shutdown(pipeline, server), config.shutdown.deadline_seconds)
        except TimeoutError:
            log.error("shutdown_deadline_exceeded")
            raise
    log.info("stopped")
    return pipeline


async def _shutdown(pipeline: Pipeline, server: OpsServer | None) -> None:
    await pipeline.snapshot_all()
    await pipeline.source.stop()
    await pipeline.sink.stop()
    if server:
        await server.stop()
