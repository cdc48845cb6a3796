"""One side of an inference, as read from a serving stack's record."""

from __future__ import annotations

from typing import Literal

import msgspec
import numpy as np

from vigil.connectors.serving.oip import Tensor

Role = Literal["request", "response"]


class Inference(msgspec.Struct, gc=False):
    """A request's inputs or a response's outputs. ``join_key`` pairs a request with its
    response (the two records carry the same one); ``request_id`` names the decisions
    (``<request_id>/<row>``); ``error`` is the serving stack's error text when the
    inference failed (then there are no tensors). ``row``, when set, is the one decision
    row read from the message's bytes by its layout, as ``Decision`` holds it: the input
    as a float64 vector, the output as an int label or a list of probabilities (then
    ``tensors`` is empty). Built once per record and never modified; a struct, as
    ``Record`` is."""

    join_key: str
    request_id: str
    role: Role
    model: str
    tensors: list[Tensor]
    error: str | None = None
    row: np.ndarray | int | list[float] | None = None
