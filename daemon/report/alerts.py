"""Alerts for the report: parsed from JSON lines (a file, or the values of Kafka records) and
checked for the fields the page shows, so that a bad line is named before anything is drawn."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from vigil.connectors.csv_source import StreamFormatError

Id = str | int


@dataclass(frozen=True, slots=True)
class Witness:
    id: Id
    y: Any
    distance: float


@dataclass(frozen=True, slots=True)
class Alert:
    """One alert (connectors/schemas/alert.json) as the report uses it."""

    rule: str
    model: str
    id: Id
    y: Any
    witnesses: tuple[Witness, ...]
    count: int  # the whole witness set; more than len(witnesses) when it was truncated
    metric: str
    eps: float
    delta: float | None
    lipschitz: tuple[float | None, Id | None] | None  # (largest d_out / d_in, its witness)
    history_complete: bool
    source_at: tuple[str, int] | None  # ("row", n) in a file, ("offset", n) in Kafka


def read_alert_file(path: Path) -> list[Alert]:
    """Every alert of a JSON-lines file, in file order; blank lines are skipped."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise StreamFormatError(f"{path}: no such file") from None
    except OSError as e:
        raise StreamFormatError(f"{path}: {e.strerror}") from None
    return parse_alerts(
        (f"{path}, line {n}", line) for n, line in enumerate(data.splitlines(), 1) if line.strip()
    )


def parse_alerts(lines: Iterable[tuple[str, bytes | None]]) -> list[Alert]:
    """Alerts from ``(where, JSON bytes)`` pairs; errors start with ``where``."""
    return [parse_alert(value, where) for where, value in lines]


def parse_alert(value: bytes | None, where: str) -> Alert:
    """One alert, or ``StreamFormatError`` naming ``where`` and what is wrong."""

    def bad(problem: str) -> StreamFormatError:
        return StreamFormatError(f"{where}: {problem}")

    if value is None:
        raise bad("empty message (tombstone), expected an alert")
    try:
        event = orjson.loads(value)
    except orjson.JSONDecodeError as e:
        raise bad(f"not JSON ({e})") from None
    if not isinstance(event, dict):
        raise bad(f"expected a JSON object, got {type(event).__name__}")
    if event.get("kind", "alert") != "alert":
        raise bad(f"not an alert (kind {event['kind']!r})")
    decision = event.get("decision")
    if not isinstance(decision, dict) or not _is_id(decision.get("id")):
        raise bad("an alert without a decision id (decision.id, a string or integer)")
    witnesses = event.get("witnesses")
    if not isinstance(witnesses, list) or not witnesses:
        raise bad("an alert without witnesses (a non-empty array)")
    listed = tuple(_witness(w, n, bad) for n, w in enumerate(witnesses))
    for key in ("rule", "model", "metric"):
        if not isinstance(event.get(key), str):
            raise bad(f"{key} must be a string")
    eps, delta = event.get("eps"), event.get("delta")
    if not _is_number(eps):
        raise bad("eps must be a number")
    count = event.get("witness_count", len(listed))
    if not isinstance(count, int) or isinstance(count, bool) or count < len(listed):
        raise bad(f"witness_count must be an integer >= {len(listed)}")
    return Alert(
        rule=event["rule"],
        model=event["model"],
        id=decision["id"],
        y=decision.get("y"),
        witnesses=listed,
        count=count,
        metric=event["metric"],
        eps=float(eps),
        delta=float(delta) if _is_number(delta) else None,
        lipschitz=_lipschitz(event.get("lipschitz"), bad),
        history_complete=event.get("history_complete") is not False,
        source_at=_source_at(event.get("source")),
    )


def _witness(w: Any, n: int, bad) -> Witness:
    if not isinstance(w, dict) or not _is_id(w.get("id")):
        raise bad(f"witnesses[{n}] without an id (a string or integer)")
    distance = w.get("distance")
    if not _is_number(distance) or distance < 0:
        raise bad(f"witnesses[{n}].distance must be a number >= 0")
    return Witness(w["id"], w.get("y"), float(distance))


def _lipschitz(value: Any, bad) -> tuple[float | None, Id | None] | None:
    if value is None:
        return None
    ratio = value.get("ratio") if isinstance(value, dict) else math.nan
    if ratio is not None and not _is_number(ratio):
        raise bad("lipschitz.ratio must be a number or null")
    witness = value.get("witness")
    if witness is not None and not _is_id(witness):
        raise bad("lipschitz.witness must be a string, an integer or null")
    return (None if ratio is None else float(ratio)), witness


def _source_at(source: Any) -> tuple[str, int] | None:
    if isinstance(source, dict):
        for key in ("row", "offset"):
            if isinstance(source.get(key), int):
                return key, source[key]
    return None


def _is_id(value: Any) -> bool:
    return type(value) is str or type(value) is int  # JSON gives these exact types; not bool


def _is_number(value: Any) -> bool:
    return (type(value) is float or type(value) is int) and math.isfinite(value)
