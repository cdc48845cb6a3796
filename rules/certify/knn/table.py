"""Raw tabular data: a header and rows of values, read from CSV, plus the target column."""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vigil.rules.certify.knn.errors import KnnInputError

_TARGET = re.compile(r"^\s*([^<>=!]+?)\s*(>=|<=|==|!=|>|<)\s*(.+?)\s*$")


@dataclass(frozen=True)
class Table:
    """Column names and raw cell values (strings or numbers), one row per sample."""

    columns: list[str]
    rows: list[list[object]]

    def __post_init__(self) -> None:
        check_unique(self.columns, "columns")

    def column(self, name: str) -> list[object]:
        """All values of one column."""
        j = self.index(name)
        return [r[j] for r in self.rows]

    def index(self, name: str) -> int:
        """Position of a column; KnnInputError names a missing one."""
        try:
            return self.columns.index(name)
        except ValueError:
            raise KnnInputError(
                f"no column {name!r} (columns: {', '.join(self.columns)})"
            ) from None

    def drop(self, name: str) -> Table:
        """The table without one column."""
        j = self.index(name)
        return Table(
            [c for i, c in enumerate(self.columns) if i != j],
            [[v for i, v in enumerate(r) if i != j] for r in self.rows],
        )

    def take(self, idx: Sequence[int]) -> Table:
        """The rows at the given positions."""
        return Table(list(self.columns), [self.rows[i] for i in idx])


def check_unique(columns: Sequence[str], where: str) -> None:
    """KnnInputError naming a duplicated column name: lookups by name would only ever see its
    first occurrence, silently misreading the others."""
    seen: set[str] = set()
    for name in columns:
        if name in seen:
            raise KnnInputError(f"{where}: duplicate column name {name!r}")
        seen.add(name)


def read_csv(path: str | Path, sep: str | None = None) -> Table:
    """A CSV file with a header row; the separator is sniffed among , ; tab when not given."""
    path = Path(path)
    if not path.exists():
        raise KnnInputError(f"no such CSV file: {path}")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise KnnInputError(f"{path}: not a UTF-8 text file") from None
    if sep is None:
        first = text.split("\n", 1)[0]
        sep = max([",", ";", "\t"], key=first.count)
    reader = csv.reader(text.splitlines(), delimiter=sep)
    rows = [r for r in reader if r]
    if len(rows) < 2:
        raise KnnInputError(f"{path}: need a header row and at least one data row")
    header, body = rows[0], rows[1:]
    bad = next((i for i, r in enumerate(body) if len(r) != len(header)), None)
    if bad is not None:
        raise KnnInputError(
            f"{path}: row {bad + 2} has {len(body[bad])} cells, the header {len(header)}"
        )
    names = [h.strip() for h in header]
    check_unique(names, f"{path} header")
    return Table(names, [[c.strip() for c in r] for r in body])


def target_column(target: str) -> str:
    """The column a target specification reads (``G3>=10`` -> ``G3``)."""
    m = _TARGET.match(target)
    return m.group(1) if m else target


def split_target(table: Table, target: str) -> tuple[Table, np.ndarray]:
    """Features and labels. ``target`` is a column name, or ``COL>=VALUE`` (also > <= < == !=)
    for a 0/1 label from a numeric column, e.g. ``G3>=10``."""
    m = _TARGET.match(target)
    if m is None:
        values = table.column(target)
        return table.drop(target), np.array([str(v) for v in values], dtype=object)
    name, op, raw = m.groups()
    try:
        bound = float(raw)
        values = np.array([float(v) for v in table.column(name)])
    except ValueError:
        raise KnnInputError(f"target {target!r}: {name!r} and {raw!r} must be numeric") from None
    ops = {
        ">=": np.greater_equal,
        "<=": np.less_equal,
        ">": np.greater,
        "<": np.less,
        "==": np.equal,
        "!=": np.not_equal,
    }
    return table.drop(name), ops[op](values, bound).astype(np.int64)
