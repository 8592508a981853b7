"""A continuous-batching engine, as a discrete-event model. Pure: time is passed in.

How engines like vLLM and llama.cpp's server run, reduced to what sets latency:

- At most `max_running_seqs` sequences run at once (vLLM `max_num_seqs`, llama.cpp
  `--parallel`); the rest wait, in arrival order (FCFS) or by priority (vLLM's
  `--scheduling-policy priority`: lower value first, arrival order among equals). No
  preemption: a running sequence keeps its place.
- Each step is one forward pass over a batch of at most `max_batch_tokens` tokens (vLLM
  `max_num_batched_tokens`, llama.cpp `-b`/`n_batch`): first one token for every sequence
  that is decoding, then prompt tokens of sequences still in prefill, in scheduling order,
  a long prompt split across steps (chunked prefill).
- A step's time is

      (step_base_ms + decode_token_ms·decoding + prefill_token_ms·prompt tokens
       + kv_read_ms_per_ktoken·context tokens/1000) · stretch

  where the context term is the KV cache the step reads (each decoding sequence's whole
  context, each prefill chunk's context so far), and stretch = c·f_max/f + (1 − c) with
  c = `clock_bound_fraction`: the part of the step bound by SM throughput slows as the SM
  clock falls, the part bound by memory bandwidth does not.
- A sequence's first token comes at the end of the step that finishes its prompt; then one
  token per step. A request that arrives during a step waits for it to end: a chat message
  arriving while a long document is prefilled waits for that whole step, which is what
  wrecks chat's tail latency but not its median (see data/scenarios/llamacpp-cpu.toml).

Running sequences that decode are kept in a heap keyed by the step at which they finish, so
a step costs O(log n) however many sequences run: two simulated hours take seconds.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

from llm_watchdog.sim.scenario import EngineParams

WAITING, PREFILL, DECODE, DONE, CANCELLED = "waiting", "prefill", "decode", "done", "cancelled"


@dataclass(eq=False)
class Request:
    """One generation request and its progress. Times are seconds on the caller's clock."""

    id: int
    cls: str  # "chat" or "batch": accounting only, the engine schedules by priority
    prompt_tokens: int
    output_tokens: int
    arrival_s: float  # when the client sent it: TTFT is measured from here
    priority: int = 0
    cached_tokens: int = 0  # prompt tokens found in the prefix cache
    state: str = WAITING
    prefilled: int = 0
    first_token_s: float | None = None
    finish_s: float | None = None
    order: int = 0
    decode_step: int = 0  # engine step index at which the first decode step runs
    ctx_at_decode: int = 0

    @property
    def prefill_needed(self) -> int:
        return max(1, self.prompt_tokens - self.cached_tokens)

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s


@dataclass
class StepPlan:
    start_s: float
    end_s: float
    chunks: list[tuple[Request, int]]
    decoding: int
    decoding_by_class: dict[str, int]
    prompt_tokens: int
    load: float  # GPU load 0..1 while this step runs


@dataclass
class StepResult:
    end_s: float
    first_tokens: list[Request] = field(default_factory=list)
    finished: list[Request] = field(default_factory=list)
    tokens_by_class: dict[str, int] = field(default_factory=dict)


class Engine:
    def __init__(self, params: EngineParams) -> None:
        self.p = params
        self._orders = itertools.count()
        self._waiting: list[tuple[tuple[float, ...], Request]] = []
        self._prefilling: list[Request] = []
        self._finish: list[tuple[int, int, Request]] = []  # (last decode step, order, request)
        self._decoding_by_class: dict[str, int] = {}
        self._decoding = 0
        self._ctx_base = 0  # Σ ctx_at_decode − decode_step·1 over decoding sequences, see ctx
        self.step_index = 0
        self.current: StepPlan | None = None
        self.tokens_out: dict[str, int] = {}
        self.prompt_tokens_total = 0
        self.finished_total: dict[str, int] = {}

    # -- queue ---------------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self._prefilling) + self._decoding

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def has_work(self) -> bool:
        return bool(self._waiting or self._prefilling or self._decoding)

    def _key(self, r: Request) -> tuple[float, ...]:
        if self.p.scheduling == "priority":
            return (r.priority, r.arrival_s, r.order)
        return (r.arrival_s, r.order)

    def submit(self, req: Request) -> None:
        """Queue a request; it can join the next step that starts."""
        req.order = next(self._orders)
        req.state = WAITING
        heapq.heappush(self._waiting, (self._key(req), req))

    def cancel(self, req: Request) -> None:
        """The client went away: free the request's place at once."""
        if req.state == WAITING:
            self._waiting = [(k, r) for k, r in self._waiting if r is not req]
            heapq.heapify(self._waiting)
        elif req.state == PREFILL:
            self._prefilling.remove(req)
        elif req.state == DECODE:
            self._finish = [e for e in self._finish if e[2] is not req]
            heapq.heapify(self._finish)
            self._leave_decode(req)
        else:
            return
        req.state = CANCELLED

    def generated(self, req: Request) -> int:
        """Output tokens the request has so far (after the last finished step)."""
        if req.state == DECODE:
            return 1 + self.step_index - req.decode_step
        if req.state == DONE:
            return req.output_tokens
        return 0 if req.first_token_s is None else 1

    # -- steps -----------------------------------------------------------------------------

    def _ctx_decoding(self) -> int:
        # A decoding sequence's context grows by one each step: ctx = ctx_at_decode +
        # (step_index − decode_step), summed over all of them without visiting each.
        return self._ctx_base + self._decoding * self.step_index

    def start_step(self, now_s: float, clock_ratio: float = 1.0) -> StepPlan | None:
        """Plan the next step from `now_s` at SM clock / max clock `clock_ratio`; None if idle."""
        assert self.current is None, "a step is already running"
        p = self.p
        while self._waiting and self.num_running < p.max_running_seqs:
            _, req = heapq.heappop(self._waiting)
            req.state = PREFILL
            self._prefilling.append(req)
            if p.scheduling == "priority":
                self._prefilling.sort(key=self._key)
        if not self._prefilling and not self._decoding:
            return None
        budget = p.max_batch_tokens - self._decoding
        chunks: list[tuple[Request, int]] = []
        prompt_tokens = 0
        kv_tokens = self._ctx_decoding()
        for req in self._prefilling:
            if budget <= 0:
                break
            take = min(req.prefill_needed - req.prefilled, budget)
            chunks.append((req, take))
            budget -= take
            prompt_tokens += take
            kv_tokens += req.cached_tokens + req.prefilled + take
        cost_ms = (
            p.step_base_ms
            + p.decode_token_ms * self._decoding
            + p.prefill_token_ms * prompt_tokens
            + p.kv_read_ms_per_ktoken * kv_tokens / 1000.0
        )
        c = p.clock_bound_fraction
        stretch = c / max(clock_ratio, 1e-3) + (1.0 - c)
        tokens = self._decoding + prompt_tokens
        load = min(1.0, max(p.load_min, tokens / p.load_full_batch_tokens))
        plan = StepPlan(
            start_s=now_s,
            end_s=now_s + cost_ms * stretch / 1000.0,
            chunks=chunks,
            decoding=self._decoding,
            decoding_by_class=dict(self._decoding_by_class),
            prompt_tokens=prompt_tokens,
            load=load,
        )
        self.current = plan
        return plan

    def finish_step(self) -> StepResult:
        """Apply the running step's work at its end time."""
        plan = self.current
        assert plan is not None, "no step is running"
        self.current = None
        res = StepResult(end_s=plan.end_s, tokens_by_class=dict(plan.decoding_by_class))
        self.prompt_tokens_total += plan.prompt_tokens
        # decoding sequences got their token; those at their last token leave
        while self._finish and self._finish[0][0] <= self.step_index:
            _, _, req = heapq.heappop(self._finish)
            self._leave_decode(req)
            self._done(req, plan.end_s, res)
        self.step_index += 1
        for req, take in plan.chunks:
            if req.state != PREFILL:
                continue  # cancelled while the step ran
            req.prefilled += take
            if req.prefilled < req.prefill_needed:
                continue
            self._prefilling.remove(req)
            req.first_token_s = plan.end_s
            res.first_tokens.append(req)
            res.tokens_by_class[req.cls] = res.tokens_by_class.get(req.cls, 0) + 1
            if req.output_tokens <= 1:
                self._done(req, plan.end_s, res)
                continue
            req.state = DECODE
            req.decode_step = self.step_index
            req.ctx_at_decode = req.prompt_tokens + 1
            # it decodes in steps decode_step .. decode_step + output_tokens − 2
            heapq.heappush(self._finish, (self.step_index + req.output_tokens - 2, req.order, req))
            self._decoding += 1
            self._decoding_by_class[req.cls] = self._decoding_by_class.get(req.cls, 0) + 1
            self._ctx_base += req.ctx_at_decode - req.decode_step
        for cls, n in res.tokens_by_class.items():
            self.tokens_out[cls] = self.tokens_out.get(cls, 0) + n
        return res

    def _leave_decode(self, req: Request) -> None:
        self._decoding -= 1
        self._decoding_by_class[req.cls] -= 1
        self._ctx_base -= req.ctx_at_decode - req.decode_step

    def _done(self, req: Request, end_s: float, res: StepResult) -> None:
        req.state = DONE
        req.finish_s = end_s
        res.finished.append(req)
        self.finished_total[req.cls] = self.finished_total.get(req.cls, 0) + 1
