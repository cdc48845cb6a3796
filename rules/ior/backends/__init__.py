"""Exact FRNN backends behind one interface; ``BACKENDS`` maps names to classes."""

from vigil.rules.ior.backends.auto import AutoBackend
from vigil.rules.ior.backends.base import Backend
from vigil.rules.ior.backends.bdd import BDDBackend
from vigil.rules.ior.backends.bruteforce import BruteForceBackend
from vigil.rules.ior.backends.grid import GridBackend
from vigil.rules.ior.backends.kdtree import KDTreeBackend
from vigil.rules.ior.backends.parallel import ParallelBackend, check_options
from vigil.rules.ior.backends.snn import SNNBackend

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
    try:
        check_options(**{"inner": "bruteforce", "workers": "threads", **options})
    except ValueError as e:
        raise ValueError(f"{text!r}: {e}") from None
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
