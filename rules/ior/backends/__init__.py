"""Exact FRNN backends behind one interface; ``BACKENDS`` maps names to classes."""

from rules.ior.backends.auto import AutoBackend
from rules.ior.backends.base import Backend
from rules.ior.backends.bdd import BDDBackend
from rules.ior.backends.bruteforce import BruteForceBackend
from rules.ior.backends.grid import GridBackend
from rules.ior.backends.kdtree import KDTreeBackend
from rules.ior.backends.parallel import ParallelBackend
from rules.ior.backends.snn import SNNBackend

BACKENDS: dict[str, type[Backend]] = {
    b.name: b
    for b in (
        AutoBackend,
        BDDBackend,
        BruteForceBackend,
        GridBackend,
        KDTreeBackend,
        ParallelBackend,
        SNNBackend,
    )
}


def parse_backend(text: str) -> tuple[str, dict]:
    """``name`` or ``parallel[:blocks[:inner[:workers]]]`` -> (backend name, options)."""
    name, *rest = text.split(":")
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {sorted(BACKENDS)}")
    if not rest:
        return name, {}
    if name != "parallel" or len(rest) > 3:
        raise ValueError(
            f"{text!r}: only parallel takes options, as parallel[:blocks[:inner[:workers]]]"
        )
    try:
        options: dict = {"blocks": int(rest[0])}
    except ValueError:
        raise ValueError(f"{text!r}: blocks must be an integer") from None
    options.update(zip(("inner", "workers"), rest[1:], strict=False))
    if options["blocks"] < 1:
        raise ValueError(f"{text!r}: blocks must be >= 1")
    if options.get("inner", "bruteforce") not in set(BACKENDS) - {"parallel"}:
        raise ValueError(f"{text!r}: the inner backend must be one of the others")
    if options.get("workers", "threads") not in ("threads", "processes"):
        raise ValueError(f"{text!r}: workers must be 'threads' or 'processes'")
    return name, options


__all__ = [
    "BACKENDS",
    "AutoBackend",
    "BDDBackend",
    "Backend",
    "BruteForceBackend",
    "GridBackend",
    "KDTreeBackend",
    "ParallelBackend",
    "SNNBackend",
    "parse_backend",
]
