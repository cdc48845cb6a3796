"""The C allocator's thresholds, set for a process whose batches allocate growing arrays."""

from __future__ import annotations

import ctypes
import os

MMAP_THRESHOLD = 32 << 20
"""Allocations below this come from the allocator's heap, not from fresh mappings."""
TRIM_THRESHOLD = 64 << 20
"""Freed memory at the heap's top is kept up to this much, not handed back at once."""
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (glibc's malloc.h)
_ENVIRONMENT = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def keep_freed_memory() -> bool:
    """Have glibc reuse freed memory for the temporaries of every batch.

    By default glibc maps every allocation larger than the largest block freed so far
    afresh and unmaps it when freed. The monitor's per-batch arrays (candidate pairs, their
    rows and distances: megabytes in a backlog's batches) grow with the history, so each
    new size is mapped again, and every 4 KiB of it costs a page fault when first written:
    that doubled the cost of the exact check on the pipeline benchmark
    (bench/pipeline_cpu.py, docs/benchmarks.md). Fixed thresholds serve them from the
    heap instead. Returns False, changing nothing, where the C library has no ``mallopt``
    that takes them (musl, macOS) or the environment sets glibc's own variables for them.
    """
    if any(name in os.environ for name in _ENVIRONMENT):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
