"""`vigil` subcommands beyond the monitor's, one module each.

A module names the group it joins (``GROUP``: None for a top-level command, or "verify" or
"certify") and adds its parser in ``register(subparsers)``, setting ``handler`` to a function
``(args) -> exit code`` that prints its own output. A ``ValueError`` from the handler becomes
``vigil ...: error: <message>`` and exit code 2. ``load_npy`` reads array arguments and
``seed`` parses ``--seed``.
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
    except (OSError, ValueError) as e:
        raise ValueError(f"{flag} {path}: not a .npy array ({e})") from None


def seed(text: str) -> int:
    """An argparse type: a seed for numpy's generators is a non-negative integer."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value
