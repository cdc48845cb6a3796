"""Daemon offload: ``run_job(request) -> result`` certifies a batch of inputs against a training
set, in a worker process. The learned model and KSet are cached per worker, keyed by a hash of
the training data and learning options, so repeated requests on the same data only pay for
abstract prediction.

Request (JSON object; see connectors/schemas/knn_request.json):

* training data, one of
  - ``train``: ``{"x": [[v, ...], ...], "y": [label, ...], "columns": [name, ...]?}`` inline
    rows of raw values (numbers or strings); columns default to ``c0, c1, ...``;
  - ``train_path`` (a CSV file with a header row readable by the worker) with ``target`` (a
    column name or ``COL>=VALUE``) and optional ``sep``;
* ``protected``: protected attributes, as column names or (inline form) column indices;
* ``categorical`` (optional): columns forced to one-hot, names or indices;
* ``flips``: n, the number of possibly biased labels;
* ``eps`` (default 0.01): fraction of each unprotected numeric attribute's range, one number or
  one per feature column; used by the epsilon variant;
* ``variant`` (default "epsilon"): "label", "individual" or "epsilon";
* ``inputs``: rows of raw feature values, in the training feature column order;
* optional ``k`` (candidate K list), ``folds`` (p), ``metric`` ("euclidean"/"manhattan"),
  ``scaling`` of numeric columns ("minmax"/"standard"), ``id`` (echoed).

Result: ``id``, ``variant``, ``flips``, ``k`` (learned K), ``kset``, ``train_hash``, ``cached``,
``learn_seconds``, ``results`` (per input: ``index``, ``label``, ``certified``, ``status``
"certified"/"unknown", ``failed_k``, ``seconds``), ``certified`` (count), ``rate``,
``seconds`` (prediction time of the batch).
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from vigil.rules.certify.knn.certifier import DEFAULT_FOLDS, VARIANTS, FairKnnCertifier
from vigil.rules.certify.knn.errors import KnnInputError
from vigil.rules.certify.knn.table import Table, check_unique, read_csv, split_target

CACHE_SIZE = 8
"""Trained certifiers kept per worker process."""

_cache: OrderedDict[str, FairKnnCertifier] = OrderedDict()


def _field(request: dict, name: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
    if name not in request:
        if default is ...:
            raise KnnInputError(f"request field {name!r} is required")
        return default
    value = request[name]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise KnnInputError(f"request field {name!r} has the wrong type: {type(value).__name__}")
    return value


def _names(request: dict, name: str, columns: list[str]) -> list[str]:
    values = _field(request, name, list, [])
    out = []
    for v in values:
        if isinstance(v, int) and not isinstance(v, bool):
            if not 0 <= v < len(columns):
                raise KnnInputError(f"request field {name!r}: column index {v} out of range")
            out.append(columns[v])
        elif isinstance(v, str) and v in columns:
            out.append(v)
        else:
            raise KnnInputError(f"request field {name!r}: unknown column {v!r}")
    return out


def _training(request: dict) -> tuple[Table, np.ndarray, bytes]:
    """Feature table, labels and the bytes that identify the training data."""
    if "train" in request:
        train = _field(request, "train", dict)
        x = train.get("x")
        y = train.get("y")
        if not isinstance(x, list) or not x or not all(isinstance(r, list) for r in x):
            raise KnnInputError("request field 'train.x' must be a non-empty list of rows")
        if not isinstance(y, list) or len(y) != len(x):
            raise KnnInputError(f"request field 'train.y' must list one label per row ({len(x)})")
        width = len(x[0])
        if any(len(r) != width for r in x):
            raise KnnInputError("request field 'train.x': rows differ in length")
        columns = train.get("columns")
        if columns is None:
            columns = [f"c{j}" for j in range(width)]
        if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
            raise KnnInputError("request field 'train.columns' must be a list of strings")
        if len(columns) != width:
            raise KnnInputError(f"request field 'train.columns' must name {width} columns")
        check_unique(columns, "request field 'train.columns'")
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in y):
            labels = np.asarray(y)
        else:
            labels = np.array([str(v) for v in y], dtype=object)
        return Table(list(columns), x), labels, orjson.dumps(train)
    path = Path(_field(request, "train_path", str))
    target = _field(request, "target", str)
    sep = _field(request, "sep", str, None)
    table = read_csv(path, sep)
    feats, labels = split_target(table, target)
    return feats, labels, path.read_bytes() + orjson.dumps([target, sep])


def _certifier(request: dict) -> tuple[FairKnnCertifier, Table, str, bool]:
    table, labels, ident = _training(request)
    protected = _names(request, "protected", table.columns)
    categorical = _names(request, "categorical", table.columns)
    flips = _field(request, "flips", int)
    ks = _field(request, "k", list, None)
    folds = _field(request, "folds", int, DEFAULT_FOLDS)
    metric = _field(request, "metric", str, "euclidean")
    scaling = _field(request, "scaling", str, "minmax")
    options = orjson.dumps([protected, categorical, flips, ks, folds, metric, scaling])
    key = hashlib.sha256(ident + b"\0" + options).hexdigest()
    if key in _cache:
        _cache.move_to_end(key)
        return _cache[key], table, key, True
    cert = FairKnnCertifier.from_table(
        table, labels, protected, flips, categorical, ks, folds, metric, scaling
    )
    _cache[key] = cert
    while len(_cache) > CACHE_SIZE:
        _cache.popitem(last=False)
    return cert, table, key, False


def run_job(request: dict) -> dict:
    """Certify ``request["inputs"]`` (see the module docstring for the fields)."""
    if not isinstance(request, dict):
        raise KnnInputError("the request must be a JSON object")
    variant = _field(request, "variant", str, "epsilon")
    if variant not in VARIANTS:
        raise KnnInputError(f"request field 'variant' must be one of {', '.join(VARIANTS)}")
    eps = _field(request, "eps", (int, float, list), 0.01)
    inputs = _field(request, "inputs", list)
    cert, table, key, cached = _certifier(request)
    if any(not isinstance(r, list) or len(r) != len(table.columns) for r in inputs):
        raise KnnInputError(
            f"request field 'inputs': each row must list the {len(table.columns)} feature values"
        )
    x = cert.encoder.transform(Table(table.columns, inputs))
    started = time.perf_counter()
    certs = cert.certify(x, variant, eps) if inputs else []
    results = [
        {
            "index": i,
            "label": cert.label_value(c.label),
            "certified": c.certified,
            "status": "certified" if c.certified else "unknown",
            "failed_k": c.failed_k,
            "seconds": c.seconds,
        }
        for i, c in enumerate(certs)
    ]
    done = sum(c.certified for c in certs)
    return {
        "id": request.get("id"),
        "variant": variant,
        "flips": cert.flips,
        "k": cert.k,
        "kset": [int(k) for k in cert.kset],
        "train_hash": key,
        "cached": cached,
        "learn_seconds": cert.learn_seconds,
        "results": results,
        "certified": done,
        "rate": done / len(certs) if certs else 0.0,
        "seconds": time.perf_counter() - started,
    }
