"""The offload pool: heavy, pure jobs run in worker processes, never on the event loop.

Jobs are top-level functions over picklable arguments. ``submit`` returns at once with an
``asyncio`` future, so a batch's jobs run side by side and the consumer does not wait for
them; the pool bounds how many are in flight (callers check ``saturated`` to stop fetching)
and gives each a deadline. Workers are one-process executors made by a factory, so a
distributed ``concurrent.futures.Executor`` can take their place: a ``DaskCluster`` is such a
factory, of lanes whose jobs run as tasks on a Dask cluster (``[offload] engine = "dask"``),
and the CLIs fan their work out over a cluster with ``DaskCluster.fan_out``. Dask
(``distributed``) is an install extra, imported only when a cluster is used.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import functools
import multiprocessing
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import BrokenExecutor, Executor, ProcessPoolExecutor
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
        except BrokenExecutor as e:  # a dead worker process, or a Dask worker given up on
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
        so they run again after the restart). A lane factory with ``close`` (a Dask cluster's
        connection) is closed after its lanes."""
        for lane in self._lanes:
            _stop(lane)
        close = getattr(self.new_executor, "close", None)
        if close is not None:
            close()


def _stop(executor: Executor) -> None:
    """Shut ``executor`` down without waiting; its worker processes are terminated, not
    awaited, so a stuck job holds neither the daemon's exit nor a lane."""
    workers = dict(getattr(executor, "_processes", None) or {})
    executor.shutdown(wait=False, cancel_futures=True)
    for process in workers.values():
        if process.is_alive():
            process.terminate()


# --- Dask: lanes and fan-out on a cluster --------------------------------------------------

_SCHEDULER = re.compile(r"tcp://(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>[0-9]{1,5})")
CONNECT_SECONDS = 20.0
"""How long connecting to a Dask scheduler may take before the job or command fails."""
RESTART_SECONDS = 60.0
"""How long a Dask worker restart (after a timed-out or abandoned job) may take."""
INSTALL_DASK = "install the extra: pip install 'vigil-daemon[dask]'"


def scheduler_address(text: str) -> str:
    """A Dask scheduler address, ``tcp://HOST:PORT``; ValueError says what is wrong."""
    match = _SCHEDULER.fullmatch(text.strip())
    if match is None or not 0 < int(match["port"]) < 65536:
        raise ValueError(f"expected a Dask scheduler address tcp://HOST:PORT, got {text!r}")
    return text.strip()


class WorkerLost(BrokenExecutor):
    """The Dask worker running a job died (each time the scheduler retried it)."""


class ClusterError(RuntimeError):
    """A fan-out could not finish: the scheduler is unreachable, or a task's workers died."""


def _on_worker(fn: Callable[..., Any], *args: Any) -> tuple[Any, str]:
    """A fan-out task: ``fn(*args)`` and the address of the Dask worker that ran it (raises
    outside a worker, so a result always proves where it was computed)."""
    from distributed import get_worker

    return fn(*args), get_worker().address


class DaskCluster:
    """A client of one Dask scheduler, connected on first use.

    Called, it makes a lane for ``OffloadPool`` (``DaskLane``). ``fan_out`` runs a list of
    chunks as tasks and returns their results in chunk order. Blocking client calls (connect,
    cancel, restart) run on one helper thread, never on the daemon's event loop.
    """

    def __init__(self, address: str, connect_seconds: float | None = None) -> None:
        self.address = scheduler_address(address)
        self.connect_seconds = CONNECT_SECONDS if connect_seconds is None else connect_seconds
        self.workers: Counter[str] = Counter()
        """Fan-out tasks run per worker address."""
        self._client: Any = None
        self._lock = threading.Lock()
        self._calls = cf.ThreadPoolExecutor(1, thread_name_prefix="vigil-dask")
        self._closed = False

    def __call__(self) -> DaskLane:
        return DaskLane(self)

    def __enter__(self) -> DaskCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def client(self) -> Any:
        """The ``distributed.Client``, connecting (again, if the last one closed) when needed;
        ClusterError when the scheduler cannot be reached."""
        with self._lock:
            if self._closed:
                raise ClusterError("the Dask connection is closed")
            if self._client is None or self._client.status in ("closing", "closed"):
                try:
                    from distributed import Client
                except ImportError:
                    raise ClusterError(f"Dask is not installed; {INSTALL_DASK}") from None
                try:
                    self._client = Client(
                        self.address, timeout=self.connect_seconds, set_as_default=False
                    )
                except (OSError, TimeoutError) as e:
                    raise ClusterError(
                        f"cannot reach the Dask scheduler at {self.address}: {e}"
                    ) from None
            return self._client

    def call(self, fn: Callable[..., Any], *args: Any) -> cf.Future:
        """Run a blocking client call on the helper thread."""
        return self._calls.submit(fn, *args)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` as one task (never merged with an equal one); a Dask future."""
        return self.client().submit(fn, *args, pure=False)

    def scatter(self, value: Any) -> Any:
        """Put ``value`` on the cluster once, for tasks that share it; a Dask future."""
        (future,) = self.client().scatter([value], hash=False)  # a list: one item each
        return future

    def result(self, future: Any) -> Any:
        """A task's value; its own exception as raised, ClusterError if its workers died or
        the cluster dropped it."""
        from distributed import KilledWorker
        from distributed.client import FutureCancelledError

        try:
            return future.result()
        except KilledWorker as e:
            raise ClusterError(f"a task's {_killed(e)}") from None
        except FutureCancelledError as e:
            raise ClusterError(f"the cluster dropped a task: {e}") from None

    def fan_out(
        self,
        fn: Callable[..., Any],
        chunks: Sequence[tuple],
        *shared: Any,
        progress: Callable[[int, Any], None] | None = None,
    ) -> list[Any]:
        """``fn(*shared, *chunk)`` for every chunk, each one task on the cluster's workers;
        the values in chunk order. ``progress(i, value)`` is told of each finished chunk.
        The first failure cancels the rest and is raised (as ``result`` raises it)."""
        from distributed import as_completed

        client = self.client()
        futures = [client.submit(_on_worker, fn, *shared, *chunk, pure=False) for chunk in chunks]
        position = {f.key: i for i, f in enumerate(futures)}
        values: list[Any] = [None] * len(futures)
        try:
            for future in as_completed(futures, loop=client.loop):
                value, worker = self.result(future)
                i = position[future.key]
                values[i] = value
                self.workers[worker] += 1
                if progress is not None:
                    progress(i, value)
        except BaseException:
            with contextlib.suppress(Exception):  # the cluster may be what failed
                client.cancel(futures)
            raise
        return values

    def close(self) -> None:
        """Close the connection once pending helper calls (cancels, restarts) are done; safe
        to call more than once."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._calls.submit(self._close_client)
        self._calls.shutdown(wait=False)

    def _close_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close(timeout=self.connect_seconds)


class DaskLane(Executor):
    """One ``OffloadPool`` lane on a Dask cluster: each job is one task there.

    Outcomes match a process lane's: a job's own exception is raised as it was (so a
    ``ValueError`` stays an ``invalid`` request); a job given up on after its workers died
    (the scheduler retries a task whose worker dies, ``distributed.scheduler.allowed-failures``
    times) raises ``WorkerLost``; a task the cluster dropped (a lost scheduler) raises
    RuntimeError. Stopping the lane (a timeout, the daemon's shutdown) cancels its task and
    restarts the worker running it (through its nanny), since Dask cannot interrupt a task.
    """

    def __init__(self, cluster: DaskCluster) -> None:
        self.cluster = cluster
        self._tasks: dict[Any, cf.Future] = {}
        self._lock = threading.Lock()
        self._stopped = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future:
        if kwargs:
            fn = functools.partial(fn, **kwargs)
        done: cf.Future = cf.Future()
        done.set_running_or_notify_cancel()
        self.cluster.call(self._start, done, fn, args)
        return done

    def _start(self, done: cf.Future, fn: Callable[..., Any], args: tuple) -> None:
        try:
            with self._lock:
                if self._stopped:
                    raise RuntimeError("the lane was stopped before its job started")
                task = self.cluster.submit(fn, *args)
                self._tasks[task] = done
            task.add_done_callback(self._finished)
        except BaseException as e:
            _settle(done, exception=e)

    def _finished(self, task: Any) -> None:
        with self._lock:
            done = self._tasks.pop(task, None)
        if done is None or done.done():
            return
        status = task.status
        try:
            if status == "finished":
                _settle(done, value=task.result())
            elif status == "error":
                _settle(done, exception=_task_error(task.exception()))
            else:
                dropped = RuntimeError(
                    f"the Dask cluster dropped the job ({status}; e.g. the scheduler was lost)"
                )
                _settle(done, exception=dropped)
        except BaseException as e:  # fetching the result failed (e.g. the worker went away)
            _settle(done, exception=_task_error(e))

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._stopped = True
            tasks = list(self._tasks) if cancel_futures else []
        if tasks:
            abandoning = self.cluster.call(_abandon, self.cluster, tasks)
            if wait:
                abandoning.result()


def _settle(done: cf.Future, value: Any = None, exception: BaseException | None = None) -> None:
    if done.done():
        return
    if exception is None:
        done.set_result(value)
    elif isinstance(exception, cf.CancelledError):  # asyncio would read it as a cancellation
        done.set_exception(RuntimeError(f"the Dask cluster dropped the job: {exception}"))
    else:
        done.set_exception(exception)


def _task_error(error: BaseException | None) -> BaseException:
    from distributed import KilledWorker

    if isinstance(error, KilledWorker):
        return WorkerLost(_killed(error))
    return error if error is not None else RuntimeError("the job failed without an exception")


def _killed(error: Any) -> str:
    """What a ``KilledWorker`` means, in one line."""
    last = getattr(error.last_worker, "address", error.last_worker)
    return (
        f"Dask workers died running it, {error.allowed_failures + 1} times (the last one "
        f"{last}); see that worker's log"
    )


def _abandon(cluster: DaskCluster, tasks: list[Any]) -> None:
    """Cancel ``tasks`` and restart the workers running them: a running task cannot be
    interrupted, and would hold its worker's thread until it ends on its own."""
    try:
        client = cluster.client()
        keys = {task.key for task in tasks}
        busy = [w for w, running in client.processing().items() if keys & set(running)]
        client.cancel(tasks, force=True)
        if busy:
            log.warning("offload_dask_worker_restart", workers=busy)
            client.restart_workers(busy, timeout=RESTART_SECONDS, raise_for_error=False)
    except Exception:
        log.exception("offload_dask_abandon_failed", scheduler=cluster.address)
