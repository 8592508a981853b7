"""tests/benchmarks/bench_control.py runs the loop as shipped: the gateway holds its slot line."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import ModuleType

import pytest

from llm_watchdog.sim.scenario import load_scenario


@pytest.fixture
def bench(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("bench_control")


def test_the_slot_line_is_held_unless_asked_not_to(bench: ModuleType) -> None:
    assert bench.HOLD_SLOTS is True
    assert bench.parse_args([]).hold_slots is True
    assert bench.parse_args(["--no-hold-slots"]).hold_slots is False
    assert bench.parse_args(["--hold-slots"]).hold_slots is True


def test_ours_knows_the_line_is_held_and_every_controller_runs_under_it(
    bench: ModuleType,
) -> None:
    s = load_scenario("team-arrives-long-outputs")
    ours = bench.make("ours", s).inner.inner
    assert ours.config.serving_slots is True
    # 32 batch streams on 32 slots for five minutes: under the line chat keeps its slots.
    short = dataclasses.replace(s, duration_s=300.0)
    held = bench.run("static:32", short, 0)
    bench.HOLD_SLOTS = False
    assert bench.make("ours", s).inner.inner.config.serving_slots is False
    free = bench.run("static:32", short, 0)
    assert held.chat_p95_ms < free.chat_p95_ms / 4


def _res(sweep: dict[int, tuple[float, float]], alone: float = 1.0) -> dict[str, object]:
    return {
        "sweep": [
            {"controller": f"static:{n}", "att": a, "tok_s": t} for n, (a, t) in sweep.items()
        ],
        "chat_alone_att": alone,
    }


def test_the_static_set_ahead_is_the_largest_that_met_99_percent_at_every_seed(
    bench: ModuleType,
) -> None:
    seeds = [
        _res({1: (1.0, 10.0), 2: (1.0, 20.0), 3: (1.0, 30.0), 4: (0.95, 36.0)}),
        _res({1: (1.0, 12.0), 2: (1.0, 22.0), 3: (0.98, 31.0), 4: (0.9, 35.0)}),
        _res({1: (1.0, 11.0), 2: (0.995, 21.0)}),  # its ladder stopped early: 3 not run
    ]
    assert bench.ahead_static(seeds) == (2, pytest.approx(21.0))
    assert bench.ahead_static(seeds[:1]) == (3, 30.0)
    # No rung met it at every seed: static 0, where chat alone meets it ...
    missed = [_res({1: (0.98, 10.0)}), _res({1: (1.0, 10.0)})]
    assert bench.ahead_static(missed) == (0, 0.0)
    # ... and none where chat alone misses at some seed.
    assert bench.ahead_static([_res({1: (0.98, 10.0)}, alone=0.97), _res({})]) is None


def test_a_scenario_with_no_chat_of_its_own_is_skipped_and_said_so(bench: ModuleType) -> None:
    # heat-and-load's chat is the daemon's canaries, which the lab does not send: no window
    # to judge, and the benchmark says so instead of failing on a missing attainment.
    res = bench.bench("heat-and-load", 0, fast=True)
    assert res == {"scenario": "heat-and-load", "skipped": "no chat of its own: nothing to judge"}
