"""Wiring: config -> source, sink, rules, snapshot store, metrics endpoint; run; shut down."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket

import structlog

from vigil.connectors.files import JsonLinesSink, JsonLinesSource
from vigil.connectors.kafka import KafkaSink, KafkaSource
from vigil.connectors.kafka_security import BrokerRejected, BrokerUnavailable
from vigil.daemon.adapters import Rule, RuleContext, build_rule
from vigil.daemon.collector import collect_between_batches
from vigil.daemon.config import Config
from vigil.daemon.http import OpsServer
from vigil.daemon.malloc import keep_freed_memory
from vigil.daemon.metrics import Metrics
from vigil.daemon.offload import DaskCluster, OffloadPool, process_executor
from vigil.daemon.pipeline import Pipeline, PipelineSettings
from vigil.daemon.state import FileStore, KafkaStore, StateStore
from vigil.daemon.state.kafka_store import StateTopicError

log = structlog.get_logger("vigil")


def build_rules(config: Config, metrics: Metrics) -> list[Rule]:
    """The configured rules, with their models loaded and checked and their worker pools
    made (workers start with the first job); a rule that cannot work raises ValueError."""
    out = config.outputs
    offload = config.offload

    def make_pool(name: str, workers: int, timeout: float) -> OffloadPool:
        """Local worker processes: reach rules' lanes always, certifications by default."""
        return OffloadPool(
            lambda: process_executor(1, offload.nice),
            workers,
            metrics,
            offload.max_pending,
            timeout,
            name,
        )

    pool = None
    if any(r.kind in ("certify", "cfx") for r in config.rules):
        if offload.engine == "dask":  # lanes on the cluster; it is reached at the first job
            pool = OffloadPool(
                DaskCluster(offload.scheduler),
                offload.workers,
                metrics,
                offload.max_pending,
                offload.timeout_seconds,
                "default",
            )
        else:
            pool = make_pool("default", offload.workers, offload.timeout_seconds)
    context = RuleContext(
        metrics,
        pool,
        make_pool,
        out.verifications_topic,
        out.certifications_topic,
        out.dead_letter_topic,
        out.alerts_topic,
    )
    return [build_rule(r, context) for r in config.rules]


def build_pipeline(config: Config, metrics: Metrics) -> Pipeline:
    out = config.outputs
    rules = build_rules(config, metrics)
    pools: dict[str, set[str]] = {}
    for rule in rules:
        for pool, kinds in rule.offload_jobs().items():
            pools.setdefault(pool, set()).update(kinds)
    metrics.start({r.name: (r.kind, r.backend) for r in rules}, pools)
    if config.kafka is not None:
        k = config.kafka
        security = k.security()
        source = KafkaSource(
            sorted({t for r in rules for t in r.topics}),
            k.bootstrap_servers,
            k.group_id,
            k.client_id,
            k.auto_offset_reset,
            "read_committed",
            k.session_timeout_ms,
            k.fetch_max_wait_ms,
            security,
            partition_fetch_bytes=k.max_partition_fetch_bytes,
        )
        transactional_id = (
            k.instance_transactional_id(socket.gethostname()) if k.exactly_once else None
        )
        sink = KafkaSink(k.bootstrap_servers, k.group_id, k.client_id, transactional_id, security)
        max_batch, timeout = k.max_batch, k.fetch_timeout_ms
        store: StateStore = FileStore(config.state.dir, config.state.keep)
        if config.state.store == "kafka":
            store = KafkaStore(
                k.bootstrap_servers,
                config.state.topic_for(k.group_id),
                sorted({t for r in rules for t in r.topics if r.stateful}),
                security,
                config.state.chunk_bytes,
                config.state.max_segments,
                k.client_id,
            )
    else:
        f = config.files
        source = JsonLinesSource(f.decisions, f.topic, config.state.dir / "file-offsets.json")
        files = {
            out.alerts_topic: out.alerts_file,
            out.dead_letter_topic: out.dead_letter_file,
            out.verifications_topic: out.verifications_file,
            out.certifications_topic: out.certifications_file,
        }
        sink = JsonLinesSink({topic: path for topic, path in files.items() if path is not None})
        max_batch, timeout = f.max_batch, 100  # the wait at the end of the file
        store = FileStore(config.state.dir, config.state.keep)
    settings = PipelineSettings(
        dead_letter_topic=out.dead_letter_topic,
        max_batch=max_batch,
        fetch_timeout_ms=timeout,
        snapshot_every_events=config.state.snapshot_every_events,
        snapshot_every_seconds=config.state.snapshot_every_seconds,
        fail_on_history_gap=config.state.on_history_gap == "fail",
    )
    return Pipeline(rules, source, sink, store, metrics, settings)


async def run_daemon(
    config: Config, until_idle: bool = False, stop: asyncio.Event | None = None
) -> Pipeline:
    """Run until SIGTERM/SIGINT (or ``stop``; or, with ``until_idle``, until the source is
    drained), then drain, snapshot, commit and close within the shutdown deadline."""
    allocator_tuned = keep_freed_memory()
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
    try:
        await pipeline.sink.start()
        await pipeline.store.start()
        await pipeline.source.start(pipeline.on_assign, pipeline.on_revoke)
    except (BrokerUnavailable, BrokerRejected, StateTopicError):
        await _close(pipeline, server)
        for rule in pipeline.rules:
            rule.close()
        raise
    collect_between_batches()
    log.info(
        "started",
        rules=[r.name for r in pipeline.rules],
        metrics_port=server.port if server else None,
        allocator_tuned=allocator_tuned,
    )
    try:
        await pipeline.run(stop, until_idle)
    except Exception:
        log.exception("pipeline_failed", delivery_failed=pipeline.failed)
        raise
    finally:
        log.info("stopping", deadline_seconds=config.shutdown.deadline_seconds)
        deadline = config.shutdown.deadline_seconds
        try:
            await asyncio.wait_for(_shutdown(pipeline, server, deadline / 2), deadline)
        except TimeoutError:
            log.error("shutdown_deadline_exceeded")
            raise
        finally:
            for rule in pipeline.rules:
                rule.close()
    log.info("stopped")
    return pipeline


async def _shutdown(pipeline: Pipeline, server: OpsServer | None, drain_seconds: float) -> None:
    """Finish offloaded jobs (for at most ``drain_seconds``: the rest run again after the
    restart, as their offsets stay uncommitted), deliver, snapshot, commit, close."""
    drains = [asyncio.ensure_future(rule.drain()) for rule in pipeline.rules]
    _, late = await asyncio.wait(drains, timeout=drain_seconds)
    for task in late:
        task.cancel()
    if late:
        log.warning("shutdown_left_jobs_running")
    await pipeline.deliver_completed()
    await pipeline.snapshot_all()
    await _close(pipeline, server)


async def _close(pipeline: Pipeline, server: OpsServer | None) -> None:
    await pipeline.source.stop()
    await pipeline.store.stop()
    await pipeline.sink.stop()
    if server:
        await server.stop()
