"""A rule on a serving stack's traffic (Seldon Core 2, KServe) as three stages, each a
consume-transform-produce step with the pipeline's commit order (exactly-once with
transactions):

1. ``ServingForward`` sends every request and response of the rule's topics, as it came,
   to the rule's join topic keyed by its join key (the Seldon record key, the KServe event
   id), so a request and its response meet in one partition, in one order;
2. ``ServingJoin`` pairs them there, its waiting side kept as state (snapshotted, restored,
   replayed like any rule's), and sends each pair's rows as one record of decisions
   (connectors/batches.py) to the rule's decisions topic keyed by model, so each model's
   decisions have one order in one partition;
3. the i.o.r. rule itself reads the decisions topic.

A single log per join partition makes the join's replay after a restart see the records
in the order the first pass did, so it pairs and expires them the same way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from vigil.connectors.base import OutMessage, TopicPartition
from vigil.connectors.batches import HEADERS, encode_batch
from vigil.connectors.events import BadEvent, Record, dead_letter, encode, now_iso
from vigil.connectors.serving import kserve, seldon
from vigil.connectors.serving.message import Inference
from vigil.connectors.serving.rows import TensorSelection, decision_rows
from vigil.daemon.adapters.base import Answer, Rule, RuleContext, RuleResult, StatePart
from vigil.daemon.adapters.ior import IorRule
from vigil.daemon.adapters.reach import ReachRule
from vigil.daemon.config import IorRuleConfig, ReachRuleConfig, SeldonConfig, ServingKeys
from vigil.daemon.join import Expired, Join, Waiting

SOURCE_HEADERS = ("vigil-topic", "vigil-partition", "vigil-offset")
"""Where a forwarded record came from (its join-topic copy carries them)."""


class ServingForward(Rule):
    """Stage 1: the rule's requests and responses to its join topic, keyed to meet."""

    kind = "serving-forward"

    def __init__(self, name: str, config: ServingKeys, topics: set[str], join_topic: str) -> None:
        super().__init__(name, topics)
        self.config, self.join_topic = config, join_topic
        self.backend = config.format

    def wants_decisions(self, topic: str) -> bool:
        return False

    async def handle(self, tp: TopicPartition, records: list[Record], emit_from: int) -> RuleResult:
        result = RuleResult()
        started = time.perf_counter()
        for record in records:
            if record.offset < emit_from:
                continue  # forwarded before the restart (stateless: nothing to rebuild)
            try:
                key = self._join_key(record)
            except BadEvent as e:
                result.dead.append((record, e.reason, str(e)))
                continue
            except (ValueError, TypeError, AttributeError) as e:  # nothing a record holds stops us
                result.dead.append((record, "undecodable", f"cannot read it: {e!r}"))
                continue
            if key is None:
                continue  # another InferenceService's traffic on a shared topic
            result.checked += 1
            headers = (
                *record.headers,
                ("vigil-topic", record.topic.encode()),
                ("vigil-partition", str(record.partition).encode()),
                ("vigil-offset", str(record.offset).encode()),
            )
            message = OutMessage(
                self.join_topic, key, record.value or b"", headers, record.timestamp_ms
            )
            result.events.append(Answer.to(record, message))
        result.seconds = time.perf_counter() - started
        return result

    def _join_key(self, record: Record) -> bytes | None:
        """The pairing key, or None for another InferenceService's event."""
        if self.config.format == "seldon":
            return seldon.join_key(record)
        event_id, service = kserve.identify(record)
        return event_id.encode() if service == self.config.model else None


class ServingJoin(Rule):
    """Stage 2: each request paired with its response, the pair's rows as decisions."""

    kind = "serving-join"
    stateful = True

    def __init__(
        self,
        name: str,
        config: ServingKeys,
        join_topic: str,
        decisions_topic: str,
        context: RuleContext,
    ) -> None:
        super().__init__(name, {join_topic})
        self.config, self.decisions_topic, self.context = config, decisions_topic, context
        self.backend = config.format
        self.selection = TensorSelection(
            config.input_tensor,
            config.output_tensor,
            tuple(features) if (features := getattr(config, "features", None)) else None,
            config.categories,
        )
        self.timeout_ms = int(config.join_timeout_seconds * 1000)
        self.joins: dict[TopicPartition, Join] = {}

    def wants_decisions(self, topic: str) -> bool:
        return False

    def history_size(self, tp: TopicPartition) -> int:
        join = self.joins.get(tp)
        return len(join) if join else 0

    async def handle(self, tp: TopicPartition, records: list[Record], emit_from: int) -> RuleResult:
        """Pair the records in order; what a record completes or expires is emitted with it
        (records before ``emit_from`` are replayed into the state: their outputs went out)."""
        result = RuleResult()
        started = time.perf_counter()
        join = self.joins.setdefault(tp, self._new_join())
        for record in records:
            live = record.offset >= emit_from
            try:
                inference = self._decode(record)
            except BadEvent as e:
                if live:
                    result.events.append(self._dead(record, record, e.reason, str(e)))
                continue
            except (ValueError, TypeError, AttributeError) as e:  # nothing a record holds stops us
                if live:
                    error = f"cannot read it: {e!r}"
                    result.events.append(self._dead(record, record, "undecodable", error))
                continue
            pair, expired = join.add(inference, record, record.timestamp_ms)
            if live:
                result.events += [self._unmatched(record, e) for e in expired]
                if pair is not None:
                    result.events += self._decisions(record, *pair, result)
        self.context.metrics.serving_waiting.labels(self.name, tp[0], str(tp[1])).set(len(join))
        result.seconds = time.perf_counter() - started
        return result

    def _new_join(self) -> Join:
        return Join(self.timeout_ms, self.config.join_pending_limit)

    def _decode(self, record: Record) -> Inference:
        topic = record.header("vigil-topic")
        if topic is None:
            raise BadEvent("schema", "a join-topic record without its source topic header")
        source = Record(
            topic.decode(),
            record.partition,
            record.offset,
            record.value,
            record.key,
            record.headers,
        )
        if self.config.format == "seldon":
            assert self.config.model is not None
            return seldon.decode(source, self.config.model)
        return kserve.decode(source)

    def _decisions(
        self, record: Record, request: Waiting, response: Waiting, result: RuleResult
    ) -> list[Answer]:
        if response.inference.error is not None:
            error = f"the serving stack answered with an error: {response.inference.error}"
            return [self._dead(record, request.record, "failed", error)]
        try:
            x, y = decision_rows(
                request.inference.tensors, response.inference.tensors, self.selection
            )
        except BadEvent as e:
            return [self._dead(record, request.record, e.reason, str(e))]
        except (ValueError, TypeError, AttributeError) as e:  # nothing a record holds stops us
            return [self._dead(record, request.record, "schema", f"cannot pair the rows: {e!r}")]
        model = self.config.model
        assert model is not None
        value = encode_batch(request.inference.request_id, model, x, y)
        message = OutMessage(self.decisions_topic, model.encode(), value, HEADERS)
        result.checked += len(x)
        return [Answer.to(record, message)]

    def _unmatched(self, record: Record, expired: Expired) -> Answer:
        side = expired.waiting.inference.role
        why = {
            "timeout": f"no {'response' if side == 'request' else 'request'} within "
            f"{self.config.join_timeout_seconds:g} s of stream time",
            "limit": f"pushed out: {self.config.join_pending_limit} unpaired records held",
            "superseded": "a later record of the same side and key replaced it",
        }[expired.why]
        self.context.metrics.serving_unmatched.labels(self.name, side, expired.why).inc()
        error = f"unmatched {side} {expired.waiting.inference.request_id!r}: {why}"
        return self._dead(record, expired.waiting.record, "unmatched", error)

    def _dead(self, answers: Record, about: Record, reason: str, error: str) -> Answer:
        """A dead letter naming ``about`` where it came from, sent with ``answers``."""
        event = dead_letter(_original(about), reason, error, now_iso())
        event["rule"] = self.config.name
        self.context.metrics.dead_letters.labels(reason).inc()
        self.context.metrics.events.labels(self.name, "dead_letter").inc()
        message = OutMessage(self.context.dead_letter_topic, about.key, encode(event))
        return Answer.to(answers, message)

    def snapshot(self, tp: TopicPartition, since: int | None = None) -> StatePart | None:
        join = self.joins.get(tp)
        return None if join is None else StatePart(join.snapshot())

    def restore(self, tp: TopicPartition, parts: list[bytes]) -> None:
        (blob,) = parts  # always a base
        self.joins[tp] = Join.restore(
            blob, self._decode, self.timeout_ms, self.config.join_pending_limit
        )

    def drop(self, tp: TopicPartition) -> None:
        self.joins.pop(tp, None)


def _original(record: Record) -> Record:
    """A join-topic record as it was on the serving stack's topic (its coordinates)."""
    topic, partition, offset = (record.header(h) for h in SOURCE_HEADERS)
    if topic is None or partition is None or offset is None:
        return record
    return Record(topic.decode(), int(partition), int(offset), record.value, record.key)


def serving_topics(config: ServingKeys, seldon_config: SeldonConfig, group_id: str) -> Stages:
    """The topics of a serving-stack rule's stages."""
    if config.format == "seldon":
        sources = set(seldon_config.topics(config))
    else:
        assert config.topic is not None
        sources = {config.topic}
    base = f"{group_id}.{config.name}"
    return Stages(frozenset(sources), f"{base}.join", f"{base}.decisions")


def serving_rules(
    config: IorRuleConfig | ReachRuleConfig,
    seldon_config: SeldonConfig,
    group_id: str,
    context: RuleContext,
) -> list[Rule]:
    """The three stages of a rule on a serving stack's traffic: forward, join, and the rule
    itself (i.o.r. or reach) on the joined decisions, their x already one row of columns."""
    stages = serving_topics(config, seldon_config, group_id)
    update = {"topic": stages.decisions, "format": "vigil", "features": None}
    checker: Rule
    if isinstance(config, IorRuleConfig):
        checker = IorRule(config.model_copy(update={**update, "dim": config.input_dim}), context)
    else:
        checker = ReachRule(config.model_copy(update=update), context)
    return [
        ServingForward(f"{config.name}.forward", config, set(stages.sources), stages.join),
        ServingJoin(f"{config.name}.join", config, stages.join, stages.decisions, context),
        checker,
    ]


@dataclass(frozen=True)
class Stages:
    """A serving-stack rule's topics: the serving stack's, its join topic (partitioned as
    the largest of those) and its decisions topic (as many partitions)."""

    sources: frozenset[str]
    join: str
    decisions: str
