"""What a partition's rules resume from when it is assigned.

Each stateful rule restores its newest snapshot at or before the committed offset (a newer
one may hold records whose outputs were never delivered), or starts from its origin. The
partition is then replayed from the oldest rule's position: records before the committed
offset only rebuild state, records from it on are answered.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from vigil.connectors.base import Source, TopicPartition
from vigil.daemon.adapters import Rule, StaleSnapshot
from vigil.daemon.metrics import Metrics
from vigil.daemon.state.store import SnapshotStore

log = structlog.get_logger("vigil.recovery")


@dataclass(frozen=True)
class Restored:
    """Where one partition resumes: its committed offset (None for a new group), the first
    offset to answer (``emit_from``), the first to read (``replay_from``) and, per rule, the
    first record its state still lacks."""

    committed: int | None
    emit_from: int
    replay_from: int
    apply_from: dict[str, int]


async def restore_partition(
    tp: TopicPartition,
    rules: list[Rule],
    source: Source,
    store: SnapshotStore,
    metrics: Metrics,
) -> Restored:
    """Restore ``rules``' state of ``tp`` and say where to resume. A partition with no
    committed offset starts where the source's reset policy says (its first record, or its
    end for ``latest``)."""
    committed = await source.committed(tp)
    position = committed if committed is not None else await source.start_offset(tp)
    apply_from: dict[str, int] = {}
    for rule in rules:
        if not rule.stateful:
            apply_from[rule.name] = position
            continue
        snapshot, skipped = store.load(rule.name, tp, at_most=committed)
        if skipped:
            metrics.snapshots.labels("skipped_corrupt").inc(skipped)
        applied = None
        if snapshot is not None:
            try:
                rule.restore(tp, snapshot.blob)
            except StaleSnapshot as e:  # rebuilt from the rule's origin
                log.warning("snapshot_ignored", rule=rule.name, tp=tp, reason=str(e))
                metrics.snapshots.labels("ignored_stale").inc()
            else:
                applied = snapshot.offset
                metrics.snapshots.labels("loaded").inc()
        if applied is None:
            applied = store.origin(rule.name, tp)
            # a new group starting later, or offsets reset back before the origin
            if applied > position or (committed is None and applied < position):
                store.mark_origin(rule.name, tp, position)
                applied = position
        apply_from[rule.name] = applied
    replay_from = min([position, *apply_from.values()])
    return Restored(committed, position, replay_from, apply_from)
