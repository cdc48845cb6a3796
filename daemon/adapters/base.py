"""The rule protocol the pipeline drives, and what every adapter shares."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vigil.connectors.base import OutMessage, TopicPartition
from vigil.connectors.events import Decision, Record
from vigil.daemon.metrics import Metrics
from vigil.daemon.offload import OffloadPool
from vigil.rules.reach.network import Network, load_checked


class StaleSnapshot(ValueError):
    """A snapshot made under a rule configuration that has changed since: the state is
    rebuilt by replaying the partition instead."""


@dataclass(frozen=True)
class StatePart:
    """A rule's state of one partition, whole (a base) or as what was added since an earlier
    part (a segment). Positions are the rule's own: a segment covers ``start..stop`` and
    continues the part that ends at ``start``; ``live_from`` is where the state held now
    begins (a bounded history forgets its oldest entries), so parts before it are garbage
    once a newer base exists."""

    blob: bytes
    base: bool = True
    start: int = 0
    stop: int = 0
    live_from: int = 0


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
    alerts_topic: str = "vigil.alerts"


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
    """What a rule made of one batch: its finished outputs (alerts and other events, each
    with the record it answers), its dead letters, counts for the metrics, and (a rule that
    reads records and makes decisions of them) the decisions for its own ``check``."""

    events: list[Answer] = field(default_factory=list)
    dead: list[tuple[Record, str, str]] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    checked: int = 0
    alerts: int = 0
    alert_witnesses: int = 0
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
    (``handle``) per topic; a record rule may return decisions of its own making, which the
    pipeline then passes to its ``check``. Work offloaded to a pool finishes later:
    ``completed`` hands over its events, and ``hold`` names the oldest record of a partition
    still waiting for one, so the pipeline commits no further.
    """

    kind = ""
    stateful = False
    merges = False
    """Takes records in ``handle`` and answers them in ``release``, in its own order."""
    backend = ""

    def __init__(self, name: str, topics: set[str]) -> None:
        self.name = name
        self.topics = topics

    def wants_decisions(self, topic: str) -> bool:
        return True

    def serves(self, model: str) -> bool:
        """Whether the rule checks decisions of ``model`` (those of its topics reach it)."""
        return True

    async def check(
        self, tp: TopicPartition, decisions: Sequence[Decision], emit_from: int
    ) -> RuleResult:
        return RuleResult()

    async def handle(self, tp: TopicPartition, records: list[Record], emit_from: int) -> RuleResult:
        return RuleResult()

    def release(self, behind: Callable[[TopicPartition], bool]) -> RuleResult:
        """A merging rule's answers to the records whose turn has come, given which
        partitions are ``behind`` their end (records of them exist that were not read)."""
        return RuleResult()

    def full(self) -> set[TopicPartition]:
        """The partitions a merging rule holds enough of: read no more of them for now."""
        return set()

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

    def mark_history(self, tp: TopicPartition, complete: bool) -> None:
        """Whether this rule's state of ``tp`` holds every record it should (a stateful
        rule's history may lack records retention deleted; see daemon/state/recovery.py)."""
        return None

    def offload_jobs(self) -> dict[str, set[str]]:
        """The job kinds this rule submits, by offload pool name (for the metrics)."""
        return {}

    def snapshot(self, tp: TopicPartition, since: int | None = None) -> StatePart | None:
        """This rule's state of ``tp`` (None when it keeps none): a segment of what came
        after position ``since`` when the rule can give one, else a base."""
        return None

    def restore(self, tp: TopicPartition, parts: list[bytes]) -> None:
        """Continue from a base and the segments that follow it, in order."""
        return None

    def assign(self, tp: TopicPartition) -> None:
        """A partition of the rule's topics is now read (after its state was restored)."""
        return None

    def drop(self, tp: TopicPartition) -> None:
        """Forget a revoked partition."""
        return None

    def close(self) -> None:
        return None
