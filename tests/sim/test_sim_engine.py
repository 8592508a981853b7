"""The continuous-batching engine model (watchdog/sim/engine.py) and its coupling to the card."""

from __future__ import annotations

import dataclasses

import pytest

from llm_watchdog.sim.engine import DONE, Engine, Request
from llm_watchdog.sim.scenario import EngineParams, load_scenario
from llm_watchdog.sim.virtual import run_virtual
from llm_watchdog.sim.world import World

PARAMS = EngineParams(
    max_running_seqs=4,
    max_batch_tokens=512,
    step_base_ms=10.0,
    decode_token_ms=1.0,
    prefill_token_ms=0.1,
    kv_read_ms_per_ktoken=0.0,
    clock_bound_fraction=1.0,
)


def req(
    i: int, prompt: int = 100, out: int = 5, at: float = 0.0, cls: str = "chat", priority: int = 0
) -> Request:
    return Request(
        id=i, cls=cls, prompt_tokens=prompt, output_tokens=out, arrival_s=at, priority=priority
    )


def drain(engine: Engine, now: float = 0.0, clock_ratio: float = 1.0) -> float:
    while (plan := engine.start_step(now, clock_ratio)) is not None:
        engine.finish_step()
        now = plan.end_s
    return now


def test_one_request_prefills_then_decodes_one_token_per_step() -> None:
    e = Engine(PARAMS)
    r = req(1, prompt=100, out=4)
    e.submit(r)
    plan = e.start_step(0.0)
    assert plan is not None and plan.prompt_tokens == 100 and plan.decoding == 0
    assert plan.end_s == pytest.approx((10.0 + 0.1 * 100) / 1000)
    res = e.finish_step()
    assert res.first_tokens == [r] and r.ttft_s == pytest.approx(0.020)
    assert e.generated(r) == 1
    for n in (2, 3, 4):
        plan = e.start_step(e.step_index * 1.0)
        assert plan is not None and plan.decoding == 1
        e.finish_step()
        assert e.generated(r) == n
    assert r.state == DONE and e.num_running == 0
    assert e.tokens_out["chat"] == 4


def test_a_long_prompt_is_chunked_by_the_token_budget() -> None:
    e = Engine(PARAMS)
    r = req(1, prompt=1200, out=2)
    e.submit(r)
    sizes = []
    while r.first_token_s is None:
        plan = e.start_step(0.0)
        assert plan is not None
        sizes.append(plan.prompt_tokens)
        e.finish_step()
    assert sizes == [512, 512, 176]


def test_max_running_seqs_holds_the_rest_waiting() -> None:
    e = Engine(PARAMS)
    for i in range(6):
        e.submit(req(i, out=50))
    e.start_step(0.0)
    assert e.num_running == 4 and e.num_waiting == 2


@pytest.mark.parametrize(("policy", "first"), [("fcfs", "batch"), ("priority", "chat")])
def test_scheduling_policy_decides_who_runs_first(policy: str, first: str) -> None:
    e = Engine(dataclasses.replace(PARAMS, scheduling=policy, max_running_seqs=1))
    batch = req(1, at=0.0, cls="batch", priority=10)
    chat = req(2, at=0.001, cls="chat", priority=0)  # lower value first under "priority"
    e.submit(batch)
    e.submit(chat)
    e.start_step(0.01)
    res = e.finish_step()
    assert [r.cls for r in res.first_tokens] == [first]


def test_a_cancelled_request_frees_its_place() -> None:
    e = Engine(dataclasses.replace(PARAMS, max_running_seqs=1))
    a, b = req(1, out=100), req(2, out=3)
    e.submit(a)
    e.submit(b)
    e.start_step(0.0)
    e.finish_step()
    assert e.num_running == 1 and e.num_waiting == 1
    e.cancel(a)
    assert e.num_running == 0
    drain(e, 1.0)
    assert b.state == DONE


def test_step_time_stretches_as_the_sm_clock_falls() -> None:
    fast, slow = Engine(PARAMS), Engine(PARAMS)
    for e in (fast, slow):
        e.submit(req(1))
    t_fast = fast.start_step(0.0, clock_ratio=1.0)
    t_slow = slow.start_step(0.0, clock_ratio=0.6)
    assert t_fast is not None and t_slow is not None
    assert t_slow.end_s == pytest.approx(t_fast.end_s / 0.6)
    half = Engine(dataclasses.replace(PARAMS, clock_bound_fraction=0.5))
    half.submit(req(1))
    t_half = half.start_step(0.0, clock_ratio=0.6)
    assert t_half is not None
    assert t_half.end_s == pytest.approx(t_fast.end_s * (0.5 / 0.6 + 0.5))


def test_chat_waits_behind_a_long_prefill_step() -> None:
    e = Engine(dataclasses.replace(PARAMS, max_batch_tokens=2048))
    doc = req(1, prompt=2000, out=5, cls="batch")
    e.submit(doc)
    plan = e.start_step(0.0)
    assert plan is not None
    chat = req(2, prompt=50, at=0.005)  # arrives while the document is prefilled
    e.submit(chat)
    e.finish_step()
    drain(e, plan.end_s)
    assert chat.ttft_s is not None and chat.ttft_s > plan.end_s - 0.005


def test_chat_ttft_grows_with_batch_concurrency() -> None:
    sc = load_scenario("workstation")
    p95 = [
        run_virtual(sc, 900, f"static:{n}", thermal=False, warmup_s=60).chat_ttft_p95_ms
        for n in (0, 4, 16)
    ]
    assert p95[0] is not None and p95[1] is not None and p95[2] is not None
    assert p95[0] < p95[1] < p95[2]


def test_chat_ttft_grows_as_the_card_heats_and_throttles() -> None:
    sc = load_scenario("consumer-warm-room")
    cool = run_virtual(sc, 1800, "static:8", thermal=False, warmup_s=900)
    hot = run_virtual(sc, 1800, "static:8", warmup_s=900)
    assert hot.thermal_violation_s > 600 and cool.thermal_violation_s == 0
    assert hot.chat_ttft_p50_ms is not None and cool.chat_ttft_p50_ms is not None
    assert hot.chat_ttft_p50_ms > 1.1 * cool.chat_ttft_p50_ms
    assert hot.batch_tokens_per_s < cool.batch_tokens_per_s


def test_world_couples_load_to_heat_and_clock_to_step_time() -> None:
    sc = load_scenario("consumer-warm-room")
    w = World(dataclasses.replace(sc, batch=dataclasses.replace(sc.batch, streams=8)))
    t = 0.0
    first_clock = None
    while t < 1200:
        plan = w.start_step(t)
        assert plan is not None  # eight streams keep it busy
        if first_clock is None:
            first_clock = w.clock_ratio()
        w.finish_step()
        t = plan.end_s
    assert w.gpu.temp_c > 80
    assert first_clock is not None and w.clock_ratio() < first_clock - 0.1
    assert w.batch_inflight == 8


def test_allowance_caps_the_batch_job_and_a_raise_lets_it_back_in() -> None:
    sc = load_scenario("workstation")
    w = World(sc)
    w.set_allowance(2, 0.0)
    w.start_step(0.0)
    assert w.batch_inflight == 2
    w.set_allowance(6, 0.5)
    assert w.batch_inflight == 6
    w.set_batch_streams(3, 1.0)  # demand below the allowance: nothing new until some finish
    assert w.batch_inflight == 6 and w.batch_target == 3


def test_the_labs_gateway_holds_batch_under_the_slot_line_as_the_real_one_does() -> None:
    base = load_scenario("workstation")
    sc = dataclasses.replace(
        base,
        engine=dataclasses.replace(base.engine, max_running_seqs=16),  # line: 16 - 2 = 14
        batch=dataclasses.replace(base.batch, streams=20),
    )
    w = World(sc, hold_slots=True)
    assert w.slot_line == 14
    chats = [w.new_request("chat", 0.0, 50, 400) for _ in range(3)]
    for req in chats:
        w.submit(req, 0.0)
    w.set_allowance(20, 0.0)
    assert w.batch_inflight == 11  # 3 chat + 11 batch: the line, though the allowance is 20
    w.cancel(chats[0])  # a chat client leaves: its slot goes to batch
    assert w.batch_inflight == 12
    t = _run_steps(w, 0.0, 60.0)  # the other two finish; batch takes their slots, no more
    assert t >= 1.0 and w.batch_inflight == 14
    free = World(sc)  # without the line, the allowance alone holds batch
    free.set_allowance(20, 0.0)
    assert free.slot_line is None and free.batch_inflight == 20


def _run_steps(w: World, t: float, until: float) -> float:
    while t < until:
        plan = w.start_step(t)
        if plan is None:
            break
        w.finish_step()
        t = plan.end_s
    return t


def test_without_preemption_a_cut_leaves_running_batch_to_finish() -> None:
    sc = load_scenario("workstation")
    w = World(sc)
    w.set_allowance(6, 0.0)
    t = _run_steps(w, 0.0, 2.0)
    w.set_allowance(1, t)
    assert w.batch_inflight == 6 and w.preempted == 0


def test_preemption_ends_the_newest_batch_requests_and_their_tokens_are_lost() -> None:
    sc = load_scenario("workstation")
    w = World(sc, preempt=True)
    w.set_allowance(6, 0.0)
    t = _run_steps(w, 0.0, 2.0)
    running = sorted(w._batch_inflight.values(), key=lambda r: (r.arrival_s, r.id))
    oldest, newest = running[0], running[1:]
    generated = sum(w.engine.generated(r) for r in newest)
    plan = w.start_step(t)  # pre-empted in the middle of a step
    assert plan is not None
    decoding = sum(1 for r in newest if r.state == "decode")
    w.set_allowance(1, t + 0.001)
    assert w.batch_inflight == 1 and w.preempted == 5
    assert list(w._batch_inflight.values()) == [oldest]
    assert all(r.state == "cancelled" for r in newest)
    assert w.preempted_tokens == generated + decoding
    w.finish_step()
    # The streams send again once there is room, not before.
    t = _run_steps(w, plan.end_s, plan.end_s + 5.0)
    assert w.batch_inflight <= 1
    w.set_allowance(6, t)
    t = _run_steps(w, t, t + 30.0)
    assert w.batch_inflight == 6


def test_a_preempting_run_counts_only_the_batch_tokens_that_were_kept() -> None:
    sc = load_scenario("chat-burst")
    cut_at = 300.0

    class CutOnce:
        interval_s = 10.0

        def decide(self, now_s, obs):
            return 16 if now_s < cut_at else 0

    kept = run_virtual(sc, 600.0, CutOnce(), seed=2)
    cut = run_virtual(sc, 600.0, CutOnce(), seed=2, preempt=True)
    assert kept.batch_preempted == 0 and cut.batch_preempted > 0
    # Pre-empted work is lost: the run that ended requests early keeps fewer tokens.
    assert cut.batch_tokens_per_s < kept.batch_tokens_per_s
    after = [m for m in cut.minutes if m.t_s >= cut_at + 60]
    assert after and all(m.batch_inflight == 0 and m.batch_tokens == 0 for m in after)


def test_a_run_keeps_every_chat_answer_its_figures_count() -> None:
    # bench_headroom_rule.py takes probes from these: the same answers as the p95 and the
    # minutes, after the warm-up, in arrival order; the JSON of a run leaves them out.
    sc = load_scenario("chat-burst")
    r = run_virtual(sc, 600.0, "static:4", seed=1, warmup_s=120.0)
    assert len(r.answers) == r.chat_requests > 50
    arrivals = [t for t, _ in r.answers]
    assert arrivals == sorted(arrivals) and arrivals[0] >= 120.0
    values = sorted(ms for _, ms in r.answers)
    assert r.chat_ttft_p95_ms == pytest.approx(values[int(0.95 * (len(values) - 1))], rel=0.1)
    assert "answers" not in r.to_dict() and "answers" not in r.to_dict(minutes=True)
