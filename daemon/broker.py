"""Whether the Kafka cluster answers: one story per outage, told once.

The watch asks the cluster for its broker list every ``interval`` seconds over a connection
of its own. When no answer comes it logs one warning (``broker_unreachable``), holds back
the Kafka client's own warnings and errors (they all say the same thing, dozens a second),
and, when the cluster answers again, logs one info line (``broker_reachable``) with the
outage's length and how many client lines it held back. ``vigil_broker_up`` and
``vigil_broker_unreachable_seconds_total`` follow it, and so does ``/readyz``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

import structlog

from vigil.daemon.logs import CLIENT_LOGS
from vigil.daemon.metrics import Metrics

log = structlog.get_logger("vigil.broker")

PROBE_INTERVAL_SECONDS = 1.0
PROBE_TIMEOUT_SECONDS = 3.0
"""A broker that takes longer than this to list the cluster's brokers counts as away (a
healthy one answers in milliseconds; the client's own request timeout is 40 s)."""


class Probe(Protocol):
    async def answers(self, timeout: float) -> bool: ...

    async def close(self) -> None: ...


class BrokerWatch:
    """The cluster's reachability as last probed (``up`` is None until the first probe;
    the client's lines are held back until the cluster first answers, since every one of
    them would only say it does not)."""

    def __init__(
        self,
        probe: Probe,
        metrics: Metrics,
        servers: str,
        interval: float = PROBE_INTERVAL_SECONDS,
        timeout: float = PROBE_TIMEOUT_SECONDS,
    ) -> None:
        self._probe = probe
        self._up, self._away = metrics.watch_broker()
        self._servers = servers
        self._interval, self._timeout = interval, timeout
        self.up: bool | None = None
        self.answered = False  # ever
        self._down_since: float | None = None
        self._counted_to = 0.0  # when the unreachable time was last added to the counter
        self.outages = 0
        self.last_back: float | None = None  # when the latest outage ended (monotonic)
        self._back = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._up.set(0)

    def start(self) -> None:
        CLIENT_LOGS.quiet = True
        self._task = asyncio.create_task(self._run(), name="broker-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        CLIENT_LOGS.quiet = False  # the clients are closed by now
        try:
            async with asyncio.timeout(self._timeout):
                await self._probe.close()
        except TimeoutError:
            pass

    def unreachable_for(self) -> float:
        """Seconds since the cluster stopped answering (0 while it answers)."""
        return 0.0 if self._down_since is None else time.monotonic() - self._down_since

    async def wait_until_up(self) -> None:
        await self._back.wait()

    async def _run(self) -> None:
        while True:
            try:
                answered = await self._probe.answers(self._timeout)
            except Exception as e:  # a probe that breaks must not freeze the state
                log.warning("broker_probe_failed", error=repr(e))
                answered = False
            self.observe(answered)
            await asyncio.sleep(self._interval)

    def observe(self, answered: bool) -> None:
        """Take one probe's result: log and count a change of state, add to the time."""
        now = time.monotonic()
        if self._down_since is not None:
            self._away.inc(now - self._counted_to)
            self._counted_to = now
        if answered == self.up:
            return
        first, self.up = self.up is None, answered
        self._up.set(int(answered))
        if not answered:
            self._down_since = self._counted_to = now
            self.outages += 1
            self._back.clear()
            CLIENT_LOGS.quiet = True
            log.warning("broker_unreachable", bootstrap_servers=self._servers)
            return
        CLIENT_LOGS.quiet = False
        self.answered = True
        self._back.set()
        if first:
            CLIENT_LOGS.take_suppressed()
            return
        outage = now - (self._down_since or now)
        self._down_since, self.last_back = None, now
        log.info(
            "broker_reachable",
            outage_seconds=round(outage, 1),
            client_lines_suppressed=CLIENT_LOGS.take_suppressed(),
        )
