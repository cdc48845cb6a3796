"""The i.o.r. rule: each decision checked against its partition's history, witness sets
emitted as alert events (the alert contract of docs/architecture.md)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from vigil.connectors.base import OutMessage, TopicPartition
from vigil.connectors.events import Decision, DecisionRun, encode, now_iso
from vigil.daemon.adapters.base import (
    Answer,
    Rule,
    RuleContext,
    RuleResult,
    StaleSnapshot,
    StatePart,
)
from vigil.daemon.config import IorRuleConfig
from vigil.rules.ior import Monitor, MonitorSpec, OutputKind, Witnesses
from vigil.rules.ior.backends import parse_backend
from vigil.rules.ior.embedding import OnnxEmbedding

ALERT_SCHEMA_VERSION = 1
"""Bumped on any incompatible change to the alert event (connectors/schemas/alert.json)."""


class IorRule(Rule):
    """The i.o.r. monitor over one topic (and optionally one model's decisions).

    A model's decisions share a partition (they are keyed by model), so one monitor per
    partition holds every decision the rule must compare.
    """

    kind = "ior"
    stateful = True

    def __init__(self, config: IorRuleConfig, context: RuleContext | None = None) -> None:
        super().__init__(config.name, {config.topic})
        self.config = config
        self.alerts_topic = context.alerts_topic if context else RuleContext.alerts_topic
        self.backend = config.backend
        self.monitors: dict[TopicPartition, Monitor] = {}
        self.incomplete: set[TopicPartition] = set()  # histories that lack records
        self.embedding: OnnxEmbedding | None = None
        self.embedding_dim = 0
        if config.embedding_onnx is not None:
            self.embedding, self.embedding_dim = _read_embedding(config)

    def serves(self, model: str) -> bool:
        return self.config.model is None or model == self.config.model

    def history_size(self, tp: TopicPartition) -> int:
        monitor = self.monitors.get(tp)
        return monitor.size if monitor else 0

    async def check(
        self, tp: TopicPartition, decisions: Sequence[Decision], emit_from: int
    ) -> RuleResult:
        """Check decisions of one partition in order; alerts only for offsets >= emit_from
        (earlier ones are being replayed into the state after a restart)."""
        result = RuleResult()
        if self.config.features is not None or self.config.input == "embedding":
            decisions = self._read_inputs(decisions, result)
        monitor = self.monitors.get(tp)
        if self.embedding is not None:
            dim = self.config.input_dim or self.embedding.input_dim
        else:
            dim = monitor.spec.dim if monitor else self.config.input_dim
        dim = dim or _first_length(decisions)
        out_dim = monitor.spec.output_dim if monitor else _first_length(decisions, "y")
        good, x, y = self._validate(decisions, dim, out_dim, result)
        if not good:
            return result
        if monitor is None:
            name, options = parse_backend(self.config.backend)
            monitor = self.monitors[tp] = Monitor(
                self._spec(self.embedding_dim or dim, out_dim),
                name,
                self.embedding,
                self.config.history_limit,
                **options,
            )
        started = time.perf_counter()
        ids = good.ids if isinstance(good, DecisionRun) else [d.id for d in good]
        w = monitor.check_batch(x, y, ids)
        result.seconds = time.perf_counter() - started
        result.checked = len(good)
        rows = w.flagged
        if self.config.ratio_threshold is not None:
            rows = rows[w.ratio[rows] > self.config.ratio_threshold]
        emit = [i for i in rows.tolist() if good[i].record.offset >= emit_from]
        if emit:

            def context(i: int) -> tuple[str, dict[str, Any]]:
                return good[i].model, good[i].record.source

            alerts = witness_alerts(
                self.name,
                monitor,
                w,
                context,
                None,
                rows=emit,
                max_witnesses=self.config.max_witnesses,
                history_complete=tp not in self.incomplete,
            )
            for i, alert in alerts:
                message = OutMessage(self.alerts_topic, alert["model"].encode(), encode(alert))
                result.events.append(Answer.to(good[i].record, message))
                result.alert_witnesses += len(alert["witnesses"])
            result.alerts = len(emit)
        return result

    def _read_inputs(self, decisions: Sequence[Decision], result: RuleResult) -> list[Decision]:
        """Each decision with ``x`` replaced by the input this rule compares (its embedding,
        or its named features in the configured order); the others are dead-lettered."""
        out = []
        for d in decisions:
            value, problem = _configured_input(d.event, self.config)
            if problem:
                result.dead.append((d.record, "schema", problem))
            else:
                out.append(msgspec.structs.replace(d, x=value))
        return out

    def _spec(self, dim: int, out_dim: int) -> MonitorSpec:
        c = self.config
        return MonitorSpec(
            dim=dim,
            eps=c.eps,
            metric=c.metric,
            output=c.output,
            delta=c.delta,
            output_metric=c.output_metric,
            output_dim=out_dim if c.output != "label" else 1,
            quantitative=c.quantitative or c.ratio_threshold is not None,
            ignore=tuple(c.ignore),
            scale=tuple(c.scale) if c.scale else None,
        )

    def _validate(self, decisions, dim, out_dim, result):
        """Split off the decisions whose x or y cannot be checked, as dead letters."""
        labels = self.config.output == "label"
        x, y = _as_arrays(decisions, dim, out_dim, labels)
        good = decisions
        if x is None:  # some event is malformed: find which, one by one
            good = []
            for d in decisions:
                problem = _problem(d, dim, out_dim, labels)
                if problem:
                    result.dead.append((d.record, *problem))
                else:
                    good.append(d)
            if not good:
                return good, None, None
            x = np.array([d.x for d in good], dtype=np.float64)
            y = np.array([d.y for d in good], dtype=np.int64 if labels else np.float64)
        finite = np.isfinite(x).all(axis=1) & (labels or np.isfinite(y).all(axis=1))
        if not finite.all():
            for i in np.flatnonzero(~finite):
                result.dead.append((good[i].record, "non_finite", "x or y has a NaN or infinity"))
            good = [d for d, ok in zip(good, finite, strict=True) if ok]
            x, y = x[finite], y[finite]
        return good, x, y

    def snapshot(self, tp: TopicPartition, since: int | None = None) -> StatePart | None:
        """The history as a base, or the decisions after stream position ``since`` when
        they are all still held."""
        monitor = self.monitors.get(tp)
        if monitor is None:
            return None
        end, live = monitor.position, monitor.evicted
        if since is None or not live <= since <= end:
            return StatePart(monitor.snapshot(), True, live, end, live)
        return StatePart(monitor.snapshot(since), False, since, end, live)

    def restore(self, tp: TopicPartition, parts: list[bytes]) -> None:
        """Continue from a snapshot; one taken under another comparison (spec fields or
        embedding model) is refused with ``StaleSnapshot``. A new backend or history limit
        applies to the restored history (every backend finds the same witnesses)."""
        monitor = Monitor.restore(*parts)
        spec = monitor.spec
        expected = self._spec(spec.dim, spec.output_dim)
        changed = [
            f.name
            for f in fields(MonitorSpec)
            if getattr(spec, f.name) != getattr(expected, f.name)
        ]
        saved = monitor.embedding.model_bytes if monitor.embedding else b""
        if saved != (self.embedding.model_bytes if self.embedding else b""):
            changed.append("embedding_onnx")
        elif self.embedding is None and self.config.input_dim not in (None, spec.dim):
            changed.append("dim")
        if changed:
            raise StaleSnapshot(f"the rule's {', '.join(changed)} changed since the snapshot")
        monitor.history_limit = self.config.history_limit
        monitor.use_backend(*parse_backend(self.config.backend))
        self.monitors[tp] = monitor

    def mark_history(self, tp: TopicPartition, complete: bool) -> None:
        if complete:
            self.incomplete.discard(tp)
        else:
            self.incomplete.add(tp)

    def drop(self, tp: TopicPartition) -> None:
        self.incomplete.discard(tp)
        self.monitors.pop(tp, None)


def _read_embedding(config: IorRuleConfig) -> tuple[OnnxEmbedding, int]:
    """The rule's embedding model and its output width, or an error naming the rule."""
    path, name = config.embedding_onnx, config.name
    try:
        embedding = OnnxEmbedding(Path(path).read_bytes())
    except OSError as e:
        raise ValueError(
            f"rule {name!r}: cannot read embedding_onnx {path}: {e.strerror}"
        ) from None
    except ValueError as e:
        raise ValueError(f"rule {name!r}: embedding_onnx {path}: {e}") from None
    width = embedding.input_dim
    if width is None and config.input_dim is None:
        raise ValueError(
            f"rule {name!r}: embedding_onnx {path} takes inputs of any width; set dim or features"
        )
    if width is not None and config.input_dim not in (None, width):
        raise ValueError(
            f"rule {name!r}: embedding_onnx {path} takes {width} features, the rule reads "
            f"{config.input_dim}"
        )
    dim = embedding.dim or embedding(np.zeros((1, config.input_dim))).shape[1]
    return embedding, dim


def _first_length(decisions: Sequence[Decision], field_name: str = "x") -> int:
    for d in decisions:
        value = getattr(d, field_name)
        if isinstance(value, list | np.ndarray) and len(value):
            return len(value)
    return 0


def _as_arrays(decisions, dim: int, out_dim: int, labels: bool):
    """The batch as arrays when every event is well-formed (the common case), else None."""
    try:
        if isinstance(decisions, DecisionRun):  # read by the decode worker: one matrix
            x, y = decisions.x, np.array(decisions.ys)
        else:
            x = np.array([d.x for d in decisions])
            y = np.array([d.y for d in decisions])
    except ValueError:  # ragged
        return None, None
    if x.dtype.kind not in "if" or dim == 0 or x.shape != (len(decisions), dim):
        return None, None
    if labels and (y.dtype.kind != "i" or y.ndim != 1):
        return None, None
    if not labels and (y.dtype.kind not in "if" or y.shape != (len(decisions), out_dim)):
        return None, None
    return x.astype(np.float64), y.astype(np.int64 if labels else np.float64)


def _configured_input(event: dict[str, Any], config: IorRuleConfig) -> tuple[Any, str | None]:
    """(the input vector, None), or (None, what is missing) for a rule reading the decision's
    ``embedding`` or its ``features`` by name."""
    if config.features is None:
        if "embedding" not in event:
            return None, "this rule compares embeddings; the decision has no embedding"
        return event["embedding"], None
    features = event.get("features")
    if not isinstance(features, dict):
        return None, "this rule reads named features; the decision has no features object"
    absent = [name for name in config.features if name not in features]
    if absent:
        return None, f"features lack {', '.join(map(repr, absent))}"
    return [features[name] for name in config.features], None


def _problem(d: Decision, dim: int, out_dim: int, labels: bool) -> tuple[str, str] | None:
    # booleans count as 0/1 here, as they do on the fast path (np.array), so that the
    # verdict on an event never depends on the batch it arrived in
    x = d.x.tolist() if isinstance(d.x, np.ndarray) else d.x  # a row of a decisions batch
    if not isinstance(x, list) or not x or not all(isinstance(v, int | float) for v in x):
        return "schema", "x must be a non-empty array of numbers"
    if len(x) != dim:
        return "dimension", f"x has {len(x)} values, the rule expects {dim}"
    if labels:
        if not isinstance(d.y, int) or not -(2**63) <= d.y < 2**63:
            return "schema", "y must be an integer label (64-bit) for this rule"
        return None
    if not isinstance(d.y, list) or not all(isinstance(v, int | float) for v in d.y):
        return "schema", "y must be an array of numbers (probabilities) for this rule"
    if len(d.y) != out_dim:
        return "dimension", f"y has {len(d.y)} values, the rule expects {out_dim}"
    return None


def witness_alerts(
    rule: str,
    monitor: Monitor,
    witnesses: Witnesses,
    context: Callable[[int], tuple[str, dict[str, Any]]],
    output_value: Callable[[Any], Any] | None,
    rows: Iterable[int] | None = None,
    max_witnesses: int | None = None,
    history_complete: bool = True,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """One alert per flagged decision of the batch (restricted to ``rows`` if given), with
    the decision's row in the batch.

    ``context(i)`` gives the batch's i-th decision's model and its source coordinates
    (topic/partition/offset or file/row); ``output_value``, if given, maps each output (an
    int label, or a list of floats) to what the alert shows.
    A witness set larger than ``max_witnesses`` keeps its nearest members (in history
    order) and says so, so that an alert always fits a Kafka message. ``history_complete``
    false says the history lacks records (deleted by retention): witnesses among them are
    missing from the set.
    The batch's ids, outputs and distances are read out of the monitor once, as lists:
    array calls per alert cost more than building the alert (docs/benchmarks.md).
    """
    spec = monitor.spec
    detected_at = now_iso()
    extra = {"delta": spec.delta} if spec.output is OutputKind.PROBABILITIES else {}
    offsets = witnesses.offsets.tolist()
    alerted = [
        i
        for i in map(int, witnesses.flagged if rows is None else rows)
        if offsets[i + 1] > offsets[i]
    ]
    decisions = witnesses.first + np.array(alerted, dtype=np.int64)
    positions = np.concatenate([decisions, witnesses.index])
    ids = monitor.ids(positions.tolist())
    outputs = monitor.outputs(positions).tolist()
    if output_value is not None:
        outputs = [output_value(v) for v in outputs]
    distances = witnesses.distance.tolist()
    at = len(alerted)  # witnesses' slots in ids and outputs start here
    for k, i in enumerate(alerted):
        lo, hi = offsets[i], offsets[i + 1]
        kept: Iterable[int] = range(lo, hi)
        if max_witnesses is not None and hi - lo > max_witnesses:
            kept = sorted(sorted(kept, key=distances.__getitem__)[:max_witnesses])
        model, source = context(i)
        alert = {
            "kind": "alert",
            "schema_version": ALERT_SCHEMA_VERSION,
            "rule": rule,
            "model": model,
            "decision": {"id": ids[k], "y": outputs[k]},
            "witnesses": [
                {"id": ids[at + s], "y": outputs[at + s], "distance": distances[s]} for s in kept
            ],
            "metric": spec.metric.value,
            "eps": spec.eps,
            **extra,
            "source": source,
            "detected_at": detected_at,
            "history_complete": history_complete,
        }
        if len(alert["witnesses"]) < hi - lo:
            alert.update(witness_count=hi - lo, witnesses_truncated=True)
        if witnesses.ratio is not None:
            alert["lipschitz"] = lipschitz(monitor, witnesses, i)
        yield i, alert


def lipschitz(monitor: Monitor, witnesses: Witnesses, i: int) -> dict[str, Any]:
    """The quantitative-mode field: largest d_out / d_in (null when infinite: an identical
    input with another output) and the decision attaining it."""
    ratio = float(witnesses.ratio[i])
    position = int(witnesses.ratio_witness[i])
    return {
        "ratio": ratio if math.isfinite(ratio) else None,
        "witness": monitor.ids([position])[0] if position >= 0 else None,
    }
