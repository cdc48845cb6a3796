"""Argument types and readers the commands share; each names the flag in its errors.

The checkers behind ``backend`` and ``scheduler`` are imported when those types are used,
so a command that takes neither starts without the monitor's and the cluster's libraries.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np


def load_npy(path: Path, flag: str) -> np.ndarray:
    """A numeric .npy array given on the command line, with errors that name the flag."""
    if not path.is_file():
        raise ValueError(f"{flag} {path}: no such file")
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise ValueError(f"{flag} {path}: not a .npy array ({e or 'empty file'})") from None


def out_path(text: str) -> Path:
    """An argparse type: a file to write, checked before any work is done."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"no directory {path.parent} to write {path.name} in")
    return path


def byte_size(text: str) -> int:
    """An argparse type: a size in bytes, ``256MB`` (10^6) or ``2GiB`` (2^30) and the like."""
    from pydantic import ByteSize, TypeAdapter, ValidationError

    try:
        size = int(TypeAdapter(ByteSize).validate_python(text))
    except ValidationError:
        raise argparse.ArgumentTypeError(
            f"expected a size such as 256MB or 2GiB, got {text!r}"
        ) from None
    if size <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive size, got {text!r}")
    return size


def seed(text: str) -> int:
    """An argparse type: a seed for numpy's generators is a non-negative integer."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value


def backend(text: str) -> str:
    """An argparse type: a monitor backend spec (``auto``, ``parallel:4``, ...)."""
    from vigil.rules.ior.backends import parse_backend

    try:
        parse_backend(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def scale_pair(text: str) -> tuple[str, float]:
    """An argparse type: ``COLUMN=FACTOR``."""
    name, sep, value = text.rpartition("=")
    try:
        factor = float(value)
    except ValueError:
        factor = None
    if not sep or not name or factor is None:
        raise argparse.ArgumentTypeError(f"expected COLUMN=FACTOR, got {text!r}")
    return name, factor


def threshold(text: str) -> float:
    """An argparse type: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def scheduler(text: str) -> str:
    """An argparse type: a Dask scheduler address, ``tcp://HOST:PORT``."""
    from vigil.daemon.offload import scheduler_address

    try:
        return scheduler_address(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def add_cluster_options(
    p: argparse.ArgumentParser, runs: str, chunk_size: int, per_task: str
) -> None:
    """``--scheduler`` (run the work on a Dask cluster's workers: ``runs``) and
    ``--chunk-size`` (``per_task``, default ``chunk_size``)."""
    p.add_argument(
        "--scheduler",
        type=scheduler,
        metavar="tcp://HOST:PORT",
        help=f"{runs} (same results as a local run)",
    )
    p.add_argument(
        "--chunk-size",
        type=positive_int,
        default=chunk_size,
        metavar="N",
        help=f"with --scheduler: {per_task} (default {chunk_size})",
    )
