"""Witness sets as alert events (the alert contract of docs/architecture.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import numpy as np

from rules.ior import Monitor, OutputKind, Witnesses


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def witness_alerts(
    rule: str,
    model: str,
    monitor: Monitor,
    witnesses: Witnesses,
    source: Callable[[int], dict[str, Any]],
    output_value: Callable[[Any], Any],
) -> Iterator[dict[str, Any]]:
    """One alert per decision of the batch with a non-empty witness set.

    ``source(i)`` locates the batch's i-th decision in its source (topic/partition/offset
    or file/row); ``output_value`` turns a stored output into its JSON form.
    """
    spec = monitor.spec
    detected_at = now_iso()
    extra = {"delta": spec.delta} if spec.output is OutputKind.PROBABILITIES else {}
    for i in witnesses.flagged:
        position = witnesses.first + int(i)
        index, distance = witnesses.of(int(i))
        ids = monitor.ids(index)
        outputs = monitor.outputs(index)
        yield {
            "rule": rule,
            "model": model,
            "decision": {
                "id": monitor.ids([position])[0],
                "y": output_value(monitor.outputs(np.array([position]))[0]),
            },
            "witnesses": [
                {"id": wid, "y": output_value(wy), "distance": float(d)}
                for wid, wy, d in zip(ids, outputs, distance, strict=True)
            ],
            "metric": spec.metric.value,
            "eps": spec.eps,
            **extra,
            "source": source(int(i)),
            "detected_at": detected_at,
        }
