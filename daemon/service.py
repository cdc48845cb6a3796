"""Wiring: config -> source, sink, rules, snapshot store, metrics endpoint; run; shut down."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from functools import partial

import structlog
from threadpoolctl import threadpool_limits

from vigil.connectors.files import JsonLinesSink, JsonLinesSource
from vigil.connectors.kafka import (
    BrokerProbe,
    KafkaSink,
    KafkaSource,
    broker_gone,
    ensure_topics,
)
from vigil.connectors.kafka_security import BrokerRejected, BrokerUnavailable, diagnose
from vigil.daemon.adapters import Rule, RuleContext
from vigil.daemon.adapters import build_rules as build_adapters
from vigil.daemon.adapters.serving import serving_topics
from vigil.daemon.broker import BrokerWatch
from vigil.daemon.collector import collect_between_batches
from vigil.daemon.config import Config
from vigil.daemon.decoding import DecodeWorker
from vigil.daemon.http import OpsServer
from vigil.daemon.malloc import keep_freed_memory
from vigil.daemon.metrics import Metrics
from vigil.daemon.offload import DaskCluster, OffloadPool, process_executor
from vigil.daemon.pipeline import Pipeline, PipelineSettings
from vigil.daemon.state import FileStore, KafkaStore, StateStore

log = structlog.get_logger("vigil")

EXIT_SHUTDOWN_INCOMPLETE = 3
"""``vigil run``'s status when stopped on request without finishing (docs/operations.md)."""
_GRACEFUL_SHARE = 0.8
"""Of ``[shutdown] deadline_seconds``, the time the graceful shutdown takes at most; at the
deadline the process ends itself."""
_MIN_CLOSE_SECONDS = 0.2
_DIAGNOSE_SECONDS = 5.0
_STARTUP_POLL_SECONDS = 0.2
_RESTART_SECONDS = 1.0
_stop_signalled = threading.Event()


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
    group = config.kafka.group_id if config.kafka is not None else ""
    return [rule for r in config.rules for rule in build_adapters(r, context, config.seldon, group)]


def internal_topics(config: Config) -> dict[str, list[str]]:
    """The topics Vigil creates for its serving-stack rules, each with the topics its
    partition count follows (none: one partition)."""
    if config.kafka is None:
        return {}
    out: dict[str, list[str]] = {}
    for rule in config.rules:
        if getattr(rule, "format", "vigil") == "vigil":
            continue
        stages = serving_topics(rule, config.seldon, config.kafka.group_id)
        out[stages.join] = []
    return out


def build_pipeline(config: Config, metrics: Metrics) -> Pipeline:
    out = config.outputs
    rules = build_rules(config, metrics)
    pools: dict[str, set[str]] = {}
    for rule in rules:
        for pool, kinds in rule.offload_jobs().items():
            pools.setdefault(pool, set()).update(kinds)
    metrics.start({r.name: (r.kind, r.backend) for r in rules}, pools)
    reader: DecodeWorker | None = None
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
            copartitioned=[r.topics for r in rules if r.merges],
        )
        transactional_id = (
            k.instance_transactional_id(socket.gethostname()) if k.exactly_once else None
        )
        written = [
            out.alerts_topic,
            out.dead_letter_topic,
            out.verifications_topic,
            out.certifications_topic,
            *internal_topics(config),
        ]
        sink = KafkaSink(
            k.bootstrap_servers, k.group_id, k.client_id, transactional_id, security, written
        )
        max_batch, timeout = k.max_batch, k.fetch_timeout_ms
        topics = {t for r in rules for t in r.topics if r.wants_decisions(t)}
        if k.decode_worker and topics:  # a serving stack's rules read no decision events
            reader = DecodeWorker(topics, metrics)
        broker = BrokerWatch(
            BrokerProbe(k.bootstrap_servers, security, k.client_id), metrics, k.bootstrap_servers
        )
        startup_timeout = k.startup_timeout_seconds
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
        broker, startup_timeout = None, PipelineSettings.startup_timeout_seconds
        store = FileStore(config.state.dir, config.state.keep)
    settings = PipelineSettings(
        dead_letter_topic=out.dead_letter_topic,
        max_batch=max_batch,
        fetch_timeout_ms=timeout,
        snapshot_every_events=config.state.snapshot_every_events,
        snapshot_every_seconds=config.state.snapshot_every_seconds,
        fail_on_history_gap=config.state.on_history_gap == "fail",
        startup_timeout_seconds=startup_timeout,
    )
    return Pipeline(rules, source, sink, store, metrics, settings, broker, reader)


class ShutdownIncomplete(Exception):
    """The daemon stopped when asked, but not everything could be finished within
    ``[shutdown] deadline_seconds``: ``pending`` names what was left (uncommitted records are
    read again after the restart, so nothing is lost)."""

    def __init__(self, pending: list[str]) -> None:
        super().__init__(", ".join(pending))
        self.pending = pending


async def run_daemon(
    config: Config, until_idle: bool = False, stop: asyncio.Event | None = None
) -> Pipeline:
    """Run until SIGTERM/SIGINT (or ``stop``; or, with ``until_idle``, until the source is
    drained), then drain, snapshot, commit and close within the shutdown deadline; raise
    ``ShutdownIncomplete`` when that could not all be done in time."""
    allocator_tuned = keep_freed_memory()
    metrics = Metrics()
    pipeline = build_pipeline(config, metrics)
    stop = stop or asyncio.Event()
    deadline = config.shutdown.deadline_seconds
    # one event loop, one core, as each worker process has: the parallelism is the
    # processes', and a BLAS thread pool would contend for the workers' cores
    with _stop_on_signals(asyncio.get_running_loop(), stop, deadline), threadpool_limits(1):
        return await _run(pipeline, config, stop, until_idle, allocator_tuned)


async def _run(
    pipeline: Pipeline,
    config: Config,
    stop: asyncio.Event,
    until_idle: bool,
    allocator_tuned: bool,
) -> Pipeline:
    metrics, deadline = pipeline.metrics, config.shutdown.deadline_seconds
    server = None
    if config.metrics.enabled:
        grace = config.metrics.ready_broker_grace_seconds
        server = OpsServer(
            config.metrics.host,
            config.metrics.port,
            metrics.render,
            partial(_ready, pipeline, grace),
        )
        await server.start()
    if pipeline.broker is not None:
        pipeline.broker.start()
    try:
        started = await _start(pipeline, config, stop)
    except BaseException:
        await _close(pipeline, server, time.monotonic() + deadline)
        raise
    if not started:
        log.info("stopping", deadline_seconds=deadline)
        pending = await _close(pipeline, server, time.monotonic() + deadline * _GRACEFUL_SHARE)
        broker = pipeline.broker
        if broker is not None and broker.up is False and not broker.answered:
            pending.append("the broker never answered")  # not: its first answer was on its way
        return _stopped(pipeline, pending)
    collect_between_batches()
    log.info(
        "started",
        rules=[r.name for r in pipeline.rules],
        metrics_port=server.port if server else None,
        allocator_tuned=allocator_tuned,
    )
    running = asyncio.create_task(pipeline.run(stop, until_idle), name="pipeline")
    try:
        await _until_stopped(running, stop)
    except Exception:
        log.exception("pipeline_failed", delivery_failed=pipeline.failed)
        await _close(pipeline, server, time.monotonic() + deadline)
        raise
    log.info("stopping", deadline_seconds=deadline)
    ends = time.monotonic() + deadline * _GRACEFUL_SHARE
    try:
        pending = await _shutdown(pipeline, running, ends, deadline)
    except Exception as e:  # the loop or the final delivery failed: uncommitted, read again
        pending = [f"the final delivery, commit and snapshots ({e!r})"]
    pending += await _close(pipeline, server, ends)
    return _stopped(pipeline, pending)


def _ready(pipeline: Pipeline, grace: float) -> bool:
    """Partitions recovered, and the broker not away longer than ``grace`` seconds."""
    broker = pipeline.broker
    return pipeline.ready() and (broker is None or broker.unreachable_for() <= grace)


@contextlib.contextmanager
def _stop_on_signals(
    loop: asyncio.AbstractEventLoop, stop: asyncio.Event, deadline: float
) -> Iterator[None]:
    """SIGTERM and SIGINT set ``stop`` while the daemon runs (in the main thread; elsewhere
    the caller stops it); the previous handlers are put back after."""
    previous = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(ValueError):
            previous[sig] = signal.signal(sig, partial(_stop_within, loop, stop, deadline))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stop_within(
    loop: asyncio.AbstractEventLoop, stop: asyncio.Event, deadline: float, *_: object
) -> None:
    """A stop signal (handled as it arrives, not when the loop gets to it): stop the loop,
    and end the process at ``deadline`` if the graceful shutdown (given ``_GRACEFUL_SHARE``
    of it) has not: a loop held up in native code cannot run its own timeouts."""
    if stop.is_set() or _stop_signalled.is_set():
        return
    _stop_signalled.set()
    loop.call_soon_threadsafe(stop.set)
    threading.Thread(target=_exit_after, args=(deadline,), daemon=True).start()


def _exit_after(seconds: float) -> None:
    time.sleep(seconds)
    log.warning("shutdown_deadline_exceeded", pending=["the shutdown itself (forced exit)"])
    sys.stderr.flush()
    os._exit(EXIT_SHUTDOWN_INCOMPLETE)


def _stopped(pipeline: Pipeline, pending: list[str]) -> Pipeline:
    """Log how the shutdown ended; raise ``ShutdownIncomplete`` if something was left."""
    if pending:
        log.warning("shutdown_deadline_exceeded", pending=pending)
        raise ShutdownIncomplete(pending)
    log.info("stopped")
    return pipeline


async def _start(pipeline: Pipeline, config: Config, stop: asyncio.Event) -> bool:
    """Start the clients once the broker answers; false if stopped first."""
    if pipeline.broker is not None and not await _wait_for_broker(pipeline.broker, config, stop):
        return False
    wanted = internal_topics(config)
    if wanted:
        assert config.kafka is not None
        servers, security = config.kafka.bootstrap_servers, config.kafka.security()
        if not await _first(ensure_topics(servers, wanted, security), stop):
            return False
    for step in (
        pipeline.sink.start,
        pipeline.store.start,
        partial(pipeline.source.start, pipeline.on_assign, pipeline.on_revoke),
    ):
        if not await _start_client(step, pipeline, config, stop):
            return False
    return True


async def _start_client(
    step: Callable[[], Awaitable[None]], pipeline: Pipeline, config: Config, stop: asyncio.Event
) -> bool:
    """Run the start ``step`` of a client; if the broker stops answering meanwhile (or is
    not serving yet), wait for it and start again, for at most ``[kafka]
    startup_timeout_seconds``. False if stopped first."""
    ends = time.monotonic() + pipeline.settings.startup_timeout_seconds
    while True:
        try:
            return await _first(step(), stop)
        except Exception as error:
            passing = isinstance(error, BrokerUnavailable) or broker_gone(error)
            if not passing or pipeline.broker is None or time.monotonic() > ends:
                raise
            log.warning("client_start_retried", reason=str(error) or type(error).__name__)
        if not await _first(asyncio.sleep(_RESTART_SECONDS), stop):
            return False
        if pipeline.broker is not None and not await _wait_for_broker(
            pipeline.broker, config, stop
        ):
            return False


async def _wait_for_broker(broker: BrokerWatch, config: Config, stop: asyncio.Event) -> bool:
    """Wait until the broker answers (true) or ``stop`` is set (false). A broker that
    refuses these security settings raises ``BrokerRejected`` at once; one that does not
    answer for ``[kafka] startup_timeout_seconds`` raises ``BrokerUnavailable`` with the
    reason the last attempt gave."""
    kafka = config.kafka
    assert kafka is not None
    servers, security = kafka.bootstrap_servers, kafka.security()
    ends = time.monotonic() + kafka.startup_timeout_seconds
    diagnosed = False
    while broker.up is not True:
        if stop.is_set():
            return False
        late = time.monotonic() > ends
        if (broker.up is False and not diagnosed) or late:
            diagnosed = True
            why = await diagnose(servers, security, _DIAGNOSE_SECONDS)
            if isinstance(why, BrokerRejected):
                raise why
            if late:
                raise BrokerUnavailable(
                    f"no broker at {servers} answered for {kafka.startup_timeout_seconds:g} s "
                    f"([kafka] startup_timeout_seconds); last attempt: {why}"
                )
        await _first(asyncio.sleep(_STARTUP_POLL_SECONDS), stop)
    return True


async def _first(work: Awaitable[object], stop: asyncio.Event) -> bool:
    """Await ``work`` unless ``stop`` is set first (then ``work`` is cancelled): whether it
    finished."""
    task = asyncio.ensure_future(work)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([task, stopping], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return False
    task.result()
    return True


async def _until_stopped(running: asyncio.Task, stop: asyncio.Event) -> None:
    """Wait until the loop ends by itself (its failure raised) or ``stop`` is set."""
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([running, stopping], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if running.done():
        running.result()


async def _shutdown(
    pipeline: Pipeline, running: asyncio.Task, ends: float, deadline: float
) -> list[str]:
    """Let the loop finish its batch (a quarter of the deadline: longer means the broker
    does not take its delivery, and the batch is read again after the restart), then
    finish offloaded jobs (for at most half the deadline: the rest run again after the
    restart, as their offsets stay uncommitted), deliver, snapshot and commit, all before
    ``ends``. What could not be done is returned; with an unfinished delivery nothing more
    is committed or snapshotted (an open transaction is aborted, or left to the broker's
    transaction timeout)."""
    done, _ = await asyncio.wait([running], timeout=deadline / 4)
    if not done:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        return ["the loop's wait for the broker (what it read is read again after the restart)"]
    if pipeline.failed:
        if not running.cancelled():
            running.exception()  # the failure is what this returns, not an unread error
        return ["a failed delivery (its records are read again after the restart)"]
    running.result()
    drains = [asyncio.ensure_future(rule.drain()) for rule in pipeline.rules]
    _, late = await asyncio.wait(drains, timeout=deadline / 2) if drains else (set(), set())
    for task in late:
        task.cancel()
    if late:
        log.warning("shutdown_left_jobs_running", jobs=len(late))
    final = asyncio.ensure_future(_deliver_and_snapshot(pipeline))
    done, _ = await asyncio.wait([final], timeout=max(0.0, ends - time.monotonic()))
    if not done:
        final.cancel()
        await asyncio.gather(final, return_exceptions=True)
        return ["the final delivery, commit and snapshots"]
    final.result()
    return []


async def _deliver_and_snapshot(pipeline: Pipeline) -> None:
    await pipeline.deliver_completed()
    await pipeline.snapshot_all()


async def _close(pipeline: Pipeline, server: OpsServer | None, ends: float) -> list[str]:
    """Close the clients, each within its share of the time left before ``ends`` (at least
    a moment each); the ones that did not close in time (the broker did not answer their
    goodbye) are returned."""
    steps: list[tuple[str, Callable[[], Awaitable[None]]]] = [
        ("the consumer's close", pipeline.source.stop),
        ("the state store's close", pipeline.store.stop),
        ("the producer's close", pipeline.sink.stop),
    ]
    if pipeline.broker is not None:
        steps.append(("the broker watch's close", pipeline.broker.stop))
    if server is not None:
        steps.append(("the metrics endpoint's close", server.stop))
    pending = []
    for i, (name, close) in enumerate(steps):
        share = max(_MIN_CLOSE_SECONDS, (ends - time.monotonic()) / (len(steps) - i))
        try:
            async with asyncio.timeout(share):
                await close()
        except TimeoutError:
            pending.append(name)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            # the client awaited a task of its own it had cancelled (a fetch in its retry
            # wait): it is closed all the same
        except Exception as e:  # a client that failed to start may fail to stop
            log.info("close_failed", step=name, error=repr(e))
    for rule in pipeline.rules:
        rule.close()
    if pipeline.reader is not None:
        pipeline.reader.close()
    return pending
