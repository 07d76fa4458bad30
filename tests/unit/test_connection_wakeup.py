"""The request loop's wake-up (``server._Wakeup``): an event for its one waiter that can
also end on a future (a pipelined Produce's completion), without a task per wait."""

from __future__ import annotations

import asyncio

import pytest

from headrace.broker.server import _Wakeup


def test_a_set_before_the_wait_returns_at_once_and_clear_undoes_it() -> None:
    async def run() -> None:
        w = _Wakeup()
        w.set()
        await asyncio.wait_for(w.wait(), 1)
        w.clear()
        assert not w.is_set()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(w.wait(), 0.05)

    asyncio.run(run())


def test_the_wait_ends_on_set_or_on_the_other_future_and_leaves_no_callback() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        w = _Wakeup()
        head: asyncio.Future[int] = loop.create_future()
        waiting = asyncio.ensure_future(w.wait(also=head))
        await asyncio.sleep(0)
        assert not waiting.done()
        w.set()  # a frame arrived
        await asyncio.wait_for(waiting, 1)
        assert not head._callbacks  # the wait took its callback off the head
        w.clear()
        waiting = asyncio.ensure_future(w.wait(also=head))
        await asyncio.sleep(0)
        assert not waiting.done()
        head.set_result(1)  # the Produce at the pipeline's head completed
        await asyncio.wait_for(waiting, 1)
        assert not w.is_set()
        await asyncio.wait_for(w.wait(also=head), 1)  # a done future: at once

    asyncio.run(run())


def test_a_cancelled_wait_leaves_nothing_behind() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        w = _Wakeup()
        head: asyncio.Future[int] = loop.create_future()
        waiting = asyncio.ensure_future(w.wait(also=head))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert w._waiter is None
        w.set()  # no waiter: only the flag
        assert w.is_set()
        head.set_result(1)

    asyncio.run(run())
