"""The decision stream the alerts came from, read for the features of the decisions they name:
a CSV read exactly as ``vigil replay`` reads it, or JSON-lines decision events
(connectors/schemas/decision.json). Only the named decisions are kept."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vigil.connectors.csv_source import StreamFormatError, read_csv_stream
from vigil.connectors.events import BadEvent, Decision, Record, decode_decision

Key = tuple[str | None, str]
"""(model, id as text): a CSV holds one model's decisions, so its model is None."""


@dataclass(frozen=True)
class CsvColumns:
    """The replay's column options: which columns are outputs, not features, or ids."""

    decision_columns: Sequence[str]
    drop_columns: Sequence[str] = ()
    ignore_columns: Sequence[str] = ()
    scale: dict[str, float] = field(default_factory=dict)
    id_column: str | None = None


@dataclass
class Decisions:
    """Features and stream positions of the decisions the alerts name."""

    path: Path
    count: int = 0
    per_model: Counter[str] | None = None  # JSON events; None for a CSV (one model)
    names: dict[str | None, list[str]] = field(default_factory=dict)
    ignored: frozenset[str] = frozenset()
    scale: dict[str, float] = field(default_factory=dict)
    found: dict[Key, tuple[int, list[float | None]]] = field(default_factory=dict)

    def decisions_of(self, model: str) -> int:
        """How many decisions of ``model`` the stream holds."""
        return self.count if self.per_model is None else self.per_model[model]

    def key(self, model: str, ident: str | int) -> Key:
        return (None if self.per_model is None else model, str(ident))

    def features_of(self, model: str) -> list[str] | None:
        return self.names.get(None if self.per_model is None else model)


def read_decisions(path: Path, wanted: Iterable[Key], columns: CsvColumns | None) -> Decisions:
    """Read ``path`` (CSV or JSON lines, told apart by the first character), keeping the
    decisions in ``wanted`` (keys with the alerts' models; a CSV matches ids only)."""
    if not path.is_file():
        raise ValueError(f"--decisions {path}: no such file")
    with open(path, "rb") as f:
        json_lines = f.read(4096).lstrip().startswith(b"{")
    if json_lines:
        if columns is not None:
            raise ValueError(
                f"--decisions {path} holds decision events: the CSV column options do not apply"
            )
        return _read_events(path, set(wanted))
    if columns is None or not columns.decision_columns:
        raise ValueError(
            f"--decisions {path} is a CSV: name its output with --decision-column, "
            "as for vigil replay"
        )
    return _read_csv(path, {ident for _, ident in wanted}, columns)


def _read_csv(path: Path, wanted: set[str], columns: CsvColumns) -> Decisions:
    try:
        layout, batches = read_csv_stream(
            path, columns.decision_columns, columns.drop_columns, columns.id_column
        )
        for option, named in (
            ("--ignore-columns", columns.ignore_columns),
            ("--scale", columns.scale),
        ):
            unknown = [n for n in named if n not in layout.features]
            if unknown:
                raise ValueError(f"{option}: not feature columns: {', '.join(unknown)}")
        out = Decisions(
            path,
            names={None: layout.features},
            ignored=frozenset(columns.ignore_columns),
            scale=dict(columns.scale),
        )
        for batch in batches:
            ids = batch.ids if batch.ids is not None else batch.rows.tolist()
            for i, ident in enumerate(ids):
                key = (None, str(ident))
                if key[1] in wanted and key not in out.found:
                    out.found[key] = (out.count + i, batch.x[i].tolist())
            out.count += len(ids)
    except StreamFormatError as e:
        raise StreamFormatError(_in_file(path, e)) from None
    return out


def _in_file(path: Path, error: Exception) -> str:
    said = str(error)
    return said if said.startswith(str(path)) else f"{path}, {said}"


def _read_events(path: Path, wanted: set[Key]) -> Decisions:
    out = Decisions(path, per_model=Counter())
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                decision = decode_decision(Record(str(path), 0, n - 1, line))
                key = (decision.model, str(decision.id))
                if key in wanted and key not in out.found:
                    names = out.names.setdefault(decision.model, [])
                    out.found[key] = (out.count, _values(decision, names))
            except BadEvent as e:
                raise StreamFormatError(f"{path}, line {n}: {e}") from None
            out.per_model[decision.model] += 1
            out.count += 1
    return out


def _values(decision: Decision, names: list[str]) -> list[float | None]:
    """The decision's inputs in the order of ``names``, which grows by the names it adds
    (the whole event is read only for named ``features``)."""
    x = decision.x
    named = {f"x[{i}]": v for i, v in enumerate(x)} if x is not None else decision.event["features"]
    for name in named:
        if name not in names:
            names.append(name)
    values: list[float | None] = []
    for name in names:
        v = named.get(name)
        if v is not None and (
            not isinstance(v, int | float) or (isinstance(v, float) and not math.isfinite(v))
        ):
            raise BadEvent("schema", f"input {name!r} is not a finite number: {v!r}")
        values.append(None if v is None else float(v))
    return values
