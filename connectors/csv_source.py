"""Decision streams stored as CSV: a header row, then one decision per row, in stream order."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
from pyarrow import csv as pacsv


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
    become float vectors when there are several (probabilities).

    Rows are read column by column (pyarrow's CSV reader); from the first block it refuses
    or whose values are not all finite, the rows are read one by one instead, which names
    the bad line and column (or accepts what only the columnar reader refused)."""
    header = _header(path)
    layout = CsvLayout.from_header(header, decision_columns, drop_columns, id_column)
    return layout, _columnar(Path(path), layout, header, batch_size)


def _header(path: str | Path) -> list[str]:
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            return next(csv.reader(f))
    except StopIteration:
        raise StreamFormatError(f"{path}: the file is empty (expected a header row)") from None
    except UnicodeDecodeError:
        raise StreamFormatError(f"{path}: not UTF-8 text") from None


def _columnar(path: Path, layout: CsvLayout, header, batch_size) -> Iterator[CsvBatch]:
    names = [f"c{i}" for i in range(len(header))]
    labels = len(layout.decision_index) == 1
    types = {names[c]: pa.float64() for c in layout.feature_index}
    for c in layout.decision_index:
        types[names[c]] = pa.string() if labels else pa.float64()
    if layout.id_index is not None:
        types[names[layout.id_index]] = pa.string()
    done = 0
    try:
        reader = pacsv.open_csv(
            path,
            read_options=pacsv.ReadOptions(
                skip_rows=1, column_names=names, block_size=max(1 << 20, 64 * batch_size)
            ),
            parse_options=pacsv.ParseOptions(ignore_empty_lines=False),
            convert_options=pacsv.ConvertOptions(
                column_types=types,
                include_columns=list(types),
                null_values=[],
                strings_can_be_null=False,
            ),
        )
        pending: CsvBatch | None = None  # rows read, not yet a whole batch
        for block in reader:
            batch = _from_block(block, done + _length(pending), layout, names, labels)
            if batch is None:
                break
            pending = batch if pending is None else _join(pending, batch)
            while _length(pending) >= batch_size:
                head, pending = _split(pending, batch_size)
                done += batch_size
                yield head
        else:
            if _length(pending):
                yield pending
            return
    except pa.ArrowInvalid:
        pass
    yield from _rowwise(path, layout, header, batch_size, skip=done)


def _length(batch: CsvBatch | None) -> int:
    return 0 if batch is None else len(batch.rows)


def _join(a: CsvBatch, b: CsvBatch) -> CsvBatch:
    if isinstance(a.decisions, list):
        decisions = a.decisions + b.decisions
    else:
        decisions = np.concatenate([a.decisions, b.decisions])
    ids = None if a.ids is None else a.ids + b.ids
    return CsvBatch(np.concatenate([a.rows, b.rows]), np.concatenate([a.x, b.x]), decisions, ids)


def _split(batch: CsvBatch, n: int) -> tuple[CsvBatch, CsvBatch]:
    """The first ``n`` rows (so batches are ``batch_size`` long, as history limits expect)."""

    def part(s: slice) -> CsvBatch:
        ids = None if batch.ids is None else batch.ids[s]
        return CsvBatch(batch.rows[s], batch.x[s], batch.decisions[s], ids)

    return part(slice(0, n)), part(slice(n, None))


def _from_block(block, first_row, layout, names, labels) -> CsvBatch | None:
    """A block as a batch, or None if some value needs the row-by-row reader's verdict."""
    x = np.column_stack(
        [block.column(names[c]).to_numpy(zero_copy_only=False) for c in layout.feature_index]
    ).astype(np.float64, copy=False)
    if not np.isfinite(x).all():
        return None
    if labels:
        decisions = [d.strip() for d in block.column(names[layout.decision_index[0]]).to_pylist()]
        if not all(decisions):
            return None
    else:
        decisions = np.column_stack(
            [block.column(names[c]).to_numpy(zero_copy_only=False) for c in layout.decision_index]
        )
        if not np.isfinite(decisions).all():
            return None
    ids = None
    if layout.id_index is not None:
        ids = block.column(names[layout.id_index]).to_pylist()
    return CsvBatch(np.arange(first_row, first_row + len(x)), x, decisions, ids)


def _rowwise(path: Path, layout, header, batch_size, skip: int) -> Iterator[CsvBatch]:
    """The rows after the first ``skip`` data rows, read one by one (csv module)."""
    f = open(path, newline="", encoding="utf-8-sig")  # noqa: SIM115 - closed by _batches
    reader = csv.reader(f)
    try:
        next(reader)
        for _ in range(skip):
            next(reader)
    except (StopIteration, UnicodeDecodeError):
        f.close()
        raise StreamFormatError(f"{path}: changed while it was read") from None
    yield from _batches(f, reader, len(header), layout, header, batch_size, skip)


def _batches(f, reader, width, layout, header, batch_size, first_row) -> Iterator[CsvBatch]:
    with f:
        rows: list[list[str]] = []
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
