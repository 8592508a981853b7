"""Pre-emption: a cut of the batch allowance under what runs ends the newest batch requests
in flight, and gives each place back once."""

from __future__ import annotations

import asyncio

import pytest

from llm_watchdog.gateway.admission import Allowance, ClassGate


class Holder:
    def __init__(self) -> None:
        self.ended = False

    def preempt(self) -> None:
        self.ended = True


def test_a_waiter_granted_and_preempted_before_it_runs_gives_its_place_back_once() -> None:
    async def main() -> None:
        gate = ClassGate("batch", Allowance(1, 4), max_queue_wait_s=5.0, max_queued=10)
        first, second = Holder(), Holder()
        assert await gate.acquire(first) == "admitted"
        waiter = asyncio.ensure_future(gate.acquire(second))
        await asyncio.sleep(0)
        gate.release(first)  # grants the waiter's place; the waiter has not run since
        assert gate.inflight == 1
        assert gate.preempt(0) == 1
        assert (second.ended, first.ended, gate.inflight) == (True, False, 0)
        waiter.cancel()  # what a pre-empted request does with a task still waiting
        with pytest.raises(asyncio.CancelledError):
            await waiter
        gate.release(second)  # and what a late release does
        assert gate.inflight == 0
        assert gate.preempt(0) == 0

    asyncio.run(main())
