"""The gateway's admission gate under any interleaving of what happens to it.

Requests arrive, finish, give up while they wait; the control API raises and cuts the
allowance (with or without pre-emption of the newest), a lease runs out, the ramp climbs as
time passes, chat takes and frees engine slots under the slot line. After every step the
gate's count is what the requests hold, nobody waits while there is room for them, waiters
get in oldest first, and nobody got in past the limit or the slot line. Marked slow: the
CI tier runs 10,000 sequences.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from llm_watchdog.gateway.admission import Allowance, ClassGate

pytestmark = pytest.mark.slow

CEILING = 12
WAIT_S = 1e6  # no wait runs out on its own here: the machine's steps take microseconds


@dataclass(eq=False)
class Request:
    """A batch request as the model sees it. As a holder the gate can pre-empt it."""

    n: int
    named: bool
    state: str = "waiting"  # waiting, admitted, done, preempted, gone, timeout, full
    waited: bool = False
    task: asyncio.Task[str] | None = field(default=None, repr=False)

    def preempt(self) -> None:
        assert self.state == "admitted", self
        self.state = "preempted"


class GateMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.now = 100.0
        self.requests: list[Request] = []
        self.admitted_waiters: list[int] = []  # arrival numbers, in the order they got in
        self.chat = 0
        self.line: int | None = None

    @initialize(
        default=st.integers(0, CEILING),
        ramp_per_s=st.sampled_from([0.0, 0.5, 4.0]),
        ramp_idle_s=st.sampled_from([0.0, 5.0]),
        line=st.none() | st.integers(1, 10),
    )
    def start(self, default: int, ramp_per_s: float, ramp_idle_s: float, line: int | None) -> None:
        self.allowance = Allowance(default, CEILING, ramp_per_s, ramp_idle_s)
        self.line = line
        room = None if line is None else (lambda: self.gate.inflight + self.chat < line)
        self.gate = ClassGate(
            "batch", self.allowance, WAIT_S, max_queued=6, clock=lambda: self.now, room=room
        )

    def teardown(self) -> None:
        gate = getattr(self, "gate", None)
        if gate is not None:
            gate.close()
        for r in self.requests:
            if r.task is not None and not r.task.done():
                r.task.cancel()
        self._settle()
        self.loop.close()

    # -- what happens --------------------------------------------------------------------

    def _settle(self) -> None:
        """Run the loop until the tasks the last step woke have run."""
        for _ in range(4):
            self.loop.run_until_complete(asyncio.sleep(0))

    def _on_loop(self, call: Callable[[], object]) -> None:
        """Call into the gate from a task on its loop, as the gateway's handlers do."""

        async def go() -> None:
            call()

        self.loop.run_until_complete(go())
        self._settle()

    def _in(self, state: str) -> list[Request]:
        return [r for r in self.requests if r.state == state]

    def _wake(self) -> None:
        before = {r.n for r in self._in("admitted")}
        self._on_loop(self.gate.wake)
        self._check_admissions(before)

    def _check_admissions(self, before: set[int]) -> None:
        """Whoever got in during this step got in under the limit and the slot line."""
        if {r.n for r in self._in("admitted")} - before:
            limit = self.gate.limit()
            assert limit is not None and self.gate.inflight <= limit
            if self.line is not None:
                assert self.gate.inflight + self.chat <= self.line

    @rule(named=st.booleans())
    def arrive(self, named: bool) -> None:
        r = Request(len(self.requests), named)
        self.requests.append(r)
        before = {x.n for x in self._in("admitted")}

        async def ask() -> str:
            outcome = await self.gate.acquire(r if named else None)
            if r.state == "waiting":
                r.state = "admitted" if outcome == "admitted" else outcome
                if outcome == "admitted" and r.waited:
                    self.admitted_waiters.append(r.n)
            return outcome

        r.task = self.loop.create_task(ask())
        self._settle()
        if r.state == "waiting":
            r.waited = True
        self._check_admissions(before)

    @precondition(lambda self: any(r.state == "admitted" for r in self.requests))
    @rule(pick=st.integers(0, 1000))
    def finish(self, pick: int) -> None:
        running = self._in("admitted")
        r = running[pick % len(running)]
        r.state = "done"
        before = {x.n for x in self._in("admitted")}
        self._on_loop(lambda: self.gate.release(r if r.named else None))
        self._check_admissions(before)

    @precondition(
        lambda self: any(r.state in ("done", "preempted") and r.named for r in self.requests)
    )
    @rule(pick=st.integers(0, 1000))
    def release_again(self, pick: int) -> None:
        # A pre-empted request's handler still releases, and a release may come twice.
        ended = [r for r in self.requests if r.state in ("done", "preempted") and r.named]
        inflight = self.gate.inflight
        self._on_loop(lambda: self.gate.release(ended[pick % len(ended)]))
        assert self.gate.inflight == inflight

    @precondition(lambda self: any(r.state == "waiting" for r in self.requests))
    @rule(pick=st.integers(0, 1000))
    def give_up(self, pick: int) -> None:
        waiting = self._in("waiting")
        r = waiting[pick % len(waiting)]
        assert r.task is not None
        r.task.cancel()
        self._settle()
        if r.state == "waiting":
            r.state = "gone"

    @rule(
        value=st.integers(0, CEILING),
        lease_s=st.none() | st.sampled_from([1.0, 30.0]),
        preempt=st.booleans(),
    )
    def set_allowance(self, value: int, lease_s: float | None, preempt: bool) -> None:
        self.allowance.set(value, lease_s, "", self.now, self.now, self.gate.inflight)
        if preempt:
            self._on_loop(lambda: self.gate.preempt(value))
        self._wake()

    @rule(dt=st.sampled_from([0.1, 0.5, 2.0, 40.0]))
    def time_passes(self, dt: float) -> None:
        self.now += dt
        self.allowance.expire(self.now, self.now, self.gate.inflight)
        self._wake()  # the ramp's timer, or a lease's end, wakes the gate

    @rule(delta=st.sampled_from([-2, -1, 1, 2]))
    def chat_moves(self, delta: int) -> None:
        self.chat = max(0, self.chat + delta)
        self._wake()  # a chat release wakes batch (on_release)

    # -- what always holds ---------------------------------------------------------------

    @invariant()
    def the_count_is_what_the_requests_hold(self) -> None:
        if not hasattr(self, "gate"):
            return
        assert self.gate.inflight == len(self._in("admitted"))
        assert self.gate.queued == len(self._in("waiting"))

    @invariant()
    def nobody_waits_while_there_is_room(self) -> None:
        if not hasattr(self, "gate") or not self.gate.queued:
            return
        limit = self.gate.limit()
        assert limit is not None
        full = self.gate.inflight >= limit
        held = self.line is not None and self.gate.inflight + self.chat >= self.line
        assert full or held, (self.gate.inflight, limit, self.chat, self.line)

    @invariant()
    def waiters_get_in_oldest_first(self) -> None:
        assert self.admitted_waiters == sorted(self.admitted_waiters)


test_the_gate_under_any_interleaving = GateMachine.TestCase
