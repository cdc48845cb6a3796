"""The loop thread the Kafka sink's producer runs in (connectors/loop_thread.py)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from vigil.connectors.loop_thread import LoopThread


async def test_work_runs_in_the_threads_loop_and_gives_its_result_or_error():
    io = LoopThread("test-io")
    caller = threading.get_ident()

    async def where() -> tuple[int, asyncio.AbstractEventLoop]:
        return threading.get_ident(), asyncio.get_running_loop()

    async def fails() -> None:
        raise KeyError("refused")

    try:
        thread, loop = await io.run(where())
        assert thread != caller
        assert loop is not asyncio.get_running_loop()
        with pytest.raises(KeyError, match="refused"):
            await io.run(fails())
    finally:
        await io.close()


async def test_cancelling_the_caller_cancels_the_work_and_close_ends_the_thread():
    io = LoopThread("test-io-closed")
    started, cancelled = threading.Event(), threading.Event()

    async def forever() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    caller = asyncio.ensure_future(io.run(forever()))
    assert await asyncio.to_thread(started.wait, 10)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert await asyncio.to_thread(cancelled.wait, 10)

    left = threading.Event()

    async def lingering() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            left.set()

    running = asyncio.ensure_future(io.run(lingering()))
    await asyncio.sleep(0.05)
    await io.close()
    assert left.is_set()  # cancelled by close, not left pending in a stopped loop
    assert "test-io-closed" not in {t.name for t in threading.enumerate()}
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)


async def test_close_ends_a_task_that_waits_as_it_unwinds_for_another_cancelled_with_it(
    monkeypatch,
):
    """The pattern of aiokafka's transaction abort: a delivery cancelled at shutdown waits,
    shielded, for an answer only the producer's sender task gives, and the sender, cancelled
    in the same pass, ends without giving it."""
    monkeypatch.setattr("vigil.connectors.loop_thread.CANCEL_ROUND_SECONDS", 0.1)
    io = LoopThread("test-io-abort")
    unwinding = threading.Event()
    tasks: list[asyncio.Future] = []

    async def start() -> None:
        answer = asyncio.get_running_loop().create_future()

        async def sender() -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                return  # ends without answering, as aiokafka's sender does

        async def delivery() -> None:
            try:
                await asyncio.Event().wait()
            finally:  # the abort
                unwinding.set()
                await asyncio.shield(answer)

        tasks.extend((asyncio.ensure_future(sender()), asyncio.ensure_future(delivery())))
        await asyncio.sleep(0)

    await io.run(start())
    await asyncio.wait_for(io.close(), timeout=10)
    assert unwinding.is_set()
    assert "test-io-abort" not in {t.name for t in threading.enumerate()}
