"""The engine and the GPU on one clock, with the scenario's schedule and the batch job.

Pure like its parts: every method takes `now_s` (seconds since the lab started). The real-time
lab (server.py) and the virtual-time runner (virtual.py) drive the same `World`, so a
scenario behaves alike in both.

Coupling: a running step puts its load on the GPU (load → power → heat), and a step's length
follows the GPU's clock when it starts (heat → slower clocks → longer steps). The GPU is
integrated in slices of at most GPU_TICK_S (with the mean load over the slice), which keeps
two simulated hours cheap; a reader (fake NVML) forces an exact catch-up to its "now".

The batch job: `batch_streams` is its demand (how many requests it wants in flight, each
stream sending its next request `think_time_s` after the last one ended, and the job as a
whole sending at most `max_requests_per_s`, the pace at which it can prepare documents;
0 = no limit); the allowance (set
by a controller through `set_allowance`, None = no limit) caps how many are admitted, as
the project's gateway does. A request already running is not cut, unless the gateway
pre-empts (`preempt`, opt-in as the gateway's is): then an allowance lowered under batch in
flight ends the newest batch requests at once, their tokens are lost, and each stream sends
its request again after `PREEMPT_RETRY_S`, once there is room. With `hold_slots` the
gateway holds its slot line (`--engine-slots`): batch is sent only while batch and chat in
flight stay under the engine's slots less an eighth (1 to 4), as `GatewayConfig.slot_line`.
"""

from __future__ import annotations

import random

from llm_watchdog.gateway.admission import Ramp
from llm_watchdog.gateway.config import slot_line
from llm_watchdog.sim.engine import DECODE, Engine, Request, StepPlan, StepResult
from llm_watchdog.sim.gpu import GpuSnapshot, SimGpu
from llm_watchdog.sim.scenario import ClassTraffic, Scenario

GPU_TICK_S = 0.1
PREEMPT_RETRY_S = 1.0  # a pre-empted stream retries after the gateway's Retry-After (1 s)


class World:
    def __init__(
        self,
        scenario: Scenario,
        *,
        seed: int = 0,
        thermal: bool = True,
        preempt: bool = False,
        hold_slots: bool = False,
    ) -> None:
        self.scenario = scenario
        self.gpu = SimGpu(scenario.gpu)
        self.engine = Engine(scenario.engine)
        self.thermal = thermal  # False: the card is held at its starting temperature ("cool")
        # One stream per source of chance, so what one draws never shifts another: every
        # controller run with the same seed meets the same chat, to the request (common
        # random numbers). With one shared stream, a controller that lets in one more batch
        # request draws its length from the stream, and every chat arrival after it moves.
        self.rng_chat_arrivals = random.Random(f"{seed}:chat-arrivals")
        self._rngs = {cls: random.Random(f"{seed}:{cls}") for cls in ("chat", "batch")}
        self._rng_batch_pace = random.Random(f"{seed}:batch-pace")
        self.t_s = 0.0  # the GPU is integrated up to here
        self._pending = [0.0, 0.0, 0.0]  # seconds, busy seconds, load·seconds not yet applied
        self._load = 0.0
        self._next_event = 0  # index into scenario.schedule
        self.batch_streams = scenario.batch.streams
        self.allowance: int | None = None
        # The gateway's ramp: after a raise, one more batch request at once, then the limit
        # climbs to the new allowance at `ramp.per_s` a second (0: all at once).
        self.ramp = Ramp()
        self.chat_arrivals_per_s = scenario.chat.arrivals_per_s
        self._batch_due: list[float] = []  # times at which a waiting stream may send again
        self._batch_inflight: dict[int, Request] = {}
        self.preempt = preempt
        # The gateway's slot line: batch + chat in flight under it (None: no line).
        self.slot_line = slot_line(scenario.engine.max_running_seqs) if hold_slots else None
        self._chat_open: set[int] = set()  # chat handed to the engine and not finished
        self.preempted = 0  # batch requests ended by pre-emption
        self.preempted_tokens = 0  # their output tokens, counted by steps and then lost
        self._batch_next_ok_s = 0.0  # the job's own pace (max_requests_per_s) allows a send
        self._ids = 0
        self._fill_batch(0.0)

    # -- time --------------------------------------------------------------------------------

    def advance(self, now_s: float, exact: bool = False) -> None:
        """Bring the GPU and the schedule up to `now_s`; `exact` integrates every last bit."""
        sched = self.scenario.schedule
        while self._next_event < len(sched) and sched[self._next_event].at_s <= now_s:
            ev = sched[self._next_event]
            self._integrate(max(ev.at_s, self.t_s), exact=True)
            self._next_event += 1
            if ev.ambient_c is not None:
                self.gpu.ambient_c = ev.ambient_c
            if ev.power_limit_w is not None:
                self.gpu.power_limit_w = ev.power_limit_w
            if ev.power_brake is not None:
                self.gpu.power_brake = ev.power_brake
            if ev.chat_arrivals_per_s is not None:
                self.chat_arrivals_per_s = ev.chat_arrivals_per_s
            if ev.batch_streams is not None:
                self.set_batch_streams(ev.batch_streams, ev.at_s)
        self._integrate(now_s, exact)

    def _integrate(self, to_s: float, exact: bool) -> None:
        dt = to_s - self.t_s
        if dt > 0:
            busy = 1.0 if self._load > 0 else 0.0
            self._pending[0] += dt
            self._pending[1] += dt * busy
            self._pending[2] += dt * self._load
            self.t_s = to_s
        span, busy_s, load_s = self._pending
        if span <= 0 or (span < GPU_TICK_S and not exact):
            return
        self._pending = [0.0, 0.0, 0.0]
        load = load_s / busy_s if busy_s > 0 else 0.0
        if self.thermal:
            self.gpu.step(span, load, busy_s / span)
        else:
            held = self.gpu.temp_c
            self.gpu.step(span, load, busy_s / span)
            self.gpu.temp_c = held

    def next_schedule_s(self, after_s: float) -> float:
        """The first schedule change after `after_s` (inf when none is left)."""
        for ev in self.scenario.schedule[self._next_event :]:
            if ev.at_s > after_s:
                return ev.at_s
        return float("inf")

    def next_wakeup(self) -> float:
        """The next time something happens that no step or request announces."""
        t = float("inf")
        sched = self.scenario.schedule
        if self._next_event < len(sched):
            t = sched[self._next_event].at_s
        if self._batch_due and self._batch_room() > 0:
            t = min(t, max(min(self._batch_due), self._batch_next_ok_s))
        elif self._batch_due and self.allowance is not None:
            rise = self.ramp.next_rise(self.allowance, self.t_s)
            if rise is not None:
                t = min(t, rise)
        return t

    # -- engine --------------------------------------------------------------------------------

    def new_request(
        self,
        cls: str,
        now_s: float,
        prompt_tokens: int | None = None,
        output_tokens: int | None = None,
    ) -> Request:
        traffic = self.scenario.chat if cls == "chat" else self.scenario.batch
        self._ids += 1
        return Request(
            id=self._ids,
            cls=cls,
            prompt_tokens=prompt_tokens or self._draw(cls, traffic, "prompt"),
            output_tokens=output_tokens or self._draw(cls, traffic, "output"),
            arrival_s=now_s,
            priority=traffic.priority,
        )

    def _draw(self, cls: str, traffic: ClassTraffic, what: str) -> int:
        lo = getattr(traffic, f"{what}_tokens_min")
        hi = getattr(traffic, f"{what}_tokens_max")
        return self._rngs.get(cls, self._rngs["chat"]).randint(lo, hi)

    def submit(self, req: Request, now_s: float) -> None:
        self.advance(now_s)
        if req.cls == "chat":
            self._chat_open.add(req.id)
        self.engine.submit(req)

    def cancel(self, req: Request) -> None:
        """A request sent over HTTP whose client left: the engine drops it, its slot is free."""
        self._chat_open.discard(req.id)
        self.engine.cancel(req)
        self.poll(self.t_s)

    def clock_ratio(self) -> float:
        return self.gpu.sm_clock_active_mhz / self.scenario.gpu.sm_clock_max_mhz

    def start_step(self, now_s: float) -> StepPlan | None:
        """Start the engine's next step at `now_s` if it has work (None when idle)."""
        self.poll(now_s)
        plan = self.engine.start_step(now_s, self.clock_ratio())
        self._load = plan.load if plan else 0.0
        return plan

    def finish_step(self) -> StepResult:
        plan = self.engine.current
        assert plan is not None
        self.advance(plan.end_s)
        res = self.engine.finish_step()
        self._load = 0.0
        self._chat_open.difference_update(r.id for r in res.finished)
        ended = [r for r in res.finished if r.id in self._batch_inflight]
        for req in ended:
            self._batch_inflight.pop(req.id, None)
        if ended:
            self._fill_batch(plan.end_s + self.scenario.batch.think_time_s)
        self.poll(plan.end_s)
        return res

    def snapshot(self, now_s: float) -> GpuSnapshot:
        self.advance(now_s, exact=True)
        return self.gpu.snapshot()

    # -- the batch job ------------------------------------------------------------------

    @property
    def batch_inflight(self) -> int:
        return len(self._batch_inflight)

    def batch_limit(self, now_s: float) -> int | None:
        """What the gateway admits up to at `now_s`: the allowance, or its ramp toward it."""
        return None if self.allowance is None else self.ramp.limit(self.allowance, now_s)

    @property
    def batch_target(self) -> int:
        limit = self.batch_limit(self.t_s)
        if limit is None:
            return self.batch_streams
        return min(self.batch_streams, limit)

    def _batch_room(self) -> int:
        room = self.batch_target - len(self._batch_inflight)
        if self.slot_line is not None:
            room = min(room, self.slot_line - len(self._chat_open) - len(self._batch_inflight))
        return room

    def set_batch_streams(self, n: int, now_s: float) -> None:
        """The batch job's demand: how many requests it wants in flight."""
        self.batch_streams = max(0, int(n))
        self._fill_batch(now_s)

    def set_allowance(self, n: int | None, now_s: float) -> None:
        """The gateway's cap on batch requests in flight (None: no cap)."""
        self.advance(now_s)
        before = self.batch_limit(now_s)
        self.allowance = None if n is None else max(0, int(n))
        if self.allowance is not None:
            # The first allowance (no cap before it) is in force at once, as the gateway's
            # default is; only a raise of a cap is ramped.
            was = self.allowance if before is None else before
            self.ramp.retarget(was, self.allowance, now_s, len(self._batch_inflight))
            if self.preempt:
                self._preempt(now_s, self.allowance)
        self.poll(now_s)

    def _preempt(self, now_s: float, allowance: int) -> None:
        """End the newest batch requests over `allowance`, as the gateway does."""
        over = len(self._batch_inflight) - allowance
        if over <= 0:
            return
        # The dict holds them in the order they were sent, as the gateway's gate does.
        for req in list(self._batch_inflight.values())[-over:]:
            # A sequence decoding in the running step gets that step's token counted when
            # the step ends, so it is lost too.
            running = req.state == DECODE and self.engine.current is not None
            self.preempted_tokens += self.engine.generated(req) + int(running)
            self.engine.cancel(req)
            del self._batch_inflight[req.id]
            self.preempted += 1
        self._fill_batch(now_s + PREEMPT_RETRY_S)

    def _fill_batch(self, now_s: float) -> None:
        """Streams the job wants: one due entry per stream not in flight."""
        want = self.batch_streams - len(self._batch_inflight)
        while len(self._batch_due) < want:
            self._batch_due.append(now_s)
        while len(self._batch_due) > max(0, want):
            self._batch_due.remove(max(self._batch_due))

    def poll(self, now_s: float) -> None:
        """Send the batch requests that are due and have room under the allowance."""
        self.advance(now_s)
        self._batch_due.sort()
        if self.allowance is not None:
            # Requests due only now have not waited: the job starting this instant is what
            # a long-unused limit is ramped for.
            waiting = bool(self._batch_due) and self._batch_due[0] < now_s
            self.ramp.observe(self.allowance, now_s, len(self._batch_inflight), waiting)
        if not self._batch_due:
            return
        rate = self.scenario.batch.max_requests_per_s
        while self._batch_due and self._batch_due[0] <= now_s and self._batch_room() > 0:
            if rate > 0:
                if now_s < self._batch_next_ok_s:
                    break
                self._batch_next_ok_s = now_s + self._rng_batch_pace.expovariate(rate)
            self._batch_due.pop(0)
            req = self.new_request("batch", now_s)
            self._batch_inflight[req.id] = req
            self.engine.submit(req)
