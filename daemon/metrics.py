"""Prometheus metrics (``vigil_*``), kept in a registry of their own per daemon."""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class Metrics:
    """The documented series; see docs/operations.md for what each one means."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
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
            "Time from fetch to acknowledged delivery of one batch.",
            buckets=LATENCY_BUCKETS,
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
            "State snapshots by outcome (written, loaded, skipped_corrupt, ignored_stale).",
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

    def forget_partition(self, topic: str, partition: int, rules: list[str]) -> None:
        """Drop the per-partition series of a revoked partition."""
        labels = (topic, str(partition))
        _remove(self.consumer_lag, labels)
        for rule in rules:
            _remove(self.history_size, (rule, *labels))

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _remove(metric: Gauge, labels: tuple[str, ...]) -> None:
    with contextlib.suppress(KeyError):
        metric.remove(*labels)
