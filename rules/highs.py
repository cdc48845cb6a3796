"""HiGHS models that never write to stdout and all run on one thread.

highspy prints a version and copyright banner from C++ straight to file descriptor 1 the
first time a ``Highs`` object is made in a process, before ``output_flag`` can be switched
off. The CLI commands print JSON lines on stdout, so that banner would corrupt them. The
first construction therefore runs with fd 1 pointed at the null device; later ones print
nothing and are made directly.

HiGHS keeps one thread scheduler per process, made by the first solve; a later model whose
``threads`` option differs fails every solve (model status "Not Set"). An offload worker runs
KNN, counterfactual and batch jobs one after another, so every model here uses one thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading

import highspy

_lock = threading.Lock()
_banner_shown = False
"""Whether this process already made a ``Highs`` (and so HiGHS will not print its banner)."""


def _flush_c_stdout() -> None:
    """Write out C's stdio buffers (a no-op where there is no C library to ask)."""
    with contextlib.suppress(OSError, AttributeError, TypeError):
        ctypes.CDLL(None).fflush(None)


def _first_quietly() -> highspy.Highs:
    """Construct a ``Highs`` with fd 1 on the null device, restored whatever happens."""
    if sys.stdout is not None:
        sys.stdout.flush()  # what was printed so far still goes to the real stdout
    _flush_c_stdout()
    try:
        saved = os.dup(1)
    except OSError:  # no fd 1 at all: nothing to keep clean
        return highspy.Highs()
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, 1)
        finally:
            os.close(null)
        return highspy.Highs()
    finally:
        _flush_c_stdout()  # a banner still in C's buffer goes to the null device too
        os.dup2(saved, 1)
        os.close(saved)


def quiet_highs() -> highspy.Highs:
    """A new ``highspy.Highs`` with ``output_flag`` off and one thread, having printed
    nothing."""
    global _banner_shown
    if _banner_shown:
        h = highspy.Highs()
    else:
        with _lock:
            if _banner_shown:
                h = highspy.Highs()
            else:
                h = _first_quietly()
                _banner_shown = True
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    return h
