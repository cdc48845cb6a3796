"""The columnar CSV reader against the row-by-row reader: the same batches, or the same
error naming the same line and column, for any stream."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vigil.connectors.csv_source import (
    CsvLayout,
    StreamFormatError,
    _header,
    _rowwise,
    read_csv_stream,
)

NUMBER = st.one_of(
    st.integers(-1000, 1000).map(str),
    st.floats(-1e6, 1e6, allow_nan=False).map(repr),
    st.floats(-10, 10, allow_nan=False).map(lambda v: f" {v:.3f} "),
    st.floats(0, 1, allow_nan=False).map(lambda v: f"{v:.2e}"),
)
BAD_NUMBER = st.sampled_from(["abc", "", "nan", "inf", "-Infinity", "1.2.3", "0x10", " "])


@st.composite
def streams(draw):
    """A CSV text (features f0.., a label or probability columns, an id) with, sometimes,
    one damaged cell, a short row or an empty line."""
    width = draw(st.integers(1, 4))
    probabilities = draw(st.booleans())
    decision = ["p0", "p1"] if probabilities else ["y"]
    header = [f"f{i}" for i in range(width)] + decision + ["id"]
    n = draw(st.integers(1, 60))
    rows = []
    for i in range(n):
        row = [draw(NUMBER) for _ in range(width)]
        row += (
            [draw(NUMBER) for _ in decision]
            if probabilities
            else [draw(st.sampled_from(["a", " b", "0", "1.0"]))]
        )
        row.append(f"id{i}")
        rows.append(row)
    damage = draw(st.sampled_from(["none", "cell", "label", "short", "empty"]))
    at = draw(st.integers(0, n - 1))
    if damage == "cell":
        rows[at][draw(st.integers(0, width - 1))] = draw(BAD_NUMBER)
    elif damage == "label" and not probabilities:
        rows[at][width] = " "
    elif damage == "short":
        rows[at] = rows[at][:-1]
    lines = [",".join(header)] + [",".join(r) for r in rows]
    if damage == "empty":
        lines.insert(at + 1, "")
    return "\n".join(lines) + "\n", decision


def _outcome(batches):
    try:
        return [
            (b.rows.tolist(), b.x.tolist(), np.asarray(b.decisions).tolist(), b.ids)
            for b in batches
        ]
    except StreamFormatError as e:
        return str(e)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams(), st.integers(1, 25))
def test_columnar_reading_equals_row_by_row_reading(tmp_path_factory, stream, batch_size):
    text, decision = stream
    path = tmp_path_factory.mktemp("csv") / "s.csv"
    path.write_text(text)
    _, batches = read_csv_stream(path, decision, id_column="id", batch_size=batch_size)
    header = _header(path)
    oracle = _rowwise(
        path, CsvLayout.from_header(header, decision, (), "id"), header, batch_size, 0
    )
    assert _outcome(batches) == _outcome(oracle)


def test_a_bad_cell_after_many_good_blocks_is_named_by_line_and_column(tmp_path):
    path = tmp_path / "s.csv"
    rows = [f"{i / 7},{i % 2}" for i in range(200_000)]
    rows[150_000] = "oops,1"
    path.write_text("a,y\n" + "\n".join(rows) + "\n")
    _, batches = read_csv_stream(path, ["y"], batch_size=4096)
    seen = 0
    with pytest.raises(StreamFormatError, match=r"line 150002, column 'a': 'oops' is not a number"):
        for batch in batches:
            assert batch.rows[0] == seen and len(batch.rows) == 4096
            seen += len(batch.rows)
    assert seen == 147_456  # every whole batch before the bad row, nothing after it
