"""Jobs for the Dask tests (imported by the Dask workers, which run with the repository on
their PYTHONPATH)."""

from __future__ import annotations

import os
import time
from pathlib import Path


def pid_after_marker(marker: str, seconds: float) -> int:
    """Write this process's pid to ``marker``, sleep, return the pid (a job to kill a worker
    under, or to time out)."""
    Path(marker).write_text(str(os.getpid()))
    time.sleep(seconds)
    return os.getpid()


def pid() -> int:
    return os.getpid()
