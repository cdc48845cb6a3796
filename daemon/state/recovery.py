"""What a partition's rules resume from when it is assigned.

Each stateful rule restores its newest snapshot at or before the committed offset (a newer
one may hold records whose outputs were never delivered), or starts from its origin. The
partition is then replayed from the oldest rule's position: records before the committed
offset only rebuild state, records from it on are answered.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import structlog

from vigil.connectors.base import Source, TopicPartition
from vigil.daemon.adapters import Rule, StaleSnapshot
from vigil.daemon.metrics import Metrics
from vigil.daemon.state.store import StateStore

log = structlog.get_logger("vigil.recovery")


@dataclass(frozen=True)
class Restored:
    """Where one partition resumes: its committed offset (None for a new group), the first
    offset to answer (``emit_from``), the first to read (``replay_from``) and, per rule, the
    first record its state still lacks. ``gaps`` are the rules whose state has just been
    found to lack records retention deleted, with the offsets missing; ``incomplete`` the
    rules whose state lacks records, newly or since an earlier gap."""

    committed: int | None
    emit_from: int
    replay_from: int
    apply_from: dict[str, int]
    gaps: dict[str, tuple[int, int]] = field(default_factory=dict)
    incomplete: frozenset[str] = frozenset()
    unanswered: tuple[int, int] | None = None
    """Committed-to-be-read records deleted before they were read: never answered."""


async def restore_partition(
    tp: TopicPartition,
    rules: list[Rule],
    source: Source,
    store: StateStore,
    metrics: Metrics,
) -> Restored:
    """Restore ``rules``' state of ``tp`` and say where to resume. A partition with no
    committed offset starts where the source's reset policy says (its first record, or its
    end for ``latest``), with no snapshot past that point and a history that begins there.

    A rule whose state would resume before the partition's first retained record (a host
    with no snapshot, after retention deleted the head) cannot rebuild what it lacks: the
    gap is recorded in the store, so the state stays marked incomplete from then on."""
    committed = await source.committed(tp)
    position = committed if committed is not None else await source.start_offset(tp)
    first = await source.first_offset(tp)
    await store.open(tp)
    apply_from: dict[str, int] = {}
    gaps: dict[str, tuple[int, int]] = {}
    incomplete = set()
    for rule in rules:
        if not rule.stateful:
            apply_from[rule.name] = max(position, first)
            continue
        snapshot, skipped = await store.load(rule.name, tp, at_most=position)
        if skipped:
            metrics.snapshots.labels("skipped_corrupt").inc(skipped)
        applied = None
        if snapshot is not None:
            try:
                rule.restore(tp, snapshot.parts)
            except StaleSnapshot as e:  # rebuilt from the rule's origin
                store.forget(rule.name, tp)
                log.warning("snapshot_ignored", rule=rule.name, tp=tp, reason=str(e))
                metrics.snapshots.labels("ignored_stale").inc()
            else:
                applied = snapshot.offset
                metrics.snapshots.labels("loaded").inc()
        if applied is None:
            applied = store.origin(rule.name, tp)
            # a new group, or offsets reset back before the origin: a history from here
            if committed is None or applied > position:
                await store.mark_origin(rule.name, tp, position)
                await store.clear_gap(rule.name, tp)
                applied = position
        if applied < first:
            gaps[rule.name] = (applied, first)
            await store.mark_gap(rule.name, tp, first)
            applied = first
        if store.gap(rule.name, tp) is not None:
            incomplete.add(rule.name)
        apply_from[rule.name] = applied
    emit_from = max(position, first)
    replay_from = min([emit_from, *apply_from.values()])
    unanswered = (position, first) if position < first else None
    return Restored(
        committed, emit_from, replay_from, apply_from, gaps, frozenset(incomplete), unanswered
    )
