"""Counters whose labels are known at start-up exist at 0 before the first event, so that
Prometheus' rate() and increase() (and the alerts built on them) see the first increment."""

from __future__ import annotations

import json
from importlib.resources import files

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from vigil.daemon.config import parse_config
from vigil.daemon.metrics import (
    DEAD_LETTER_REASONS,
    JOB_OUTCOMES,
    SNAPSHOT_OUTCOMES,
    VERIFICATION_STATUSES,
    Metrics,
)


def _samples(metrics: Metrics) -> dict[tuple[str, frozenset], float]:
    """Every rendered sample, by name and labels."""
    text = metrics.render().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _zero(samples: dict, name: str, **labels: str) -> bool:
    return samples.get((name, frozenset(labels.items()))) == 0


RULES = {
    "fair": ("ior", "auto"),
    "verify": ("reach", "reach"),
    "knn": ("certify", "knn"),
    "explain": ("cfx", "apas"),
}
POOLS = {"default": ["certify.knn", "cfx.apas"], "verify": ["reach.load", "reach.step"]}


def test_start_creates_the_known_counter_series_at_zero():
    metrics = Metrics()
    metrics.start(RULES, POOLS)
    s = _samples(metrics)

    for reason in DEAD_LETTER_REASONS:
        assert _zero(s, "vigil_dead_letters_total", reason=reason), reason
    assert set(DEAD_LETTER_REASONS) >= {"schema", "dimension", "non_finite", "undecodable"}
    for outcome in SNAPSHOT_OUTCOMES:
        assert _zero(s, "vigil_snapshots_total", outcome=outcome), outcome
    for outcome in ("unrouted", "dead_letter"):
        assert _zero(s, "vigil_events_total", rule="", outcome=outcome)

    for rule in ("fair", "verify", "explain"):  # rules that read decisions
        for outcome in ("checked", "flagged", "replayed", "dead_letter"):
            assert _zero(s, "vigil_events_total", rule=rule, outcome=outcome), (rule, outcome)
        assert _zero(s, "vigil_witnesses_total", rule=rule)
        assert _zero(s, "vigil_alerts_total", rule=rule)
    for outcome in ("checked", "dead_letter"):
        assert _zero(s, "vigil_events_total", rule="knn", outcome=outcome)
    assert ("vigil_events_total", frozenset({"rule": "knn", "outcome": "flagged"}.items())) not in s

    for status in VERIFICATION_STATUSES:
        assert _zero(s, "vigil_verifications_total", rule="verify", status=status), status
    verified = {dict(labels)["rule"] for name, labels in s if name == "vigil_verifications_total"}
    assert verified == {"verify"}

    for pool, kinds in POOLS.items():
        for reason in ("timeout", "worker_died"):
            assert _zero(s, "vigil_offload_worker_restarts_total", pool=pool, reason=reason)
        for kind in kinds:
            for outcome in JOB_OUTCOMES:
                assert _zero(s, "vigil_offload_jobs_total", pool=pool, kind=kind, outcome=outcome)
    jobs = {
        (dict(labels)["pool"], dict(labels)["kind"])
        for name, labels in s
        if name == "vigil_offload_jobs_total"
    }
    assert jobs == {(pool, kind) for pool, kinds in POOLS.items() for kind in kinds}

    # the latency histograms of every rule and job kind, with nothing observed
    for rule, (_, backend) in RULES.items():
        assert _zero(s, "vigil_check_seconds_count", rule=rule, backend=backend), rule
    for pool, kinds in POOLS.items():
        for kind in kinds:
            assert _zero(s, "vigil_offload_job_seconds_count", pool=pool, kind=kind), kind

    # counters only carry values; nothing was counted
    counted = [
        v for (name, _), v in s.items() if name.startswith("vigil_") and name.endswith("_total")
    ]
    assert counted and all(v == 0 for v in counted)


def test_start_keeps_counts_and_can_run_twice():
    metrics = Metrics()
    metrics.dead_letters.labels("schema").inc(3)
    metrics.start(RULES, POOLS)
    metrics.start(RULES, POOLS)
    s = _samples(metrics)
    assert s[("vigil_dead_letters_total", frozenset({"reason": "schema"}.items()))] == 3
    assert _zero(s, "vigil_dead_letters_total", reason="dimension")


def test_label_values_match_the_event_schemas():
    schemas = files("vigil.connectors") / "schemas"
    dead = json.loads((schemas / "dead_letter.json").read_text())
    assert set(DEAD_LETTER_REASONS) == set(dead["properties"]["reason"]["enum"])
    verification = json.loads((schemas / "verification.json").read_text())
    assert set(VERIFICATION_STATUSES) == set(verification["properties"]["status"]["enum"])


def test_build_pipeline_starts_the_metrics(tmp_path):
    """The daemon's wiring creates the series of the rules it builds."""
    from tests.onnx_models import mlp
    from vigil.daemon.service import build_pipeline

    model = tmp_path / "m.onnx"
    model.write_bytes(mlp([(np.ones((2, 4)), np.zeros(4)), (np.ones((4, 2)), np.zeros(2))]))
    (tmp_path / "d.jsonl").write_bytes(b"")
    config = parse_config(
        {
            "files": {"decisions": str(tmp_path / "d.jsonl"), "topic": "decisions"},
            "outputs": {
                "alerts_file": str(tmp_path / "a.jsonl"),
                "dead_letter_file": str(tmp_path / "dl.jsonl"),
                "verifications_file": str(tmp_path / "v.jsonl"),
                "certifications_file": str(tmp_path / "c.jsonl"),
            },
            "state": {"dir": str(tmp_path / "state")},
            "rules": [
                {"name": "fair", "kind": "ior", "topic": "decisions", "eps": 0.1},
                {
                    "name": "verify",
                    "kind": "reach",
                    "topic": "decisions",
                    "model": "m",
                    "onnx": str(model),
                    "C": [[1.0, 0.0]],
                    "d": [1.0],
                },
                {"name": "explain", "kind": "cfx", "topic": "decisions", "onnx": str(model)},
            ],
        }
    )
    metrics = Metrics()
    pipeline = build_pipeline(config, metrics)
    try:
        s = _samples(metrics)
    finally:
        for rule in pipeline.rules:
            rule.close()
    assert _zero(s, "vigil_events_total", rule="fair", outcome="checked")
    assert _zero(s, "vigil_verifications_total", rule="verify", status="violated")
    assert _zero(s, "vigil_verifications_total", rule="verify", status="error")
    for kind in ("reach.load", "reach.step"):
        assert _zero(s, "vigil_offload_jobs_total", pool="verify", kind=kind, outcome="timeout")
    assert _zero(s, "vigil_offload_jobs_total", pool="default", kind="cfx.apas", outcome="invalid")
    for pool in ("default", "verify"):
        assert _zero(s, "vigil_offload_worker_restarts_total", pool=pool, reason="worker_died")
    assert _zero(s, "vigil_snapshots_total", outcome="skipped_corrupt")


def test_process_metrics_and_build_info_are_exported():
    import platform

    import vigil

    s = _samples(Metrics())
    build = frozenset({"version": vigil.__version__, "python": platform.python_version()}.items())
    assert s[("vigil_build_info", build)] == 1
    names = {name for name, _ in s}
    assert {
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
    } <= names
