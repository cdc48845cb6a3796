"""``vigil replay``: stream a CSV of decisions through the i.o.r. monitor, in order."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from tqdm import tqdm

from vigil.connectors.csv_source import read_csv_stream
from vigil.daemon.adapters.ior import witness_alerts
from vigil.rules.ior import Monitor, MonitorSpec, OutputKind
from vigil.rules.ior.backends import parse_backend
from vigil.rules.ior.embedding import OnnxEmbedding


class LabelCodes:
    """Integer codes for decision labels; numeric labels keep their numeric JSON form."""

    def __init__(self) -> None:
        self._codes: dict[Any, int] = {}
        self._values: list[Any] = []

    def encode(self, tokens: Sequence[str]) -> np.ndarray:
        distinct, inverse = np.unique(np.asarray(tokens), return_inverse=True)
        codes = np.array([self._code(_label_value(t)) for t in distinct], dtype=np.int64)
        return codes[inverse]

    def decode(self, code: int) -> Any:
        return self._values[int(code)]

    def _code(self, value: Any) -> int:
        code = self._codes.get(value)
        if code is None:
            code = self._codes[value] = len(self._values)
            self._values.append(value)
        return code


def _label_value(token: str) -> Any:
    try:
        number = float(token)
    except ValueError:
        return token
    return int(number) if number.is_integer() else number


@dataclass(frozen=True)
class ReplayOptions:
    decision_columns: Sequence[str]
    eps: float
    metric: str = "linf"
    delta: float = 0.0
    output_metric: str = "linf"
    backend: str = "auto"
    batch_size: int = 4096
    history_limit: int | None = None
    drop_columns: Sequence[str] = ()
    ignore_columns: Sequence[str] = ()
    scale: dict[str, float] | None = None
    id_column: str | None = None
    alerts_out: Path | None = None
    progress: bool = True
    embedding: Path | None = None
    quantitative: bool = False
    ratio_threshold: float | None = None


def replay(path: Path, opts: ReplayOptions) -> dict[str, Any]:
    """Run the stream through a fresh monitor; write alerts if asked; return the summary.

    Raises ``StreamFormatError`` (bad file) or ``ValueError`` (bad options) before any
    alert for a later row is written.
    """
    started = time.perf_counter()
    layout, batches = read_csv_stream(
        path, opts.decision_columns, opts.drop_columns, opts.id_column, opts.batch_size
    )
    backend, backend_options = parse_backend(opts.backend)
    dim, embedding = len(layout.features), None
    if opts.embedding is not None:
        if opts.ignore_columns or opts.scale:
            raise ValueError("--ignore-columns and --scale do not apply with --embedding")
        embedding = OnnxEmbedding(opts.embedding)
        if embedding.input_dim not in (None, dim):
            raise ValueError(
                f"--embedding: the model takes {embedding.input_dim} features, the stream has {dim}"
            )
        dim = embedding.dim or embedding(np.zeros((1, dim))).shape[1]
    quantitative = opts.quantitative or opts.ratio_threshold is not None
    spec = MonitorSpec(
        dim=dim,
        eps=opts.eps,
        quantitative=quantitative,
        metric=opts.metric,
        delta=opts.delta,
        output_metric=opts.output_metric,
        output="label" if len(opts.decision_columns) == 1 else "probabilities",
        output_dim=len(opts.decision_columns),
        ignore=_feature_indices(layout.features, opts.ignore_columns, "--ignore-columns"),
        scale=_scale_vector(layout.features, opts.scale),
    )
    monitor = Monitor(spec, backend, embedding, opts.history_limit, **backend_options)
    labels = LabelCodes()
    output_value = labels.decode if spec.output is OutputKind.LABEL else None
    flagged = pairs = decisions = above = 0
    max_ratio = check_seconds = parse_seconds = 0.0
    sink = open(opts.alerts_out, "wb") if opts.alerts_out else nullcontext()  # noqa: SIM115
    bar = tqdm(
        desc="replay",
        unit=" decisions",
        file=sys.stderr,
        disable=not opts.progress,
        delay=1.0,
        mininterval=0.5,
    )
    with sink as out, bar:
        while True:
            reading = time.perf_counter()
            batch = next(batches, None)
            parse_seconds += time.perf_counter() - reading
            if batch is None:
                break
            y = (
                labels.encode(batch.decisions)
                if spec.output is OutputKind.LABEL
                else batch.decisions
            )
            ids = batch.ids if batch.ids is not None else batch.rows.tolist()
            checking = time.perf_counter()
            w = monitor.check_batch(batch.x, y, ids)
            check_seconds += time.perf_counter() - checking
            decisions += len(w)
            flagged += len(w.flagged)
            pairs += w.pairs
            bar.update(len(w))
            rows = w.flagged
            if quantitative:
                max_ratio = max(max_ratio, float(w.ratio.max(initial=0.0)))
                if opts.ratio_threshold is not None:
                    rows = rows[w.ratio[rows] > opts.ratio_threshold]
                above += len(rows)
            if out is not None and len(rows):

                def context(i: int, rows=batch.rows) -> tuple[str, dict[str, Any]]:
                    return path.stem, {"file": str(path), "row": int(rows[i])}

                for _, alert in witness_alerts("replay", monitor, w, context, output_value, rows):
                    out.write(orjson.dumps(alert) + b"\n")
    seconds = time.perf_counter() - started
    summary = {
        "decisions": decisions,
        "flagged": flagged,
        "witness_pairs": pairs,
        "seconds": round(seconds, 4),
        "parse_seconds": round(parse_seconds, 4),
        "check_seconds": round(check_seconds, 4),
        "backend": opts.backend,
    }
    if quantitative:
        summary["max_ratio"] = max_ratio if math.isfinite(max_ratio) else None
        summary["alerted"] = above
    return summary


def _feature_indices(features: list[str], names: Sequence[str], option: str) -> tuple[int, ...]:
    unknown = [n for n in names if n not in features]
    if unknown:
        raise ValueError(f"{option}: not feature columns: {', '.join(unknown)}")
    return tuple(features.index(n) for n in names)


def _scale_vector(features: list[str], scale: dict[str, float] | None) -> tuple[float, ...] | None:
    if not scale:
        return None
    _feature_indices(features, list(scale), "--scale")
    return tuple(scale.get(f, 1.0) for f in features)
