"""Prometheus metrics (``vigil_*``), kept in a registry of their own per daemon."""

from __future__ import annotations

import contextlib
import platform
from collections.abc import Iterable, Mapping

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from vigil import __version__

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

# The label values known before the first event, which ``Metrics.start`` creates at 0 so that
# rate() and increase() see a counter's first increment (a series that first appears at 1
# looks to them like one that never moved).
DECISION_OUTCOMES = ("checked", "flagged", "replayed", "dead_letter")
"""``vigil_events`` outcomes of a rule that reads decisions (ior, reach, cfx)."""
RULE_OUTCOMES: dict[str, tuple[str, ...]] = {
    "certify": ("checked", "dead_letter"),
    "serving-forward": ("checked", "dead_letter"),
}
"""Outcomes of the rule kinds that read records of their own instead of decisions."""
UNROUTED_OUTCOMES = ("unrouted", "dead_letter")
"""``vigil_events`` outcomes of rule "": decisions no rule matched, undecodable events."""
DEAD_LETTER_REASONS = (
    "undecodable",
    "non_finite",
    "schema",
    "dimension",
    "model",
    "invalid_request",
    "category",
    "unmatched",
    "failed",
)
"""Every ``reason`` of a dead letter (connectors/schemas/dead_letter.json)."""
SNAPSHOT_OUTCOMES = ("written", "failed", "loaded", "skipped_corrupt", "ignored_stale")
JOB_OUTCOMES = ("ok", "invalid", "error", "timeout")
"""``JobOutcome.status`` values (daemon/offload.py)."""
RESTART_REASONS = ("timeout", "worker_died")
VERIFICATION_STATUSES = ("holds", "violated", "unknown", "error")
"""Statuses of a reach rule's verification step (connectors/schemas/verification.json)."""
"""The jobs a reach rule runs in its own lane (daemon/adapters/reach.py)."""


class Metrics:
    """The documented series; see docs/operations.md for what each one means."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        ProcessCollector(registry=r)  # process_resident_memory_bytes, _cpu_seconds, _open_fds
        PlatformCollector(registry=r)
        GCCollector(registry=r)  # python_gc_collections_total, by generation
        Gauge(
            "vigil_build_info",
            "Always 1; the running Vigil's version and Python in its labels.",
            ["version", "python"],
            registry=r,
        ).labels(__version__, platform.python_version()).set(1)
        self.events = Counter(
            "vigil_events",
            "Decision events by rule and outcome "
            "(checked, flagged, replayed, dead_letter; rule '' for unrouted).",
            ["rule", "outcome"],
            registry=r,
        )
        self.witnesses = Counter(
            "vigil_witnesses", "Witness pairs found, by rule.", ["rule"], registry=r
        )
        self.alerts = Counter("vigil_alerts", "Alerts emitted, by rule.", ["rule"], registry=r)
        self.dead_letters = Counter(
            "vigil_dead_letters",
            "Events sent to the dead-letter sink, by reason.",
            ["reason"],
            registry=r,
        )
        self.check_seconds = Histogram(
            "vigil_check_seconds",
            "Time of one check_batch call, by rule and backend.",
            ["rule", "backend"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_seconds = Histogram(
            "vigil_batch_seconds",
            "Time to check one fetched batch and start its delivery (once the delivery "
            "before it is acknowledged).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.delivery_wait = Counter(
            "vigil_delivery_wait_seconds",
            "Time the loop waited for deliveries (answers acknowledged, offsets committed) "
            "before going on: the broker's share of the loop's time.",
            registry=r,
        )
        self.history_size = Gauge(
            "vigil_history_size",
            "Decisions held by a rule's monitor, per partition.",
            ["rule", "topic", "partition"],
            registry=r,
        )
        self.consumer_lag = Gauge(
            "vigil_consumer_lag",
            "Records between the read position and the partition end.",
            ["topic", "partition"],
            registry=r,
        )
        self.snapshot_seconds = Histogram(
            "vigil_snapshot_seconds",
            "Time to write one state snapshot.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.snapshots = Counter(
            "vigil_snapshots",
            "State snapshots by outcome (written, failed, loaded, skipped_corrupt, ignored_stale).",
            ["outcome"],
            registry=r,
        )
        self.offload_pending = Gauge(
            "vigil_offload_pending_jobs",
            "Jobs submitted to an offload pool and not finished (queued or running).",
            ["pool"],
            registry=r,
        )
        self.jobs = Counter(
            "vigil_offload_jobs",
            "Finished offload jobs by pool, kind and outcome (ok, invalid, error, timeout).",
            ["pool", "kind", "outcome"],
            registry=r,
        )
        self.job_seconds = Histogram(
            "vigil_offload_job_seconds",
            "Time from submission to result of one offload job (queueing included).",
            ["pool", "kind"],
            buckets=(*LATENCY_BUCKETS, 30, 60, 300),
            registry=r,
        )
        self.worker_restarts = Counter(
            "vigil_offload_worker_restarts",
            "Offload workers stopped and replaced, by pool and reason (timeout, worker_died).",
            ["pool", "reason"],
            registry=r,
        )
        self.verifications = Counter(
            "vigil_verifications",
            "Online verification steps by rule and status (holds, violated, unknown, error).",
            ["rule", "status"],
            registry=r,
        )
        self.verification_coverage = Gauge(
            "vigil_verification_coverage_ratio",
            "Share of the current input set in verified branches, by rule.",
            ["rule"],
            registry=r,
        )
        self.assigned_partitions = Gauge(
            "vigil_assigned_partitions", "Partitions assigned to this instance.", registry=r
        )
        self.outbox = Gauge(
            "vigil_outbox_messages",
            "Exactly-once outputs waiting for the commit of their record (a job holds it).",
            registry=r,
        )
        self.history_gaps = Counter(
            "vigil_history_gaps",
            "Partitions found lacking records retention deleted before a snapshot covered "
            "them, by rule (rule '': records deleted before they were answered).",
            ["rule"],
            registry=r,
        )
        self.history_complete = Gauge(
            "vigil_history_complete",
            "1 while a stateful rule's history of a partition is complete, 0 once it lacks "
            "records (its alerts then carry history_complete = false).",
            ["rule", "topic", "partition"],
            registry=r,
        )

        self.serving_waiting = Gauge(
            "vigil_serving_waiting",
            "Requests and responses of a serving-stack rule waiting for their other side, per "
            "partition of its join topic.",
            ["rule", "topic", "partition"],
            registry=r,
        )
        self.serving_read_ahead = Gauge(
            "vigil_serving_read_ahead",
            "Records of a serving stack's partition read and held for the time-ordered merge "
            "(the partition is paused at the rule's join_pending_limit).",
            ["rule", "topic", "partition"],
            registry=r,
        )
        self.serving_unmatched = Counter(
            "vigil_serving_unmatched",
            "Requests and responses that never met their other side (dead letters 'unmatched'), "
            "by side and why: timeout, superseded.",
            ["rule", "side", "why"],
            registry=r,
        )
        self.decode_worker_events = Counter(
            "vigil_decode_worker_events",
            "Decision events of large batches read in the decode worker process (the others "
            "are read in the loop).",
            registry=r,
        )
        self.decode_wait = Counter(
            "vigil_decode_wait_seconds",
            "Time the loop waited for the decode worker to finish reading a held batch: the "
            "worker's share of the loop's time.",
            registry=r,
        )
        self.decode_worker_failures = Counter(
            "vigil_decode_worker_failures",
            "Decode worker processes that failed and were stopped (their batch was read in "
            "the loop; the next large batch starts another).",
            registry=r,
        )
        self.delivery_recoveries = Counter(
            "vigil_delivery_recoveries",
            "Deliveries that failed because the broker did not answer, after which the "
            "daemon made a new producer and resumed its partitions from their commits.",
            registry=r,
        )

    def watch_broker(self) -> tuple[Gauge, Counter]:
        """The broker's reachability series (made only where there is a broker: with the
        files source they would read as an outage)."""
        up = Gauge(
            "vigil_broker_up",
            "1 while the Kafka cluster answers the daemon's probe, 0 while it does not.",
            registry=self.registry,
        )
        away = Counter(
            "vigil_broker_unreachable_seconds",
            "Seconds during which the Kafka cluster did not answer the daemon's probe.",
            registry=self.registry,
        )
        return up, away

    def start(
        self, rules: Mapping[str, tuple[str, str]], pools: Mapping[str, Iterable[str]]
    ) -> None:
        """Create, at 0, every counter and histogram series whose labels are known at
        start-up: ``rules`` maps each rule's name to its kind and backend, ``pools`` each
        offload pool's name to the job kinds it runs (``Rule.offload_jobs``). Without this a
        series appears only with its first observation, and ``rate()``, ``increase()`` and
        the alerts built on them miss that one."""
        for reason in DEAD_LETTER_REASONS:
            self.dead_letters.labels(reason)
        for outcome in SNAPSHOT_OUTCOMES:
            self.snapshots.labels(outcome)
        for outcome in UNROUTED_OUTCOMES:
            self.events.labels("", outcome)
        self.history_gaps.labels("")
        for rule, (kind, backend) in rules.items():
            self.history_gaps.labels(rule)
            self.check_seconds.labels(rule, backend)
            outcomes = RULE_OUTCOMES.get(kind, DECISION_OUTCOMES)
            for outcome in outcomes:
                self.events.labels(rule, outcome)
            if "flagged" in outcomes:
                self.witnesses.labels(rule)
                self.alerts.labels(rule)
            if kind == "reach":
                for status in VERIFICATION_STATUSES:
                    self.verifications.labels(rule, status)
        for pool, kinds in pools.items():
            for reason in RESTART_REASONS:
                self.worker_restarts.labels(pool, reason)
            for kind in kinds:
                self.job_seconds.labels(pool, kind)
                for outcome in JOB_OUTCOMES:
                    self.jobs.labels(pool, kind, outcome)

    def forget_partition(self, topic: str, partition: int, rules: list[str]) -> None:
        """Drop the per-partition series of a revoked partition."""
        labels = (topic, str(partition))
        _remove(self.consumer_lag, labels)
        for rule in rules:
            _remove(self.history_size, (rule, *labels))
            _remove(self.history_complete, (rule, *labels))
            _remove(self.serving_waiting, (rule, *labels))
            _remove(self.serving_read_ahead, (rule, *labels))

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _remove(metric: Gauge, labels: tuple[str, ...]) -> None:
    with contextlib.suppress(KeyError):
        metric.remove(*labels)
