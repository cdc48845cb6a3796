"""`vigil replay`'s CSV reading: row by row (csv module, the reader before) against column by
column (pyarrow), on a Certifair stream, medians over repeats; then the whole replay with
its parse and check seconds.

    python bench/replay_parse.py [--stream adult-base-P1] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
from ior_bench import timed
from streams import CERTIFAIR_ZIP

import vigil.daemon.replay as replay_module
from vigil.connectors.csv_source import CsvLayout, _header, _rowwise, read_csv_stream
from vigil.daemon.replay import ReplayOptions, replay


def consume(batches) -> tuple[np.ndarray, list]:
    xs, decisions = [], []
    for b in batches:
        xs.append(b.x)
        decisions += list(b.decisions)
    return np.concatenate(xs), decisions


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--stream", default="adult-base-P1")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--eps", type=float, default=0.04)
    args = p.parse_args()
    if not CERTIFAIR_ZIP.exists():
        print(f"skipped: {CERTIFAIR_ZIP} is absent", file=sys.stderr)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{args.stream}.csv"
        with zipfile.ZipFile(CERTIFAIR_ZIP) as z:
            path.write_bytes(z.read(f"predictions/{args.stream}-combined.csv"))
        decision, drop = ["prediction"], ["label"]
        header = _header(path)
        layout = CsvLayout.from_header(header, decision, drop)

        def rowwise():
            return consume(_rowwise(path, layout, header, 4096, skip=0))

        def columnar():
            return consume(read_csv_stream(path, decision, drop, batch_size=4096)[1])

        before, (x0, d0) = timed(rowwise, args.repeats)
        after, (x1, d1) = timed(columnar, args.repeats)
        same = np.array_equal(x0, x1) and d0 == d1
        print(
            f"{args.stream}: {len(x0)} decisions x {x0.shape[1]} features, medians of "
            f"{args.repeats} runs"
        )
        print(f"{'reader':<24}{'seconds':>9}{'speed-up':>10}")
        print(f"{'row by row (before)':<24}{before:>9.3f}{1.0:>10.2f}")
        print(f"{'columnar (after)':<24}{after:>9.3f}{before / after:>10.2f}   same rows: {same}")

        opts = ReplayOptions(
            decision_columns=decision, drop_columns=drop, eps=args.eps, progress=False
        )
        columnar_reader = replay_module.read_csv_stream

        def rowwise_reader(path, decision_columns, drop_columns=(), id_column=None, size=4096):
            header = _header(path)
            found = CsvLayout.from_header(header, decision_columns, drop_columns, id_column)
            return found, _rowwise(Path(path), found, header, size, skip=0)

        print(f"vigil replay --eps {args.eps}:")
        for name, reader in (("before", rowwise_reader), ("after", columnar_reader)):
            replay_module.read_csv_stream = reader
            runs = [replay(path, opts) for _ in range(args.repeats)]
            keys = ("seconds", "parse_seconds", "check_seconds")
            medians = {k: statistics.median(r[k] for r in runs) for k in keys}
            print(
                f"  {name:<7} flagged {runs[0]['flagged']}, "
                + ", ".join(f"{k} {v:.3f}" for k, v in medians.items())
            )
        replay_module.read_csv_stream = columnar_reader
        return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
