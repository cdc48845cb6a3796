"""An event loop in a thread of its own, for a client whose round trips must go on while the
daemon's loop computes.

The daemon's loop gives the clients it runs a turn only between the steps of a batch: a
delivery whose exactly-once transaction takes several round trips in a row advanced about one
per batch step, and the loop then waited for the rest before it could send the next one
(bench/pipeline_bench.py's "wait us/dec"). In a loop of its own, the client answers each
response as it comes, taking the interpreter's lock from the daemon's loop for that moment.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """An event loop run by a daemon thread named ``name``; ``run`` awaits work in it from
    another loop. Objects of a client made in it (aiokafka's) are only used in it."""

    def __init__(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()

    async def run(self, work: Coroutine[Any, Any, T]) -> T:
        """``work``'s result (or exception), run in this thread's loop; cancelling the caller
        cancels ``work``."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self._loop))

    async def close(self) -> None:
        """Cancel what still runs in the loop, then stop it and end the thread."""
        await self.run(_cancel_the_others())
        self._loop.call_soon_threadsafe(self._loop.stop)
        await asyncio.to_thread(self._thread.join)
        self._loop.close()


CANCEL_ROUND_SECONDS = 1.0
"""How long ``close`` waits for cancelled tasks before it cancels those left again."""


async def _cancel_the_others() -> None:
    """Cancel every other task of the loop until all have ended. A task may wait, as it
    unwinds, for another one cancelled with it: aiokafka's abort of a transaction waits for
    its sender, which ends on cancellation without answering. Cancelled again, the waiting
    task stops waiting; cancelled once and awaited, it would hold ``close`` forever."""
    current = asyncio.current_task()
    while others := [t for t in asyncio.all_tasks() if t is not current]:
        for task in others:
            task.cancel()
        await asyncio.wait(others, timeout=CANCEL_ROUND_SECONDS)
