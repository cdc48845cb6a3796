"""The rule protocol the pipeline drives, and the i.o.r. monitor rule."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
from vigil.connectors.base import OutMessage, TopicPartition
from vigil.connectors.events import Decision, Record
from vigil.daemon.alerts import witness_alerts
from vigil.daemon.config import IorRuleConfig
from vigil.daemon.metrics import Metrics
from vigil.daemon.offload import OffloadPool
from vigil.rules.ior import Monitor, MonitorSpec
from vigil.rules.ior.backends import parse_backend
from vigil.rules.ior.embedding import OnnxEmbedding
from vigil.rules.reach.network import Network, load_checked


class StaleSnapshot(ValueError):
    """A snapshot made under a rule configuration that has changed since: the state is
    rebuilt by replaying the partition instead."""


@dataclass(frozen=True)
class RuleContext:
    """What rules get from the daemon: metrics, the shared offload pool, output topics, and a
    way to make a pool of their own (a stateful worker lane)."""

    metrics: Metrics
    pool: OffloadPool | None
    make_pool: Callable[[str, int, float], OffloadPool]
    verifications_topic: str = "vigil.verifications"
    certifications_topic: str = "vigil.certifications"
    dead_letter_topic: str = "vigil.dead-letters"


@dataclass(frozen=True, slots=True)
class Answer:
    """An output message and the record it answers. With exactly-once delivery it goes out
    in the transaction whose commit passes that record, and not before: a crash before then
    replays the record, which answers it again."""

    tp: TopicPartition
    offset: int
    message: OutMessage

    @classmethod
    def to(cls, record: Record, message: OutMessage) -> Answer:
        return cls((record.topic, record.partition), record.offset, message)


@dataclass
class RuleResult:
    """What a rule made of one batch: witness alerts, other events, dead letters."""

    alerts: list[dict[str, Any]] = field(default_factory=list)
    events: list[Answer] = field(default_factory=list)
    dead: list[tuple[Record, str, str]] = field(default_factory=list)
    checked: int = 0
    flagged: int = 0
    witnesses: int = 0
    seconds: float = 0.0


def read_model(path: Path, rule: str) -> tuple[bytes, Network]:
    """A rule's ONNX file and the network in it (checked against onnxruntime), or an error
    naming the rule and the file, so a bad model stops the daemon at startup."""
    try:
        onnx = Path(path).read_bytes()
    except OSError as e:
        raise ValueError(f"rule {rule!r}: cannot read onnx {path}: {e.strerror}") from None
    try:
        network, _ = load_checked(onnx)
    except ValueError as e:
        raise ValueError(f"rule {rule!r}: onnx {path}: {e}") from None
    return onnx, network


class Rule:
    """What the pipeline asks of a rule. Defaults suit a stateless rule without jobs.

    A rule reads decisions (``check``, records decoded by the pipeline) or raw records
    (``handle``) per topic. Work offloaded to a pool finishes later: ``completed`` hands over
    its events, and ``hold`` names the oldest record of a partition still waiting for one, so
    the pipeline commits no further.
    """

    kind = ""
    stateful = False
    backend = ""

    def __init__(self, name: str, topics: set[str]) -> None:
        self.name = name
        self.topics = topics

    def wants_decisions(self, topic: str) -> bool:
        return True

    def matches(self, decision: Decision) -> bool:
        return True

    async def check(
        self, tp: TopicPartition, decisions: list[Decision], emit_from: int
    ) -> RuleResult:
        return RuleResult()

    async def handle(self, tp: TopicPartition, records: list[Record], emit_from: int) -> RuleResult:
        return RuleResult()

    def history_size(self, tp: TopicPartition) -> int:
        return 0

    def hold(self, tp: TopicPartition) -> int | None:
        return None

    def completed(self) -> list[Answer]:
        return []

    def in_flight(self) -> bool:
        return False

    def saturated(self) -> bool:
        return False

    async def wait_for_space(self) -> None:
        return None

    async def drain(self) -> None:
        """Wait for this rule's offloaded work (shutdown)."""
        return None

    def snapshot(self, tp: TopicPartition) -> bytes | None:
        return None

    def restore(self, tp: TopicPartition, blob: bytes) -> None:
        return None

    def drop(self, tp: TopicPartition) -> None:
        """Forget a revoked partition."""
        return None

    def close(self) -> None:
        return None


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
        self.backend = config.backend
        self.monitors: dict[TopicPartition, Monitor] = {}
        self.embedding: OnnxEmbedding | None = None
        self.embedding_dim = 0
        if config.embedding_onnx is not None:
            self.embedding, self.embedding_dim = _read_embedding(config)

    def matches(self, decision: Decision) -> bool:
        return decision.record.topic == self.config.topic and (
            self.config.model is None or decision.model == self.config.model
        )

    def history_size(self, tp: TopicPartition) -> int:
        monitor = self.monitors.get(tp)
        return monitor.size if monitor else 0

    async def check(
        self, tp: TopicPartition, decisions: list[Decision], emit_from: int
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
        w = monitor.check_batch(x, y, [d.id for d in good])
        result.seconds = time.perf_counter() - started
        result.checked, result.flagged, result.witnesses = len(good), len(w.flagged), w.pairs
        rows = w.flagged
        if self.config.ratio_threshold is not None:
            rows = rows[w.ratio[rows] > self.config.ratio_threshold]
        emit = [i for i in rows.tolist() if good[i].record.offset >= emit_from]
        if emit:

            def context(i: int) -> tuple[str, dict[str, Any]]:
                return good[i].model, good[i].record.source

            result.alerts = list(
                witness_alerts(
                    self.name,
                    monitor,
                    w,
                    context,
                    _json_output,
                    rows=emit,
                    max_witnesses=self.config.max_witnesses,
                )
            )
        return result

    def _read_inputs(self, decisions: list[Decision], result: RuleResult) -> list[Decision]:
        """Each decision with ``x`` replaced by the input this rule compares (its embedding,
        or its named features in the configured order); the others are dead-lettered."""
        out = []
        for d in decisions:
            value, problem = _configured_input(d.event, self.config)
            if problem:
                result.dead.append((d.record, "schema", problem))
            else:
                out.append(replace(d, x=value))
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

    def snapshot(self, tp: TopicPartition) -> bytes | None:
        monitor = self.monitors.get(tp)
        return monitor.snapshot() if monitor else None

    def restore(self, tp: TopicPartition, blob: bytes) -> None:
        """Continue from a snapshot; one taken under another comparison (spec fields or
        embedding model) is refused with ``StaleSnapshot``. A new backend or history limit
        applies to the restored history (every backend finds the same witnesses)."""
        monitor = Monitor.restore(blob)
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

    def drop(self, tp: TopicPartition) -> None:
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


def _first_length(decisions: list[Decision], field_name: str = "x") -> int:
    for d in decisions:
        value = getattr(d, field_name)
        if isinstance(value, list) and value:
            return len(value)
    return 0


def _as_arrays(decisions, dim: int, out_dim: int, labels: bool):
    """The batch as arrays when every event is well-formed (the common case), else None."""
    try:
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
    if not isinstance(d.x, list) or not d.x or not all(isinstance(v, int | float) for v in d.x):
        return "schema", "x must be a non-empty array of numbers"
    if len(d.x) != dim:
        return "dimension", f"x has {len(d.x)} values, the rule expects {dim}"
    if labels:
        if not isinstance(d.y, int) or not -(2**63) <= d.y < 2**63:
            return "schema", "y must be an integer label (64-bit) for this rule"
        return None
    if not isinstance(d.y, list) or not all(isinstance(v, int | float) for v in d.y):
        return "schema", "y must be an array of numbers (probabilities) for this rule"
    if len(d.y) != out_dim:
        return "dimension", f"y has {len(d.y)} values, the rule expects {out_dim}"
    return None


def _json_output(y: Any) -> Any:
    return y.tolist() if isinstance(y, np.ndarray) else int(y)
