"""`vigil` subcommands beyond the monitor's, one module each.

A module names the group it joins (``GROUP``: None for a top-level command, or "verify" or
"certify") and adds its parser in ``register(subparsers)``, setting ``handler`` to a function
``(args) -> exit code`` that prints its own output. A ``ValueError`` from the handler becomes
``vigil ...: error: <message>`` and exit code 2. ``load_npy`` reads array arguments,
``out_path`` checks output files and ``seed`` parses ``--seed``.
"""

from __future__ import annotations

import argparse
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


def seed(text: str) -> int:
    """An argparse type: a seed for numpy's generators is a non-negative integer."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value
