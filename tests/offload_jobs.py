"""Jobs for the offload tests (imported by spawned worker processes)."""

from __future__ import annotations

import os
import time


def run_job(request: dict) -> dict:
    """Sleep for ``request["sleep"]`` seconds; report when it ran. ``bad`` makes it refuse."""
    if request.get("bad"):
        raise ValueError("request field 'bad' is set")
    started = time.time()
    time.sleep(request.get("sleep", 0.0))
    return {"id": request.get("id"), "started": started, "finished": time.time()}


def interval(seconds: float) -> tuple[float, float]:
    started = time.time()
    time.sleep(seconds)
    return started, time.time()


def pid() -> int:
    return os.getpid()


def crash() -> None:
    """Die the way an out-of-memory kill does: no exception, no result."""
    os._exit(1)


def niceness() -> int:
    return os.nice(0)


def check_model_after_a_crash(onnx: bytes, output_dim: int) -> dict:
    """The reach lane's model check, whose first run (per marker file named in
    ``VIGIL_TEST_MARKER``) dies like an out-of-memory kill."""
    from pathlib import Path

    from vigil.rules.reach.worker import check_model

    marker = Path(os.environ["VIGIL_TEST_MARKER"])
    if not marker.exists():
        marker.touch()
        os._exit(1)
    return check_model(onnx, output_dim)
