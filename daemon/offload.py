"""The offload pool: heavy, pure jobs run in worker processes, never on the event loop.

Jobs are top-level functions over picklable arguments. ``submit`` returns at once with an
``asyncio`` future, so a batch's jobs run side by side and the consumer does not wait for
them; the pool bounds how many are in flight (callers check ``saturated`` to stop fetching)
and gives each a deadline. The executor is any ``concurrent.futures.Executor``, so a
distributed one can take the process pool's place.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import structlog
from threadpoolctl import threadpool_limits

from daemon.metrics import Metrics

log = structlog.get_logger("vigil.offload")
_PARENT_POLL_SECONDS = 1.0


@dataclass(frozen=True)
class JobOutcome:
    """What a finished job gives back: its value, or why there is none."""

    value: Any = None
    status: str = "ok"  # ok | invalid | error | timeout
    error: str | None = None
    seconds: float = 0.0


def process_executor(workers: int, niceness: int = 0) -> ProcessPoolExecutor:
    """Worker processes started with ``spawn`` (a forked copy of a running event loop and
    Kafka client threads is not safe), ``niceness`` steps below the daemon's scheduling
    priority (so certifications yield the CPU to the decision stream), that exit when the
    daemon is gone, even if it was killed without a shutdown."""
    return ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_start_worker,
        initargs=(os.getpid(), niceness),
    )


def _start_worker(parent: int, niceness: int) -> None:
    # one job, one core: the pool's size sets the parallelism; BLAS and OpenMP thread pools
    # (started when the spawned process imported the daemon's modules) would take the
    # cores the decision stream needs
    threadpool_limits(1)
    if niceness:
        os.nice(niceness)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_PARENT_POLL_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


class OffloadPool:
    """A bounded set of in-flight jobs on an executor, with deadlines and metrics."""

    def __init__(
        self,
        executor: Executor,
        metrics: Metrics,
        max_pending: int,
        timeout_seconds: float,
        name: str = "default",
    ) -> None:
        if max_pending < 1 or timeout_seconds <= 0:
            raise ValueError("max_pending must be >= 1 and timeout_seconds > 0")
        self.executor = executor
        self.metrics = metrics
        self.max_pending = max_pending
        self.timeout_seconds = timeout_seconds
        self.name = name
        self.pending = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._space = asyncio.Event()
        self._space.set()

    @property
    def saturated(self) -> bool:
        return self.pending >= self.max_pending

    async def wait_for_space(self) -> None:
        await self._space.wait()

    async def drain(self) -> None:
        """Wait until no job is in flight."""
        await self._idle.wait()

    def submit(self, kind: str, fn: Callable[..., Any], *args: Any) -> asyncio.Future:
        """Start ``fn(*args)`` in a worker; the future resolves to a ``JobOutcome``."""
        self._track(+1)
        return asyncio.ensure_future(self._run(kind, fn, args))

    async def _run(self, kind: str, fn: Callable[..., Any], args: tuple) -> JobOutcome:
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        try:
            value = await asyncio.wait_for(
                loop.run_in_executor(self.executor, fn, *args), self.timeout_seconds
            )
            outcome = JobOutcome(value)
        except TimeoutError:
            outcome = JobOutcome(
                status="timeout", error=f"no result within {self.timeout_seconds:g} s"
            )
        except ValueError as e:  # the job's own validation: the request is at fault
            outcome = JobOutcome(status="invalid", error=str(e))
        except BrokenProcessPool as e:
            log.error("offload_worker_died", pool=self.name, kind=kind, error=str(e))
            outcome = JobOutcome(status="error", error=f"worker process died: {e}")
        except Exception as e:  # a bug or resource problem in the job: report, keep going
            log.exception("offload_job_failed", pool=self.name, kind=kind)
            outcome = JobOutcome(status="error", error=f"{type(e).__name__}: {e}")
        finally:
            self._track(-1)
        seconds = time.perf_counter() - started
        self.metrics.job_seconds.labels(self.name, kind).observe(seconds)
        self.metrics.jobs.labels(self.name, kind, outcome.status).inc()
        return JobOutcome(outcome.value, outcome.status, outcome.error, seconds)

    def _track(self, delta: int) -> None:
        self.pending += delta
        self.metrics.offload_pending.labels(self.name).set(self.pending)
        (self._idle.set if self.pending == 0 else self._idle.clear)()
        (self._space.clear if self.saturated else self._space.set)()

    def shutdown(self) -> None:
        """Stop the workers; jobs still running are abandoned (their offsets stay uncommitted,
        so they run again after the restart). Worker processes are terminated, not awaited:
        a stuck job must not hold the daemon's exit."""
        processes = list(getattr(self.executor, "_processes", None) or {})
        workers = getattr(self.executor, "_processes", None) or {}
        self.executor.shutdown(wait=False, cancel_futures=True)
        for pid in processes:
            process = workers.get(pid)
            if process is not None and process.is_alive():
                process.terminate()
