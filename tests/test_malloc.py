"""The daemon's allocator thresholds: batches of growing arrays stop faulting in fresh pages."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

_GROWING_ARRAYS = """
import resource, sys
import numpy as np
from vigil.daemon.malloc import keep_freed_memory
tuned = sys.argv[1] == "tuned" and keep_freed_memory()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for i in range(60):  # 1 MiB, growing by 32 KiB a batch, as a batch's candidate pairs do
    a = np.ones((1 << 17) + i * 4096)
    del a
print(int(tuned), resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str, env: dict | None = None) -> tuple[bool, int]:
    out = subprocess.run(
        [sys.executable, "-c", _GROWING_ARRAYS, mode],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout.split()
    return bool(int(out[0])), int(out[1])


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="the thresholds are glibc's",
)
def test_growing_batch_arrays_reuse_freed_memory_once_the_thresholds_are_set():
    tuned, faults = _faults("tuned")
    _, default_faults = _faults("default")
    assert tuned
    # 60 arrays of 1-3 MiB: 256-700 pages each when mapped afresh, once in all when reused
    assert default_faults > 60 * 256
    assert faults < default_faults / 10


def test_an_environment_that_sets_the_thresholds_is_left_alone():
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    tuned, _ = _faults("tuned", env)
    assert not tuned
