"""The online i.o.r. monitor: decisions in stream order in, witness sets out."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import numpy as np
import orjson

from vigil.rules.ior.backends import BACKENDS, Backend
from vigil.rules.ior.backends.base import Verified, verify
from vigil.rules.ior.embedding import OnnxEmbedding
from vigil.rules.ior.history import History
from vigil.rules.ior.spec import MonitorSpec, OutputKind
from vigil.rules.ior.witnesses import Witnesses

_SNAPSHOT_MAGIC = b"VIGIL-IOR/1\n"


class InvalidDecision(ValueError):
    """A decision the monitor cannot accept; ``row`` is its index within the batch."""

    def __init__(self, row: int, message: str) -> None:
        super().__init__(f"row {row}: {message}")
        self.row = row


class Monitor:
    """Exact witness sets for every decision against all earlier ones.

    ``check_batch`` treats its rows as the next decisions of the stream, in order: each is
    compared with the history and with the rows before it in the same batch. The history is
    every earlier decision, or with ``history_limit`` a window of the most recent ones.
    """

    def __init__(
        self,
        spec: MonitorSpec,
        backend: str = "auto",
        embedding: OnnxEmbedding | None = None,
        history_limit: int | None = None,
        **options: Any,
    ) -> None:
        """With ``embedding``, decisions' inputs are mapped through it and ``spec`` (its
        ``dim``, ``ignore``, ``scale``) describes the embedding space.

        ``history_limit`` bounds memory for long runs: when a batch would take the history
        past it, the oldest decisions are dropped, as many as needed and a quarter of the
        limit at least, so the index is rebuilt at most once every ``history_limit / 4``
        decisions. A decision is then compared with the most recent decisions that remain
        (about ``3/4 * history_limit`` less the batch before it)."""
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; choose one of {sorted(BACKENDS)}")
        if history_limit is not None and history_limit < 1:
            raise ValueError(f"history_limit must be >= 1, got {history_limit}")
        if embedding is not None and embedding.dim not in (None, spec.dim):
            raise ValueError(
                f"the embedding has {embedding.dim} dimensions, spec.dim is {spec.dim}"
            )
        self.spec = spec
        self.embedding = embedding
        self.history_limit = history_limit
        self.evicted = 0
        self.history = History(spec)
        self.backend: Backend = BACKENDS[backend](spec, self.history, **options)

    def use_backend(self, backend: str, options: dict[str, Any]) -> None:
        """Index the history with another backend from now on (every backend finds the same
        witnesses; they differ in speed). Options left out keep the backend's defaults."""
        current = self.backend.options()
        if backend == self.backend.name and all(current.get(k) == v for k, v in options.items()):
            return
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; choose one of {sorted(BACKENDS)}")
        self.backend = BACKENDS[backend](self.spec, self.history, **options)

    @property
    def size(self) -> int:
        """Decisions in the history."""
        return self.history.size

    def check_batch(
        self, x: np.ndarray, y: np.ndarray | Sequence, ids: Sequence | None = None
    ) -> Witnesses:
        """Append decisions ``(x[i], y[i])`` and return each one's witness set.

        ``ids`` name the decisions in results (default: their stream positions).
        """
        if self.embedding is not None:
            x = self._embed(x)
        x, y = self._validate(x, y)
        if ids is None:
            first = self.evicted + self.size
            ids = range(first, first + len(x))
        elif len(ids) != len(x):
            raise ValueError(f"{len(ids)} ids for {len(x)} decisions")
        limit = self.history_limit
        if limit is not None and self.size + len(x) > limit:
            self._evict(min(self.size, max(self.size + len(x) - limit, -(-limit // 4))), limit)
        start, stop = self.history.append(self.spec.view(x), y, list(ids), limit)
        if start == stop:  # nothing to index or search
            q = j = np.empty(0, dtype=np.int64)
        else:
            q, j = self.backend.advance(start, stop)
        spec = self.spec
        found = verify(self.history, q, j, 0.0 if spec.quantitative else spec.delta)
        witnesses = found.d_out > spec.delta
        shift = self.evicted  # history positions -> stream positions
        result = Witnesses.from_pairs(
            start + shift,
            stop - start,
            found.query[witnesses] + shift,
            found.index[witnesses] + shift,
            found.d_in[witnesses],
        )
        if spec.quantitative:
            ratios, best = largest_ratios(start, stop - start, found)
            result = result.with_ratios(ratios, np.where(best >= 0, best + shift, -1))
        return result

    def _evict(self, count: int, limit: int) -> None:
        """Drop the ``count`` oldest decisions and index the rest afresh (in columns with
        room for the whole window, so they do not grow again)."""
        old = self.history
        self.history = History(self.spec, capacity=max(1024, limit))
        self.history.append(old.x[count:], old.y[count:], old.ids[count:], limit)
        self.backend = BACKENDS[self.backend.name](
            self.spec, self.history, **self.backend.options()
        )
        self.evicted += count

    def ids(self, positions: Sequence[int] | np.ndarray) -> list:
        """External ids of stream positions still in the history."""
        return [self.history.ids[p - self.evicted] for p in positions]

    def outputs(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        """Outputs of stream positions still in the history."""
        return self.history.y[np.asarray(positions, dtype=np.int64) - self.evicted]

    def _embed(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        bad = ~np.isfinite(x)
        if x.ndim != 2 or bad.any():
            if x.ndim != 2:
                raise ValueError(f"inputs must be a 2-d array, got shape {x.shape}")
            row, col = np.argwhere(bad)[0]
            raise InvalidDecision(int(row), f"feature {col} is {x[row, col]} (must be finite)")
        return self.embedding(x)

    def _validate(self, x: np.ndarray, y: np.ndarray | Sequence) -> tuple[np.ndarray, np.ndarray]:
        spec = self.spec
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != spec.dim:
            raise ValueError(f"inputs must have shape (n, {spec.dim}), got {x.shape}")
        bad = ~np.isfinite(x)
        if bad.any():
            row, col = np.argwhere(bad)[0]
            raise InvalidDecision(int(row), f"feature {col} is {x[row, col]} (must be finite)")
        if spec.output is OutputKind.LABEL:
            y = np.asarray(y)
            if y.shape != (len(x),):
                raise ValueError(f"labels must have shape ({len(x)},), got {y.shape}")
            if y.dtype.kind == "f":
                frac = ~np.isfinite(y) | (y != np.round(y))
                if frac.any():
                    row = int(np.flatnonzero(frac)[0])
                    raise InvalidDecision(row, f"label {y[row]} is not an integer")
            elif y.dtype.kind not in "iub":
                raise ValueError(f"labels must be integers, got dtype {y.dtype}")
            return x, y.astype(np.int64)
        y = np.asarray(y, dtype=np.float64)
        if y.shape != (len(x), spec.output_dim):
            raise ValueError(
                f"outputs must have shape ({len(x)}, {spec.output_dim}), got {y.shape}"
            )
        bad = ~np.isfinite(y)
        if bad.any():
            row = int(np.argwhere(bad)[0][0])
            raise InvalidDecision(row, "output vector has a non-finite entry")
        return x, y

    @property
    def position(self) -> int:
        """The stream position after the last decision (evicted ones included)."""
        return self.evicted + self.size

    def snapshot(self, since: int | None = None) -> bytes:
        """Everything needed to continue the stream with identical witness sets; with
        ``since`` (a stream position from ``position``, not yet evicted), only the decisions
        from there on: a segment that ``restore`` appends to the snapshot it continues."""
        h = self.history
        first = self.evicted if since is None else since
        if not self.evicted <= first <= self.position:
            raise ValueError(
                f"cannot snapshot from position {first}: the history holds "
                f"{self.evicted}..{self.position}"
            )
        rows = slice(first - self.evicted, h.size)
        header = {
            "spec": self.spec.to_dict(),
            "backend": self.backend.name,
            "options": self.backend.options(),
            "first": first,
            "size": h.size - rows.start,
            "history_limit": self.history_limit,
            "evicted": self.evicted,
            "base": since is None,
        }
        embedding = self.embedding.model_bytes if self.embedding and since is None else b""
        buf = io.BytesIO()
        np.savez(
            buf,
            header=np.frombuffer(orjson.dumps(header), dtype=np.uint8),
            ids=np.frombuffer(
                orjson.dumps(h.ids[rows], option=orjson.OPT_SERIALIZE_NUMPY), dtype=np.uint8
            ),
            x=h.x[rows],
            y=h.y[rows],
            embedding=np.frombuffer(embedding, dtype=np.uint8),
        )
        return _SNAPSHOT_MAGIC + buf.getvalue()

    @classmethod
    def restore(cls, base: bytes, *segments: bytes) -> Monitor:
        """Recreate a monitor from a ``snapshot()`` and the segments that continue it, in
        order (each must begin where the one before it ends)."""
        parts = [_read_part(blob) for blob in (base, *segments)]
        header, _, _, _, model = parts[0]
        if not header.get("base", True):
            raise ValueError("the first part of an i.o.r. snapshot is a segment, not a base")
        for (before, *_), (after, *_) in pairwise(parts):
            if after.get("base", True) or after["first"] != before["first"] + before["size"]:
                raise ValueError(
                    "i.o.r. snapshot segments do not continue each other "
                    f"({before['first']}+{before['size']} then {after['first']})"
                )
        last = parts[-1][0]
        evicted = last.get("evicted", 0)
        drop = evicted - header["first"]
        if not 0 <= drop <= sum(p[0]["size"] for p in parts):
            raise ValueError(f"i.o.r. snapshot evicted {evicted} lies outside its parts")
        embedding = OnnxEmbedding(model) if model else None
        monitor = cls(
            MonitorSpec.from_dict(last["spec"]),
            last["backend"],
            embedding,
            last.get("history_limit"),
            **last["options"],
        )
        ids = [i for _, part_ids, _, _, _ in parts for i in part_ids][drop:]
        x = np.concatenate([p[2] for p in parts])[drop:]
        y = np.concatenate([p[3] for p in parts])[drop:]
        monitor.evicted = evicted
        monitor.history.append(x, y, ids)
        monitor.backend.rebuild()
        return monitor


def _read_part(blob: bytes) -> tuple[dict, list, np.ndarray, np.ndarray, bytes]:
    """(header, ids, x, y, embedding model) of one snapshot part, checked for size."""
    if not blob.startswith(_SNAPSHOT_MAGIC):
        raise ValueError("not an i.o.r. monitor snapshot")
    try:
        with np.load(io.BytesIO(blob[len(_SNAPSHOT_MAGIC) :]), allow_pickle=False) as f:
            header = orjson.loads(f["header"].tobytes())
            ids = orjson.loads(f["ids"].tobytes())
            x, y = f["x"], f["y"]
            model = f["embedding"].tobytes()
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as e:
        raise ValueError(f"corrupt i.o.r. monitor snapshot: {e}") from None
    if len(x) != header["size"] or len(ids) != header["size"]:
        raise ValueError("snapshot is truncated: sizes disagree")
    header.setdefault("first", header.get("evicted", 0))  # written before segments existed
    return header, ids, x, y, model


def largest_ratios(first: int, size: int, found: Verified) -> tuple[np.ndarray, np.ndarray]:
    """Per decision, the largest ``d_out / d_in`` over earlier decisions within eps (inf for
    an identical input with another output; 0 with no such decision) and its arg-max
    position (the earliest on ties; -1 with none)."""
    with np.errstate(divide="ignore"):
        ratio = found.d_out / found.d_in
    order = np.lexsort((found.index, -ratio, found.query))
    q = found.query[order]
    first_of_q = np.ones(len(q), dtype=bool)
    first_of_q[1:] = q[1:] != q[:-1]
    best = order[first_of_q]
    ratios = np.zeros(size)
    witness = np.full(size, -1, dtype=np.int64)
    ratios[found.query[best] - first] = ratio[best]
    witness[found.query[best] - first] = found.index[best]
    return ratios, witness
