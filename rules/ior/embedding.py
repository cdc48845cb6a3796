"""Semantic robustness: measure d_in between embeddings given by an ONNX model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

_NUMPY_TYPES = {"tensor(float)": np.float32, "tensor(double)": np.float64}


class OnnxEmbedding:
    """An ONNX model mapping inputs (n, input_dim) to embeddings (n, dim), run with
    onnxruntime on the CPU. The model's first input and first output are used."""

    def __init__(self, model: bytes | str | Path) -> None:
        self.model_bytes = model if isinstance(model, bytes) else Path(model).read_bytes()
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        try:
            self._session = ort.InferenceSession(
                self.model_bytes, options, providers=["CPUExecutionProvider"]
            )
        except Exception as e:  # onnxruntime raises its own exception types
            raise ValueError(f"cannot load the embedding model: {e}") from None
        inp, out = self._session.get_inputs()[0], self._session.get_outputs()[0]
        if inp.type not in _NUMPY_TYPES or len(inp.shape) != 2:
            raise ValueError(
                f"embedding input must be a 2-d float tensor, got {inp.type} {inp.shape}"
            )
        self._input, self._output = inp.name, out.name
        self._dtype = _NUMPY_TYPES[inp.type]
        self.input_dim: int | None = inp.shape[1] if isinstance(inp.shape[1], int) else None
        probe = np.zeros((1, self.input_dim or 1))
        self.dim = self(probe).shape[1] if self.input_dim else None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x)
        if not len(x):
            return np.empty((0, self.dim or 0))
        if self.input_dim is not None and x.shape[1] != self.input_dim:
            raise ValueError(
                f"the embedding model takes {self.input_dim} features, got {x.shape[1]}"
            )
        (e,) = self._session.run([self._output], {self._input: x.astype(self._dtype)})
        return np.asarray(e, dtype=np.float64).reshape(len(x), -1)
