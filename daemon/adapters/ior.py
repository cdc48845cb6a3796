"""Witness sets as alert events (the alert contract of docs/architecture.md)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

import numpy as np
from vigil.rules.ior import Monitor, OutputKind, Witnesses


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def witness_alerts(
    rule: str,
    monitor: Monitor,
    witnesses: Witnesses,
    context: Callable[[int], tuple[str, dict[str, Any]]],
    output_value: Callable[[Any], Any],
    rows: Iterable[int] | None = None,
    max_witnesses: int | None = None,
) -> Iterator[dict[str, Any]]:
    """One alert per flagged decision of the batch (restricted to ``rows`` if given).

    ``context(i)`` gives the batch's i-th decision's model and its source coordinates
    (topic/partition/offset or file/row); ``output_value`` turns a stored output into JSON.
    A witness set larger than ``max_witnesses`` keeps its nearest members (in history
    order) and says so, so that an alert always fits a Kafka message.
    """
    spec = monitor.spec
    detected_at = now_iso()
    extra = {"delta": spec.delta} if spec.output is OutputKind.PROBABILITIES else {}
    counts = witnesses.counts
    for i in witnesses.flagged if rows is None else rows:
        i = int(i)
        if not counts[i]:
            continue
        position = witnesses.first + i
        index, distance = witnesses.of(i)
        total = len(index)
        if max_witnesses is not None and total > max_witnesses:
            nearest = np.sort(np.argsort(distance, kind="stable")[:max_witnesses])
            index, distance = index[nearest], distance[nearest]
        model, source = context(i)
        alert = {
            "rule": rule,
            "model": model,
            "decision": {
                "id": monitor.ids([position])[0],
                "y": output_value(monitor.outputs([position])[0]),
            },
            "witnesses": [
                {"id": wid, "y": output_value(wy), "distance": float(d)}
                for wid, wy, d in zip(
                    monitor.ids(index), monitor.outputs(index), distance, strict=True
                )
            ],
            "metric": spec.metric.value,
            "eps": spec.eps,
            **extra,
            "source": source,
            "detected_at": detected_at,
        }
        if len(index) < total:
            alert.update(witness_count=total, witnesses_truncated=True)
        if witnesses.ratio is not None:
            alert["lipschitz"] = lipschitz(monitor, witnesses, i)
        yield alert


def lipschitz(monitor: Monitor, witnesses: Witnesses, i: int) -> dict[str, Any]:
    """The quantitative-mode field: largest d_out / d_in (null when infinite: an identical
    input with another output) and the decision attaining it."""
    ratio = float(witnesses.ratio[i])
    position = int(witnesses.ratio_witness[i])
    return {
        "ratio": ratio if math.isfinite(ratio) else None,
        "witness": monitor.ids([position])[0] if position >= 0 else None,
    }
