"""The offload pool: heavy, pure jobs run in worker processes, never on the event loop.

Jobs are top-level functions over picklable arguments. ``submit`` returns at once with an
``asyncio`` future, so a batch's jobs run side by side and the consumer does not wait for
them; the pool bounds how many are in flight (callers check ``saturated`` to stop fetching)
and gives each a deadline. Workers are one-process executors made by a factory, so a
distributed ``concurrent.futures.Executor`` can take their place.
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

from vigil.daemon.metrics import Metrics

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
    """A bounded set of in-flight jobs over worker lanes, with deadlines and metrics.

    Each lane is a one-worker executor made by ``new_executor``. A job waits for a free lane
    and its deadline runs from the moment it starts there. A lane whose job timed out or whose
    worker died is stopped and replaced by a fresh one, so one stuck or crashed job costs one
    worker for one deadline, not the pool for good.
    """

    def __init__(
        self,
        new_executor: Callable[[], Executor],
        workers: int,
        metrics: Metrics,
        max_pending: int,
        timeout_seconds: float,
        name: str = "default",
    ) -> None:
        if workers < 1 or max_pending < 1 or timeout_seconds <= 0:
            raise ValueError("workers and max_pending must be >= 1 and timeout_seconds > 0")
        self.new_executor = new_executor
        self.metrics = metrics
        self.max_pending = max_pending
        self.timeout_seconds = timeout_seconds
        self.name = name
        self.pending = 0
        self._lanes = [new_executor() for _ in range(workers)]
        self._free: asyncio.Queue[Executor] = asyncio.Queue()
        for lane in self._lanes:
            self._free.put_nowait(lane)
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
        """Start ``fn(*args)`` on a free lane; the future resolves to a ``JobOutcome``."""
        self._track(+1)
        return asyncio.ensure_future(self._run(kind, fn, args))

    async def _run(self, kind: str, fn: Callable[..., Any], args: tuple) -> JobOutcome:
        loop = asyncio.get_running_loop()
        submitted = time.perf_counter()
        lane = None
        try:
            lane = await self._free.get()
            value = await asyncio.wait_for(
                loop.run_in_executor(lane, fn, *args), self.timeout_seconds
            )
            outcome = JobOutcome(value)
        except TimeoutError:
            lane = self._replace(lane, "timeout", kind)
            outcome = JobOutcome(
                status="timeout", error=f"no result within {self.timeout_seconds:g} s"
            )
        except ValueError as e:  # the job's own validation: the request is at fault
            outcome = JobOutcome(status="invalid", error=str(e))
        except BrokenProcessPool as e:
            lane = self._replace(lane, "worker_died", kind)
            outcome = JobOutcome(status="error", error=f"worker process died: {e}")
        except Exception as e:  # a bug or resource problem in the job: report, keep going
            log.exception("offload_job_failed", pool=self.name, kind=kind)
            outcome = JobOutcome(status="error", error=f"{type(e).__name__}: {e}")
        finally:
            if lane is not None:
                self._free.put_nowait(lane)
            self._track(-1)
        seconds = time.perf_counter() - submitted
        self.metrics.job_seconds.labels(self.name, kind).observe(seconds)
        self.metrics.jobs.labels(self.name, kind, outcome.status).inc()
        return JobOutcome(outcome.value, outcome.status, outcome.error, seconds)

    def _replace(self, lane: Executor, reason: str, kind: str) -> Executor:
        """Stop ``lane`` (its job is abandoned) and put a fresh executor in its place."""
        log.warning("offload_worker_replaced", pool=self.name, kind=kind, reason=reason)
        self.metrics.worker_restarts.labels(self.name, reason).inc()
        _stop(lane)
        fresh = self.new_executor()
        self._lanes[self._lanes.index(lane)] = fresh
        return fresh

    def _track(self, delta: int) -> None:
        self.pending += delta
        self.metrics.offload_pending.labels(self.name).set(self.pending)
        (self._idle.set if self.pending == 0 else self._idle.clear)()
        (self._space.clear if self.saturated else self._space.set)()

    def shutdown(self) -> None:
        """Stop every lane; jobs still running are abandoned (their offsets stay uncommitted,
        so they run again after the restart)."""
        for lane in self._lanes:
            _stop(lane)


def _stop(executor: Executor) -> None:
    """Shut ``executor`` down without waiting; its worker processes are terminated, not
    awaited, so a stuck job holds neither the daemon's exit nor a lane."""
    workers = dict(getattr(executor, "_processes", None) or {})
    executor.shutdown(wait=False, cancel_futures=True)
    for process in workers.values():
        if process.is_alive():
            process.terminate()
