"""The cyclic garbage collector's schedule, set for a process that works in batches."""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 100_000
"""Container allocations (net of frees) between two collections of the youngest generation
(Python's default: 700)."""


def collect_between_batches() -> None:
    """Take what start-up made out of the collector's generations, and collect the young
    generation every ``YOUNG_THRESHOLD`` allocations.

    Every decision allocates a few containers that live until its batch is answered (its
    record, the parsed event and its input list, the decision). With the default threshold
    a 5,000-decision batch was walked by a young collection every 700 of them and, being
    still alive, promoted and walked again by the older ones: 300 collections over the
    pipeline benchmark's 46,033-decision drain (docs/benchmarks.md). With a threshold above a
    batch's allocations most of a batch is freed, by reference counting, before any
    collection sees it. Start-up's objects (modules, models, clients) live as long as the
    process, and a full collection would walk them all (55-100 ms each, under load).
    """
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, oldest)
