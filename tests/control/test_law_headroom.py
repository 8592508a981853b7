"""The law's rules from issue 14: demand, heat against load, re-testing a surge cap, a grow
budget, and acting ahead of time on the headroom map."""

from __future__ import annotations

import dataclasses
import re

import pytest

from llm_watchdog.control.headroom import Observation
from llm_watchdog.control.law import (
    MAP_PRIOR_PER_CELL,
    AllowanceController,
    ControlAction,
    ControlConfig,
    ControlInput,
    GpuState,
)
from llm_watchdog.nvml.throttle import SW_THERMAL_SLOWDOWN

T = 1000.0
COOL = GpuState(0, 2000.0, 2000.0, temp_c=55.0, temp_slowdown_c=90.0)
HOT = GpuState(SW_THERMAL_SLOWDOWN, 1600.0, 2000.0, temp_c=86.0, temp_slowdown_c=90.0)


def ours(**changes: object) -> AllowanceController:
    base = ControlConfig(target_p95_ms=T, floor=0, ceiling=32, default_allowance=8)
    return AllowanceController(dataclasses.replace(base, **changes))


def test_growth_never_passes_the_batch_jobs_demand() -> None:
    c = ours(default_allowance=4, app_limited_headroom=0)
    now, a = 0.0, None
    for _ in range(40):
        a = c.step(ControlInput(now, (200.0,) * 5, batch_inflight=4, batch_queued=1, gpu=COOL))
        now += 20.0
    assert a is not None and a.allowance_after == 5
    assert "the batch job's demand 5" in a.reason


def first_grow(level: int, **changes: object) -> int:
    """A job that fills its allowance, asks for 30 more, and chat fast: the first grow."""
    c = ours(default_allowance=level, ceiling=128, **changes)
    now = 0.0
    for _ in range(20):
        a = c.step(ControlInput(now, (200.0,) * 5, batch_inflight=level, batch_queued=30))
        if a.kind == "grow":
            return a.allowance_after
        now += 5.0
    raise AssertionError("no grow")


def test_growth_over_what_is_in_flight_scales_with_it() -> None:
    # A tenth of what runs, at least 2: one step on a small engine and on a large one alike.
    assert first_grow(10) == 12
    assert first_grow(40) == 44
    assert first_grow(96) == 106
    assert first_grow(40, app_limited_fraction=0.0) == 42


def test_the_growth_budget_holds_changes_per_hour() -> None:
    c = ours(default_allowance=1, app_limited_headroom=0, ceiling=64, max_grows_per_h=5)
    now = 0.0
    grows = 0
    for _ in range(200):  # 200 × 16 s: under an hour
        a = c.step(ControlInput(now, (100.0,) * 5, batch_inflight=64, batch_queued=64))
        grows += a.kind == "grow"
        now += 16.0
    assert grows == 5


def arrivals_up(gpu: GpuState) -> AllowanceController:
    """Two and a half minutes of 3 chat arrivals per 5 s, then 7 per 5 s (2.3×) for 15 s."""
    c = ours(default_allowance=12, surge_confirm=1, app_limited_headroom=0)
    now = 0.0
    for k in range(33):
        n = 3 if k < 30 else 7
        c.step(
            ControlInput(
                now, (300.0,) * n, gpu=gpu, batch_inflight=12, batch_queued=0, chat_arrivals=n
            )
        )
        now += 5.0
    return c


def test_arrivals_up_under_a_thermal_slowdown_are_read_as_heat() -> None:
    # On a cool card the same arrivals shed batch as load ...
    assert arrivals_up(COOL).allowance < 12
    # ... under a thermal slowdown they are under 1.5 × the surge ratio: no shed.
    assert arrivals_up(HOT).allowance == 12


def learned(c: AllowanceController, cap: int, hot: bool, ratio: float, now: float) -> None:
    """A surge cap as a surge that ended at `now` teaches it."""
    c.surge_cap, c.surge_cap_heat, c.last_surge_s = cap, (hot, ratio), now


def test_a_surge_cap_learned_hot_is_retested_once_the_card_is_cooler() -> None:
    # Surges keep coming (the quiet retest is off): the cooler card alone retests the cap.
    c = ours(surge_cap_retest_s=600.0, surge_cap_quiet_retest=False)
    learned(c, 2, True, 0.8, 0.0)
    now = 0.0
    for _ in range(50):  # 500 s cooler: not yet
        c.step(ControlInput(now, (200.0,) * 3, gpu=COOL, batch_inflight=2))
        now += 10.0
    assert c.surge_cap == 2
    for _ in range(12):
        c.step(ControlInput(now, (200.0,) * 3, gpu=COOL, batch_inflight=2))
        now += 10.0
    assert c.surge_cap is None


def test_a_surge_cap_learned_hot_holds_growth_only_while_the_card_is_hot() -> None:
    c = ours(default_allowance=2, app_limited_headroom=0, surge_cap_retest_s=3600.0)
    learned(c, 2, True, 0.3, 0.0)  # missed under a slowdown bit, at 0.3 of the clock
    now, a = 0.0, None
    for _ in range(30):  # hot again, chat fast: held at the cap
        a = c.step(ControlInput(now, (200.0,) * 3, gpu=HOT, batch_inflight=2, batch_queued=10))
        now += 10.0
    assert a is not None and a.allowance_after == 2
    assert "the level chat surges were met from" in a.reason
    for _ in range(30):  # cool, the cap still kept: growth goes past it
        a = c.step(ControlInput(now, (200.0,) * 3, gpu=COOL, batch_inflight=a.allowance_after))
        now += 10.0
    assert a.allowance_after > 2 and c.surge_cap == 2
    # A cap learned on a cool card holds on a cool card.
    c = ours(default_allowance=2, app_limited_headroom=0, surge_cap_retest_s=3600.0)
    learned(c, 2, False, 1.0, now)
    for _ in range(30):
        a = c.step(ControlInput(now, (200.0,) * 3, gpu=COOL, batch_inflight=2, batch_queued=10))
        now += 10.0
    assert a.allowance_after == 2


def surge_missed(**changes: object) -> tuple[AllowanceController, float]:
    """Three minutes of 3 chat arrivals per 5 s at 12 batch in flight, then 30 s of 8 per 5 s
    answered in 2.5 s (missed), then chat as before until the surge has ended."""
    c = ours(default_allowance=12, ceiling=12, surge_confirm=1, app_limited_headroom=0, **changes)
    now = 0.0
    for k in range(48):
        n, ttft = (8, 2500.0) if 36 <= k < 42 else (3, 300.0)
        c.step(ControlInput(now, (ttft,) * n, gpu=COOL, batch_inflight=12, chat_arrivals=n))
        now += 5.0
    return c, now


def quiet_for(c: AllowanceController, now: float, seconds: float) -> float:
    """Chat as usual and fast, the batch job asking for more: growth stops only at a cap."""
    end = now + seconds
    while now < end:
        c.step(
            ControlInput(
                now,
                (300.0,) * 3,
                gpu=COOL,
                batch_inflight=c.allowance,
                batch_queued=10,
                chat_arrivals=3,
            )
        )
        now += 5.0
    return now


def test_a_surge_cap_is_retested_once_no_surge_has_come_for_as_long() -> None:
    c, now = surge_missed(surge_cap_retest_s=600.0)
    assert c.surge_cap == 6  # ⌊0.5 × 12⌋: learned on a cool card
    now = quiet_for(c, now, 500.0)
    assert c.surge_cap == 6 and c.allowance == 6  # held there while surges may still come
    now = quiet_for(c, now, 150.0)
    assert c.surge_cap is None  # ten minutes with no surge: the load it was learned in is gone
    quiet_for(c, now, 120.0)
    assert c.allowance > 6
    # Without the rule the cap learned on a cool card holds on it for good.
    c, now = surge_missed(surge_cap_retest_s=600.0, surge_cap_quiet_retest=False)
    quiet_for(c, now, 1800.0)
    assert c.surge_cap == 6 and c.allowance == 6


def test_a_restarted_law_starts_from_the_surge_cap_the_last_run_held() -> None:
    c, now = surge_missed(surge_cap_retest_s=600.0)
    memory = c.surge_memory()
    assert memory is not None and (memory["cap"], memory["missed_at"], memory["hot"]) == (
        6,
        12,
        False,
    )
    # The next run, hours later on its own clock: held at the cap from its first step, and
    # its quiet time counts from there, as if a surge had just come.
    again = ours(default_allowance=4, ceiling=12, app_limited_headroom=0, surge_cap_retest_s=600.0)
    assert again.seed_surge(memory)
    later = quiet_for(again, 50_000.0, 500.0)
    assert (again.surge_cap, again.allowance) == (6, 6)
    assert again.surge_memory() == memory  # kept as it came, for the run after
    quiet_for(again, later, 270.0)
    assert again.surge_cap is None and again.allowance > 6
    assert again.surge_memory() is None
    # Unseeded, nothing holds it: the burst would be met from 12 again.
    fresh = ours(default_allowance=4, ceiling=12, app_limited_headroom=0)
    quiet_for(fresh, 50_000.0, 500.0)
    assert fresh.allowance == 12


def test_a_surge_memory_that_is_not_one_is_refused_and_changes_nothing() -> None:
    c = ours()
    good = {"cap": 6, "ratio": 3.1, "missed_at": 12, "hot": False, "clock_ratio": 0.98}
    for bad in (
        {},
        {**good, "cap": "6"},
        {**good, "cap": True},
        {**good, "cap": 0},  # at the floor: no cap
        {**good, "ratio": float("nan")},
        {**good, "missed_at": -1},
        {**good, "hot": "no"},
        {**good, "clock_ratio": [1]},
    ):
        assert not c.seed_surge(bad), bad
        assert c.surge_cap is None and c.surge_memory() is None
    assert c.seed_surge(good) and c.surge_cap == 6


def test_a_cap_raised_by_met_surges_stops_short_of_the_level_one_was_missed_from() -> None:
    c = ours(surge_creep_limit=0.9)
    assert c.seed_surge({"cap": 8, "ratio": 3.0, "missed_at": 12, "hot": False})
    raises = []
    for _ in range(8):
        # A surge as big as the missed one, met from the cap with room to spare.
        c.surge_onset, c.surge_peak, c.surge_samples = c.surge_cap, 3.0, [(0.0, 200.0)]
        c.surge_base = c.surge_cap
        c.surge.add = lambda *a: False  # type: ignore[method-assign]  # the surge has ended
        c._surge(ControlInput(0.0, (), gpu=COOL), c.surge_cap, [], 1.0)
        raises.append(c.surge_cap)
    assert raises == [9, 10, 10, 10, 10, 10, 10, 10]  # ⌊0.9 × 12⌋, where 13 would come
    off = ours(surge_creep_limit=0.0)
    assert off.seed_surge({"cap": 8, "ratio": 3.0, "missed_at": 12, "hot": False})
    for _ in range(8):
        off.surge_onset, off.surge_peak, off.surge_samples = off.surge_cap, 3.0, [(0.0, 200.0)]
        off.surge_base = off.surge_cap
        off.surge.add = lambda *a: False  # type: ignore[method-assign]
        off._surge(ControlInput(0.0, (), gpu=COOL), off.surge_cap, [], 1.0)
    assert off.surge_cap == 16


def history() -> list[Observation]:
    """What the card has shown: hot, chat holds with 3 batch in flight and not with 6; cool,
    it holds with 10."""
    out = []
    for i in range(200):
        out.append(Observation(300.0, 3, "hot"))
        out.append(Observation(2500.0 if i % 3 == 0 else 300.0, 6, "hot"))
        out.append(Observation(300.0, 10, "cool"))
    return out


def cool_then_hot(c: AllowanceController, now: float) -> tuple[ControlAction | None, float]:
    """Ten seconds cool at 10 batch in flight (nothing changes), then up to ten hot with chat
    still fast: the first cut, if any, and the time after it."""
    for _ in range(10):
        c.step(ControlInput(now, (300.0,) * 3, gpu=COOL, batch_inflight=10, batch_queued=0))
        now += 1.0
    assert c.allowance == 10
    for _ in range(10):
        a = c.step(ControlInput(now, (300.0,) * 3, gpu=HOT, batch_inflight=10, batch_queued=0))
        now += 1.0
        if a.kind == "cut":
            return a, now
    return None, now


def test_the_map_cuts_ahead_when_the_card_turns_hot_and_grows_back_when_it_cools() -> None:
    c = ours(default_allowance=10, app_limited_headroom=0, headroom_dwell_s=5.0)
    # What the card has shown earlier in this run.
    c.map_samples.extend(
        (float(i // 3), o.ttft_ms, o.batch_inflight, o.state, None, None)
        for i, o in enumerate(history())
    )
    cut, now = cool_then_hot(c, 1000.0)
    assert cut is not None and cut.allowance_after == 3
    assert cut.inputs["headroom_row"].startswith("hot")
    assert "the card is now hot" in cut.reason
    # It cools: back to what the map says the cool card takes (nothing failed up to the
    # 9–12 group), in one write.
    grew = None
    for _ in range(120):
        a = c.step(
            ControlInput(now, (200.0,) * 3, gpu=COOL, batch_inflight=c.allowance, batch_queued=10)
        )
        now += 1.0
        if a.kind == "grow":
            grew = a
            break
    assert grew is not None and grew.allowance_after == 12
    assert grew.inputs["headroom_row"].startswith("cool")


def test_a_map_seeded_from_earlier_days_cuts_ahead_the_first_time_the_card_turns_hot() -> None:
    c = ours(default_allowance=10, app_limited_headroom=0, headroom_dwell_s=5.0)
    assert c.seed_map(history()) == 600
    # Hours after anything this run has seen: only the seed knows "hot".
    cut, _ = cool_then_hot(c, 50_000.0)
    assert cut is not None and cut.allowance_after == 3
    assert cut.inputs["headroom_row"].startswith("hot")
    # Unseeded, the same run has no hot row: nothing is cut while chat is fast.
    plain = ours(default_allowance=10, app_limited_headroom=0, headroom_dwell_s=5.0)
    now = 50_000.0
    for gpu in (COOL,) * 10 + (HOT,) * 10:
        a = plain.step(ControlInput(now, (300.0,) * 3, gpu=gpu, batch_inflight=10, batch_queued=0))
        now += 1.0
        assert a.kind != "cut"


def test_the_seed_keeps_the_newest_few_hundred_of_each_state_and_load() -> None:
    c = ours()
    slow_then_fast = [Observation(2500.0, 6, "hot")] * 1000 + [Observation(300.0, 6, "hot")] * 400
    assert c.seed_map(slow_then_fast + [Observation(300.0, 1, "cool")]) == MAP_PRIOR_PER_CELL + 1
    assert all(o.ttft_ms == 300.0 for o in c.map_prior)
    assert c.seed_map([]) == 0 and c.map_prior == []  # a new seed replaces the old one


def test_the_usual_chat_in_flight_is_found_within_a_minute_not_ten() -> None:
    # Started from one quiet reading, a 10-minute EWMA read chat's 10 slots as 2-4 for minutes,
    # and the slot rules grew batch into slots chat needed, then cut: a change every few
    # seconds until it caught up.
    c = ours(default_allowance=4, engine_slots=32, app_limited_headroom=0)
    now = 0.0
    a = c.step(ControlInput(now, (300.0,), batch_inflight=4, batch_queued=20, chat_inflight=1))
    for k in range(12):  # a minute of 5-s steps with chat holding 9-11 slots
        now += 5.0
        a = c.step(
            ControlInput(
                now, (300.0,) * 3, batch_inflight=4, batch_queued=20, chat_inflight=9 + k % 3
            )
        )
    assert 9.0 <= a.inputs["chat_usual_inflight"] <= 11.0
    # Grown no further than the slots less three times that: room for a burst.
    assert a.allowance_after <= 32 - 3 * 9


def heating(temp_c: float) -> GpuState:
    """Full clocks, no throttle bit yet, at `temp_c` of a card whose clocks fall at 90 °C."""
    return GpuState(0, 2000.0, 2000.0, temp_c=temp_c, temp_slowdown_c=90.0)


def first_ahead_cut(c: AllowanceController) -> ControlAction | None:
    """The first cut while the card heats 70 → 90 °C at 15 °C a minute (a fan has stopped),
    chat fast; None if none came before 90 °C."""
    now, temp = 0.0, 70.0
    while temp < 90.0:
        a = c.step(
            ControlInput(now, (300.0,) * 3, gpu=heating(temp), batch_inflight=10, batch_queued=0)
        )
        if a.kind == "cut":
            return a
        now += 1.0
        temp += 0.25
    return None


def test_a_card_heading_for_its_slowdown_temperature_is_cut_to_the_hot_row_before_it_gets_there():
    c = ours(default_allowance=10, app_limited_headroom=0, headroom_dwell_s=5.0)
    c.seed_map(history())
    cut = first_ahead_cut(c)
    assert cut is not None, "no cut before the card reached 90 °C"
    assert cut.allowance_after == 3  # the seeded hot row
    assert cut.inputs["headroom_row"].startswith("hot")
    assert "heads for its slowdown temperature" in cut.reason


def test_the_cut_ahead_can_take_the_hot_row_of_a_card_just_into_its_slowdown() -> None:
    # Hot at half the clock (the cooler failed outright), chat held with 2 batch and not 6;
    # hot at 0.88 of it (just into the slowdown), it held with 8 and not with 12.
    deep = [Observation(300.0, 2, "hot", clock_ratio=0.5)] * 200
    deep += [
        Observation(2500.0 if i % 3 == 0 else 300.0, 6, "hot", clock_ratio=0.5) for i in range(200)
    ]
    shallow = [Observation(300.0, 8, "hot", clock_ratio=0.88)] * 200
    shallow += [Observation(2500.0, 12, "hot", clock_ratio=0.88)] * 50
    cool = [Observation(300.0, 10, "cool", clock_ratio=1.0)] * 200
    pooled = ours(
        default_allowance=10, app_limited_headroom=0, headroom_dwell_s=5.0, map_ahead_clock=0.0
    )
    pooled.seed_map(deep + shallow + cool)
    cut = first_ahead_cut(pooled)
    assert cut is not None and cut.allowance_after == 2  # the whole hot row: 6 failed
    # A card creeping into its slowdown arrives at its top clocks: the row learned there
    # (map_ahead_clock, 0.8 of the clock, the default).
    near = ours(default_allowance=10, app_limited_headroom=0, headroom_dwell_s=5.0)
    near.seed_map(deep + shallow + cool)
    cut = first_ahead_cut(near)
    assert cut is not None and cut.allowance_after == 8
    assert "heads for its slowdown temperature" in cut.reason
    # Answers with no clock known count in either row.
    unknown = ours(default_allowance=10, app_limited_headroom=0, headroom_dwell_s=5.0)
    unknown.seed_map(history())
    cut = first_ahead_cut(unknown)
    assert cut is not None and cut.allowance_after == 3


def test_a_card_heading_for_its_slowdown_temperature_does_not_grow_into_it():
    c = ours(default_allowance=4, app_limited_headroom=0, grow_cooldown_s=0.0)
    now, temp = 0.0, 70.0
    for _ in range(60):  # a minute at a steady 70 °C: chat fast, the law grows
        c.step(ControlInput(now, (200.0,) * 3, gpu=heating(temp), batch_inflight=c.allowance))
        now += 1.0
    grown = c.allowance
    assert grown > 4
    reasons = []
    for _ in range(40):  # rising 0.3 °C a second, from 76 towards 90: no grows, no map known
        temp = min(89.5, temp + 0.3)
        a = c.step(ControlInput(now, (200.0,) * 3, gpu=heating(temp), batch_inflight=c.allowance))
        reasons.append(a.reason)
        now += 1.0
    assert c.allowance == grown
    assert any("no growing into it" in r for r in reasons)


def test_a_card_resting_just_under_its_slowdown_temperature_is_not_grown_back_to_the_cool_row():
    # The cut took the load away and the clock came back, but the card is 2 °C under where
    # its clocks fall: the cooler state's row would heat it straight back.
    resting = GpuState(0, 2000.0, 2000.0, temp_c=88.0, temp_slowdown_c=90.0)
    c = ours(default_allowance=10, app_limited_headroom=0, headroom_dwell_s=5.0, heat_eta_s=0.0)
    warm_holds = [Observation(300.0, 10, "warm")] * 200
    c.map_samples.extend(
        (float(i // 3), o.ttft_ms, o.batch_inflight, o.state, None, None)
        for i, o in enumerate(history() + warm_holds)
    )
    cut, now = cool_then_hot(c, 1000.0)
    assert cut is not None and cut.allowance_after == 3
    for _ in range(60):
        c.step(ControlInput(now, (200.0,) * 3, gpu=resting, batch_inflight=c.allowance))
        now += 1.0
    assert c.map_grow_to is None
    assert c.allowance < 10


def test_a_card_hovering_at_its_slowdown_temperature_is_cut_ahead_once_not_at_every_touch():
    # Cards that live at their target temperature sit a degree either side of it: each touch
    # reads as "there", each dip as "not heading there". One cut to the hot row, then a hold
    # there until the card is clearly cooler.
    c = ours(
        default_allowance=10, app_limited_headroom=0, headroom_dwell_s=5.0, grow_cooldown_s=0.0
    )
    c.seed_map(history())
    now, kinds = 0.0, []
    for i in range(300):
        temp = 89.0 if (i // 7) % 2 else 90.0  # touching, then a degree under, 7 s each
        a = c.step(ControlInput(now, (200.0,) * 3, gpu=heating(temp), batch_inflight=c.allowance))
        if a.changed:
            kinds.append(a.kind)
        now += 1.0
    assert c.allowance == 3  # the seeded hot row
    assert kinds == ["cut"]
    assert "held at the hot row 3" in a.reason
    # Cooled well under it: the hold is gone and chat's low p95 grows the allowance again.
    for _ in range(60):
        a = c.step(ControlInput(now, (200.0,) * 3, gpu=heating(80.0), batch_inflight=c.allowance))
        now += 1.0
    assert c.allowance > 3


def surge_then_calm(**changes: object) -> AllowanceController:
    """Two and a half minutes of 3 fast chat answers per 5 s, then a surge of 9 per 5 s, slow
    ones, for 30 s, then 3 fast per 5 s again for two minutes: the map's samples."""
    c = ours(default_allowance=12, surge_confirm=1, app_limited_headroom=0, **changes)
    now = 0.0
    for k in range(30 + 6 + 24):
        n, ms = (9, 2500.0) if 30 <= k < 36 else (3, 300.0)
        c.step(
            ControlInput(
                now,
                (ms,) * n,
                gpu=COOL,
                batch_inflight=c.allowance,
                batch_queued=0,
                chat_arrivals=n,
            )
        )
        now += 5.0
    return c


def test_the_map_learns_from_chat_at_its_usual_rate_not_from_a_surge() -> None:
    learned = [ms for _, ms, *_ in surge_then_calm().map_samples]
    # The surge's slow answers, and the minute after it while its queue drains, are load:
    # none is in the map, and the calm before and after is.
    assert 2500.0 not in learned
    assert len(learned) >= 3 * 30
    # Where it is off, the map takes them in, as before.
    mixed = [ms for _, ms, *_ in surge_then_calm(map_skip_surges=False).map_samples]
    assert mixed.count(2500.0) == 6 * 9


def chat_fails_at_18(
    c: AllowanceController, gpu: GpuState, arrivals: int | None, held_at: int = 10
) -> float:
    """Eight minutes of chat with 18 batch requests in flight (what ran before the serving
    layer held the allowance at `held_at`), 12 of its 400 answers (3 %) over the target: within a
    pooled p95, far over what minutes of ~48 answers allow (0.6 %). Returns the time it
    ends."""
    now = 0.0
    for k in range(100):
        slow = k % 8 == 0 and k < 96
        answers = (1500.0 if slow else 300.0, 300.0, 300.0, 300.0)
        c.step(
            ControlInput(
                now,
                answers,
                gpu=gpu,
                batch_inflight=18,
                batch_queued=30,
                chat_arrivals=arrivals,
                allowance=held_at,
            )
        )
        now += 5.0
    return now


def grow_after(
    c: AllowanceController, now: float, arrivals: int | None, steps: int = 200
) -> ControlAction:
    """Fast chat, 4 answers every 5 s on the cool card, a batch job that fills its allowance
    and asks for more: the last decision after `steps` of 5 s (~17 minutes)."""
    a = None
    for _ in range(steps):
        a = c.step(
            ControlInput(
                now,
                (200.0,) * 4,
                gpu=COOL,
                batch_inflight=c.allowance,
                batch_queued=30,
                chat_arrivals=arrivals,
            )
        )
        now += 5.0
    assert a is not None
    return a


def test_growth_stops_under_a_level_the_map_is_sure_chat_fails_at_in_this_state() -> None:
    c = ours(default_allowance=10)
    a = grow_after(c, chat_fails_at_18(c, COOL, arrivals=4), arrivals=4)
    assert a.allowance_after == 16, a.reason
    assert a.reason == (
        "hold 16: p95≈200 ms low, held at the cool headroom map: chat surely misses the SLO's "
        "minutes at 17+ batch requests"
    )
    # Inside the failing group already, it grows no deeper.
    inside = ours(default_allowance=10)
    a = grow_after(inside, chat_fails_at_18(inside, COOL, 4, held_at=20), 4, steps=30)
    assert (a.allowance_before, a.allowance_after) == (20, 20), a.reason
    assert "held at the cool headroom map: chat surely misses the SLO's minutes at 17+" in (
        a.reason
    )
    # Once those answers have aged out of the map, the level is tried again.
    short = ours(default_allowance=10, headroom_memory_s=600.0)
    assert (
        grow_after(short, chat_fails_at_18(short, COOL, arrivals=4), arrivals=4).allowance_after
        == 32
    )


def test_the_fail_cap_judges_as_the_slo_only_where_chat_is_counted_and_only_its_own_state() -> None:
    # Without the serving layer's count the map judges by the pooled p95, and 3 % over holds.
    pooled = ours(default_allowance=10)
    assert grow_after(pooled, chat_fails_at_18(pooled, COOL, None), None).allowance_after == 32
    # Failing while hot says nothing of the cool card.
    hot_only = ours(default_allowance=10)
    assert grow_after(hot_only, chat_fails_at_18(hot_only, HOT, 4), 4).allowance_after == 32
    off = ours(default_allowance=10, map_fail_cap=False)
    assert grow_after(off, chat_fails_at_18(off, COOL, 4), 4).allowance_after == 32


BAND = 1.6  # the opt-in rate band's width, as docs/control.md measures it


def test_the_fail_cap_leaves_out_the_answers_of_chat_busier_than_now() -> None:
    # Chat failed at 18 batch requests while it arrived at 2.4 a second (a lunch hour); at
    # 0.8 a second, three times fewer, those answers say nothing and growth goes on.
    lunch = ours(default_allowance=10, map_rate_band=BAND)
    a = grow_after(lunch, chat_fails_at_18(lunch, COOL, arrivals=12), arrivals=4)
    assert a.allowance_after == 32, a.reason
    # Off (the default): every rate counts, and growth is held under the failing level.
    lumped = ours(default_allowance=10)
    a = grow_after(lumped, chat_fails_at_18(lumped, COOL, arrivals=12), arrivals=4)
    assert a.allowance_after == 16, a.reason
    # Within the band (0.8 a second against 0.6) the answers still count.
    near = ours(default_allowance=10, map_rate_band=BAND)
    a = grow_after(near, chat_fails_at_18(near, COOL, arrivals=4), arrivals=3)
    assert a.allowance_after == 16, a.reason


def test_a_level_that_failed_under_calmer_chat_is_held_under_busier_chat() -> None:
    # Failed at 0.8 a second; chat now arrives at 2.4: the level fails now too.
    c = ours(default_allowance=10, map_rate_band=BAND)
    a = grow_after(c, chat_fails_at_18(c, COOL, arrivals=4), arrivals=12)
    assert a.allowance_after == 16, a.reason


def test_the_map_stamps_each_answer_with_chats_rate_over_the_last_two_minutes() -> None:
    c = ours(default_allowance=10)
    chat_fails_at_18(c, COOL, arrivals=12)
    rates = [r for *_, r in c.map_samples]
    assert rates[0] is None  # under a minute seen: no rate yet
    assert rates[-1] == 12 / 5.0
    # Counted from the answers where the serving layer does not count arrivals.
    answers = ours(default_allowance=10)
    chat_fails_at_18(answers, COOL, arrivals=None)
    assert [r for *_, r in answers.map_samples][-1] == 4 / 5.0


def test_an_earlier_days_answer_counts_at_any_rate_when_its_rate_is_not_known() -> None:
    def yesterday(rate: float | None) -> list[Observation]:
        return [dataclasses.replace(o, chat_per_s=rate) for o in failed_yesterday_at_18()]

    at_lunch = ours(default_allowance=10, map_rate_band=BAND)
    at_lunch.seed_map(yesterday(2.4))
    assert grow_after(at_lunch, 0.0, 4).allowance_after == 32
    unknown = ours(default_allowance=10, map_rate_band=BAND)
    unknown.seed_map(yesterday(None))
    assert grow_after(unknown, 0.0, 4).allowance_after == 16
    calmer = ours(default_allowance=10, map_rate_band=BAND)
    calmer.seed_map(yesterday(0.3))
    assert grow_after(calmer, 0.0, 4).allowance_after == 16


def test_the_rate_band_is_off_or_wider_than_one() -> None:
    assert ours().config.map_rate_band == 0.0
    with pytest.raises(ValueError, match="map_rate_band must be 0"):
        ours(map_rate_band=1.0)


def failed_yesterday_at_18() -> list[Observation]:
    """Earlier days' chat on the cool card: 13 of 400 answers (3 %) over the target with 18
    batch requests in flight."""
    return [Observation(1500.0 if i % 33 == 0 else 300.0, 18, "cool") for i in range(400)]


def test_the_seed_caps_growth_for_the_runs_first_hours_then_the_level_is_tried_again() -> None:
    # The level the card failed at on earlier days is not probed again on the first morning.
    seeded = ours(default_allowance=10)
    seeded.seed_map(failed_yesterday_at_18())
    a = grow_after(seeded, 0.0, 4)  # ~17 minutes
    assert (a.allowance_after, a.kind) == (16, "hold"), a.reason
    assert a.reason == (
        "hold 16: p95≈200 ms low, held at the cool headroom map: chat surely misses the SLO's "
        "minutes at 17+ batch requests (earlier days' answers counted for another 223 min)"
    )
    # Its verdict lasts as long as this run's own answers would: then the level is tried anew.
    short = ours(default_allowance=10, headroom_memory_s=600.0)
    short.seed_map(failed_yesterday_at_18())
    assert grow_after(short, 0.0, 4, steps=100).allowance_after == 16  # 500 s in
    assert grow_after(short, 500.0, 4, steps=100).allowance_after == 32
    # A seed counts from the first step after it, whenever that comes (a daemon restarted).
    again = ours(default_allowance=10, headroom_memory_s=600.0)
    again.seed_map(failed_yesterday_at_18())
    assert grow_after(again, 5000.0, 4, steps=100).allowance_after == 16
    # Off, or where chat is not counted (the pooled p95, which 3 % over meets), it does not cap.
    off = ours(default_allowance=10, map_fail_cap_seed=False)
    off.seed_map(failed_yesterday_at_18())
    assert grow_after(off, 0.0, 4).allowance_after == 32
    pooled = ours(default_allowance=10)
    pooled.seed_map(failed_yesterday_at_18())
    assert grow_after(pooled, 0.0, None).allowance_after == 32


def one_slow_answer_at_18(c: AllowanceController) -> float:
    """Chat at one answer every 5 s (12 a minute, which allows ~0.1 % over the target) for
    seven minutes with 18 batch requests in flight, one of its 84 answers slow."""
    now = 0.0
    for k in range(84):
        c.step(
            ControlInput(
                now,
                (1500.0 if k == 40 else 300.0,),
                gpu=COOL,
                batch_inflight=18,
                batch_queued=30,
                chat_arrivals=1,
                allowance=10,
            )
        )
        now += 5.0
    return now


def test_one_slow_answer_is_a_sure_failure_only_where_asked() -> None:
    """At 12 answers a minute one slow answer in 84 is "sure" by the binomial bar; with
    `map_fail_min_over` = 2 a single answer caps nothing (docs/control.md: laptop-dock-bursts
    held at 1 for a run by one answer)."""
    one = ours(default_allowance=10)
    a = grow_after(one, one_slow_answer_at_18(one), arrivals=1)
    assert a.allowance_after == 16, a.reason
    two = ours(default_allowance=10, map_fail_min_over=2)
    a = grow_after(two, one_slow_answer_at_18(two), arrivals=1)
    assert a.allowance_after == 32, a.reason


@pytest.mark.parametrize("value", [1.0, -0.1])
def test_the_ahead_clock_setting_is_checked(value: float) -> None:
    with pytest.raises(
        ValueError, match=re.escape(f"map_ahead_clock must be in [0, 1) (0: off), got {value}")
    ):
        ControlConfig(target_p95_ms=2000.0, map_ahead_clock=value)
