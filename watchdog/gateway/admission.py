"""Who may go upstream now: the allowance with its lease, and a FIFO queue per class.

`Allowance` is pure: it takes `now` and returns what changed, so a lease can be tested
without a clock. `ClassGate` is the asyncio shell around it: it counts requests in flight,
parks the ones over the allowance in FIFO order, and wakes them as places free up.

A class without an allowance (chat) is never queued: its gate only counts. Lowering the
allowance under the in-flight count stops nothing that runs; new requests wait until
enough have finished. Unless the gateway pre-empts (`--preempt-batch`): then
`ClassGate.preempt` ends the newest requests in flight, each through its own `preempt()`,
until the allowance holds.

A gate may also hold to a condition of its own (`room`): the gateway's slot line, which
lets batch in only while batch and chat in flight together stay under the engine's slots
less a few kept for chat. A gate whose condition depends on another class is woken by it
(`on_release`).

A raise is ramped (`ramp_per_s`, like HAProxy's `slowstart`): one more is let in at once,
and the limit climbs from there to the new allowance at that many requests a second. Every
batch request starts with a long prefill, and many let in at once prefill together and
stall chat for seconds; the ramp spreads them out, so a controller can give back in one
write what it took in one. The same holds for a batch job that starts, or comes back, into
an allowance it left unused: once the limit has stood over what runs, with nobody waiting,
for `Ramp.idle_s`, it falls back to what runs and climbs from there as after a raise (TCP's
restart after idle, RFC 5681 §4.1). A job that keeps its allowance full never sees it.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

Outcome = Literal["admitted", "timeout", "full"]


class Holder(Protocol):
    """A request holding a place, that the gate can end when the allowance is cut."""

    def preempt(self) -> None:
        """End the request now; its place is already given back, so it gives back none."""


@dataclass
class Change:
    """One change of an allowance, for the log and for GET /control."""

    ts: float  # wall clock, unix seconds
    kind: str  # "set" or "lease_expired"
    before: int
    after: int
    lease_s: float | None
    reason: str

    def to_dict(self, cls: str) -> dict[str, object]:
        return {
            "ts": self.ts,
            "class": cls,
            "kind": self.kind,
            "allowance_before": self.before,
            "allowance_after": self.after,
            "lease_s": self.lease_s,
            "reason": self.reason,
        }


@dataclass
class Ramp:
    """How a raise is let in: one more at once, then `per_s` more a second up to the target.

    Pure, `now` passed in: the gateway's `Allowance` and the heat lab's `World` both use it,
    so the lab admits batch as the gateway does.
    """

    per_s: float = 0.0  # 0: a raise takes effect at once
    start: float = 0.0  # the limit at t0, where the climb began
    t0: float = 0.0
    # A limit unused this long, with nobody waiting, falls back to what runs (0: never).
    idle_s: float = 0.0
    unused_since: float | None = None

    def limit(self, target: int, now: float) -> int:
        """How many may be in flight at `now` on the way to `target`."""
        if self.per_s <= 0:
            return target
        return min(target, int(self.start + self.per_s * (now - self.t0) + 1e-9))

    def next_rise(self, target: int, now: float) -> float | None:
        """When the limit next goes up by one; None when it is at `target` (or no ramp)."""
        limit = self.limit(target, now)
        if limit >= target:
            return None
        return self.reaches(limit + 1)

    def reaches(self, n: int) -> float:
        """When the limit reaches `n` on this climb (a time past if it already has); only
        while ramping (`per_s` > 0)."""
        return self.t0 + (n - self.start) / self.per_s

    def observe(self, target: int, now: float, inflight: int, waiting: bool) -> None:
        """What runs at `now`, and whether any wait: a limit over what runs, with nobody
        waiting, for `idle_s`, falls back to one over what runs and climbs from there."""
        if self.per_s <= 0 or self.idle_s <= 0:
            return
        limit = self.limit(target, now)
        if waiting or inflight >= limit:
            self.unused_since = None
        elif self.unused_since is None:
            self.unused_since = now
        elif now - self.unused_since >= self.idle_s and inflight + 1 < limit:
            self.start = float(inflight + 1)
            self.t0 = now

    def retarget(self, before: int, target: int, now: float, inflight: int) -> None:
        """A new target at `now`, `before` being the limit until then. A raise lets one more
        in at once and climbs from there (or from what runs); a cut is at once."""
        self.start = float(max(before, inflight) + 1) if target > before else float(target)
        self.t0 = now


class Allowance:
    """A concurrency allowance in [0, ceiling] that falls back to its default when a lease ends.

    `now` is monotonic seconds (for the lease), `wall` is unix seconds (for what is shown).
    """

    def __init__(
        self, default: int, ceiling: int, ramp_per_s: float = 0.0, ramp_idle_s: float = 0.0
    ) -> None:
        self.default = default
        self.ceiling = ceiling
        self.value = default
        self.lease_ends: float | None = None  # monotonic
        self.lease_expires_at: float | None = None  # unix seconds, for readers
        self.reason: str | None = None
        self.set_at: float | None = None
        self.ramp = Ramp(ramp_per_s, float(default), idle_s=ramp_idle_s)

    @property
    def ramp_per_s(self) -> float:
        return self.ramp.per_s

    @property
    def ramp_idle_s(self) -> float:
        return self.ramp.idle_s

    def limit(self, now: float) -> int:
        """How many may be in flight at `now`: the allowance, or its ramp toward it."""
        return self.ramp.limit(self.value, now)

    def observe(self, now: float, inflight: int, waiting: bool) -> None:
        """What runs and whether any wait (`Ramp.observe`): an allowance left unused
        ramps again."""
        self.ramp.observe(self.value, now, inflight, waiting)

    def next_rise(self, now: float) -> float | None:
        """When the ramp next lets one more in (monotonic seconds); None when not ramping."""
        return self.ramp.next_rise(self.value, now)

    def paced_until(self, place: int, now: float) -> float | None:
        """When the ramp lets in the one that would be in flight as number `place` (1 = the
        first), if the ramp alone holds it back at `now`: the allowance has room for it and
        the limit has not reached it yet. None when it is the allowance itself that is full,
        or nothing holds it."""
        limit = self.limit(now)
        if limit >= place or place > self.value:
            return None
        return self.ramp.reaches(place)

    def _retarget(self, value: int, now: float, inflight: int) -> None:
        self.ramp.retarget(self.limit(now), value, now, inflight)

    def set(
        self,
        value: int,
        lease_s: float | None,
        reason: str,
        now: float,
        wall: float,
        inflight: int = 0,
    ) -> Change:
        if not 0 <= value <= self.ceiling:
            raise ValueError(f"allowance must be an integer in [0, {self.ceiling}], got {value}")
        before = self.value
        self._retarget(value, now, inflight)
        self.value = value
        self.lease_ends = None if lease_s is None else now + lease_s
        self.lease_expires_at = None if lease_s is None else wall + lease_s
        self.reason = reason
        self.set_at = wall
        return Change(wall, "set", before, value, lease_s, reason)

    def expire(self, now: float, wall: float, inflight: int = 0) -> Change | None:
        """Back to the default if the lease has run out at `now`; the change, else None."""
        if self.lease_ends is None or now < self.lease_ends:
            return None
        before = self.value
        reason = self.reason or ""
        self._retarget(self.default, now, inflight)
        self.value = self.default
        self.lease_ends = None
        self.lease_expires_at = None
        self.reason = None
        self.set_at = wall
        return Change(wall, "lease_expired", before, self.default, None, reason)

    def seconds_left(self, now: float) -> float | None:
        return None if self.lease_ends is None else max(0.0, self.lease_ends - now)


class ClassGate:
    """In-flight count and FIFO wait queue of one class. Use from one event loop only."""

    def __init__(
        self,
        name: str,
        allowance: Allowance | None,
        max_queue_wait_s: float | None,
        max_queued: int,
        clock: Callable[[], float] = time.monotonic,
        room: Callable[[], bool] | None = None,
    ) -> None:
        self.name = name
        # A second condition for admission besides the allowance (None: none); whoever
        # changes what it reads calls `wake()`.
        self.room = room
        # Called after every place given back: another gate's room may read this one's count.
        self.on_release: Callable[[], None] | None = None
        self.allowance = allowance  # None: never limited, never queued
        self.max_queue_wait_s = max_queue_wait_s
        self.max_queued = max_queued
        self.clock = clock  # the allowance's `now`
        self.inflight = 0
        self._queue: deque[asyncio.Future[bool]] = deque()
        # Requests in flight that named themselves, oldest admitted first (a dict keeps
        # insertion order): the newest are at the end, where `preempt` takes them from.
        self._holders: dict[Holder, None] = {}
        # Who waits behind each future that named itself, so a grant registers it at once.
        self._waiting: dict[asyncio.Future[bool], Holder] = {}
        # Each waiter's deadline: --max-queue-wait, moved on while the ramp alone holds it.
        self._deadlines: dict[asyncio.Future[bool], asyncio.TimerHandle] = {}
        self._ramp_timer: asyncio.TimerHandle | None = None
        # The allowance stands unused from the start: a job that comes once the gateway has
        # run `--batch-ramp-idle` is ramped as one that comes back.
        self._observe()

    @property
    def queued(self) -> int:
        return len(self._queue)

    def limit(self) -> int | None:
        """How many may be in flight now (None: no limit)."""
        return None if self.allowance is None else self.allowance.limit(self.clock())

    def _observe(self) -> None:
        """Tell the allowance what runs and whether any wait, before admitting anyone."""
        if self.allowance is not None:
            self.allowance.observe(self.clock(), self.inflight, bool(self._queue))

    def _has_room(self) -> bool:
        limit = self.limit()
        if limit is not None and self.inflight >= limit:
            return False
        return self.room is None or self.room()

    def _admit(self, holder: Holder | None) -> None:
        self.inflight += 1
        if holder is not None:
            self._holders[holder] = None

    def try_acquire(self, holder: Holder | None = None) -> bool:
        """Take a place if one is free and nobody waits for it: the part of `acquire()`
        that never waits, for a caller that runs without a task of its own."""
        self._observe()
        if self._has_room() and not self._queue:
            self._admit(holder)
            return True
        return False

    async def acquire(self, holder: Holder | None = None) -> Outcome:
        """Take a place: at once if there is room and nobody waits, else wait in line.

        Returns "admitted" (the caller must `release()` later), "timeout" when the wait
        ran past max_queue_wait_s, or "full" when the queue already holds max_queued.
        Cancelling the caller (its client went away) gives its place in line back.
        With `holder`, the place is counted as the holder's from the moment it is granted
        (before the caller runs again), and `preempt` may end it; `release(holder)` then
        gives back nothing.
        """
        if self.try_acquire(holder):
            return "admitted"
        wait_s = self.max_queue_wait_s or 0.0
        if wait_s <= 0:
            return "timeout"
        if len(self._queue) >= self.max_queued:
            return "full"
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        self._queue.append(fut)
        if holder is not None:
            self._waiting[fut] = holder
        self._arm_ramp()
        self._deadlines[fut] = loop.call_later(wait_s, self._give_up, fut, wait_s)
        try:
            granted = await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.result():
                self.release(holder)  # granted just as the client left: pass the place on
            else:
                self._discard(fut)
            raise
        finally:
            timer = self._deadlines.pop(fut, None)
            if timer is not None:
                timer.cancel()
        return "admitted" if granted else "timeout"

    def release(self, holder: Holder | None = None) -> None:
        """Give a place back. A holder's place is given back once: after `preempt` took
        it, or a release before, this gives back nothing."""
        if holder is not None:
            if holder not in self._holders:
                return
            del self._holders[holder]
        self.inflight -= 1
        self.wake()
        if self.on_release is not None:
            self.on_release()

    def wake(self) -> None:
        """Admit waiters, oldest first, while there is room (after a release or a raise)."""
        self._observe()
        while self._queue and self._has_room():
            fut = self._queue.popleft()
            holder = self._waiting.pop(fut, None)
            if fut.done():
                continue
            self._admit(holder)
            fut.set_result(True)
        self._arm_ramp()

    def preempt(self, keep: int) -> int:
        """End the newest holders in flight, most recently admitted first, until at most
        `keep` are in flight (or no holder is left); returns how many were ended.

        Each place is given back before its holder's `preempt()` runs, so whatever that
        does next (its own `release`, a client connection's next request) sees the count
        as it now is. Nobody waiting is admitted: a pass only runs after a cut, which
        leaves no room.
        """
        ended = 0
        while self.inflight > keep and self._holders:
            holder = next(reversed(self._holders))
            del self._holders[holder]
            self.inflight -= 1
            ended += 1
            holder.preempt()
        return ended

    def _arm_ramp(self) -> None:
        """While some wait and the limit still climbs, wake them when it next rises."""
        if self._ramp_timer is not None:
            self._ramp_timer.cancel()
            self._ramp_timer = None
        if not self._queue or self.allowance is None:
            return
        at = self.allowance.next_rise(self.clock())
        if at is None:
            return
        delay = max(0.0, at - self.clock()) + 0.001
        self._ramp_timer = asyncio.get_running_loop().call_later(delay, self._on_ramp)

    def _on_ramp(self) -> None:
        self._ramp_timer = None
        self.wake()

    def close(self) -> None:
        if self._ramp_timer is not None:
            self._ramp_timer.cancel()
            self._ramp_timer = None

    def _give_up(self, fut: asyncio.Future[bool], wait_s: float) -> None:
        """A waiter's wait has run out: it leaves the line, unless the ramp alone holds it.

        The ramp's pacing is the gateway's own, not a lack of room: a job of 64 streams that
        starts into an allowance of 64 at 0.5 a second is let in over two minutes, and
        turning away all but the first 16 after 30 s would fail them at the client after
        its retries. Such a waiter waits for its turn on the ramp, then up to `wait_s` more.
        """
        if fut.done():
            return
        paced = None
        if self.allowance is not None and fut in self._queue and (self.room is None or self.room()):
            place = self.inflight + 1 + self._queue.index(fut)
            paced = self.allowance.paced_until(place, self.clock())
        if paced is not None:
            delay = max(0.0, paced - self.clock()) + wait_s
            loop = asyncio.get_running_loop()
            self._deadlines[fut] = loop.call_later(delay, self._give_up, fut, wait_s)
            return
        self._discard(fut)
        fut.set_result(False)

    def _discard(self, fut: asyncio.Future[bool]) -> None:
        self._waiting.pop(fut, None)
        try:
            self._queue.remove(fut)
        except ValueError:
            pass
