"""tests/benchmarks/bench_control.py runs the loop as shipped: the gateway holds its slot line."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from llm_watchdog.sim.scenario import load_scenario

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_control.py"


@pytest.fixture
def bench() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("bench_control_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    yield mod
    del sys.modules[spec.name]


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
