"""Decision streams stored as CSV: a header row, then one decision per row, in stream order."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np


class StreamFormatError(ValueError):
    """A stream that cannot be read; the message names the line and column."""


@dataclass(frozen=True)
class CsvBatch:
    """Consecutive decisions: ``rows[i]`` is the 0-based data row of ``x[i]``."""

    rows: np.ndarray
    x: np.ndarray
    decisions: list[str] | np.ndarray
    ids: list[str] | None


@dataclass(frozen=True)
class CsvLayout:
    """Which columns are features, which hold the decision, which name the decision."""

    features: list[str]
    feature_index: list[int]
    decision_index: list[int]
    id_index: int | None

    @classmethod
    def from_header(
        cls,
        header: Sequence[str],
        decision_columns: Sequence[str],
        drop_columns: Sequence[str] = (),
        id_column: str | None = None,
    ) -> CsvLayout:
        header = [h.strip() for h in header]
        repeated = sorted({h for h in header if header.count(h) > 1})
        if repeated:  # a lookup by name would read one of them for both
            raise StreamFormatError(f"line 1: duplicate column {', '.join(map(repr, repeated))}")
        position = {name: i for i, name in enumerate(header)}
        named = [*decision_columns, *drop_columns, *([id_column] if id_column else [])]
        missing = [c for c in named if c not in position]
        if missing:
            raise StreamFormatError(
                f"line 1: no column named {', '.join(map(repr, missing))} "
                f"(columns: {', '.join(header)})"
            )
        skip = set(named)
        features = [h for h in header if h not in skip]
        if not features:
            raise StreamFormatError("line 1: no feature columns left after the named columns")
        return cls(
            features=features,
            feature_index=[position[f] for f in features],
            decision_index=[position[c] for c in decision_columns],
            id_index=position[id_column] if id_column else None,
        )


def read_csv_stream(
    path: str | Path,
    decision_columns: Sequence[str],
    drop_columns: Sequence[str] = (),
    id_column: str | None = None,
    batch_size: int = 4096,
) -> tuple[CsvLayout, Iterator[CsvBatch]]:
    """Parse the header now (so column errors surface first) and the rows lazily, in
    batches. Decision values stay strings when there is one decision column (labels) and
    become float vectors when there are several (probabilities)."""
    f = open(path, newline="", encoding="utf-8-sig")  # noqa: SIM115 - closed by the generator
    reader = csv.reader(f)
    try:
        header = next(reader)
    except StopIteration:
        f.close()
        raise StreamFormatError(f"{path}: the file is empty (expected a header row)") from None
    except UnicodeDecodeError:
        f.close()
        raise StreamFormatError(f"{path}: not UTF-8 text") from None
    try:
        layout = CsvLayout.from_header(header, decision_columns, drop_columns, id_column)
    except StreamFormatError:
        f.close()
        raise
    return layout, _batches(f, reader, len(header), layout, header, batch_size)


def _batches(f, reader, width, layout, header, batch_size) -> Iterator[CsvBatch]:
    with f:
        rows: list[list[str]] = []
        first_row = 0
        for row in _rows(reader):
            if not row:
                raise StreamFormatError(f"line {reader.line_num}: empty line")
            if len(row) != width:
                raise StreamFormatError(
                    f"line {reader.line_num}: {len(row)} fields, expected {width} as in the header"
                )
            rows.append(row)
            if len(rows) == batch_size:
                yield _convert(rows, first_row, layout, header)
                first_row += len(rows)
                rows = []
        if rows:
            yield _convert(rows, first_row, layout, header)


def _rows(reader) -> Iterator[list[str]]:
    try:
        yield from reader
    except UnicodeDecodeError:
        raise StreamFormatError(f"line {reader.line_num + 1}: not UTF-8 text") from None


def _convert(rows: list[list[str]], first_row: int, layout: CsvLayout, header) -> CsvBatch:
    def cells(columns: list[int]) -> np.ndarray:
        block = [[r[c] for c in columns] for r in rows]
        try:
            values = np.array(block, dtype=np.float64)
        except ValueError:
            values = None
        if values is None or not np.isfinite(values).all():
            _raise_first_bad(block, columns, first_row, header)
        return values

    x = cells(layout.feature_index)
    if len(layout.decision_index) == 1:
        c = layout.decision_index[0]
        decisions = [r[c].strip() for r in rows]
        for i, d in enumerate(decisions):
            if not d:
                raise StreamFormatError(f"line {first_row + i + 2}, column {header[c]!r}: empty")
    else:
        decisions = cells(layout.decision_index)
    ids = [r[layout.id_index] for r in rows] if layout.id_index is not None else None
    return CsvBatch(np.arange(first_row, first_row + len(rows)), x, decisions, ids)


def _raise_first_bad(block, columns, first_row, header) -> None:
    for i, values in enumerate(block):
        for value, c in zip(values, columns, strict=True):
            try:
                number = float(value)
            except ValueError:
                raise StreamFormatError(
                    f"line {first_row + i + 2}, column {header[c]!r}: {value!r} is not a number"
                ) from None
            if not math.isfinite(number):
                raise StreamFormatError(
                    f"line {first_row + i + 2}, column {header[c]!r}: {value!r} is not finite"
                )
