"""Properties of the allowance law over any sequence of readings the daemon could hand it.

Whatever the chat TTFTs, GPU readings, gateway counts and read-back allowance, each step
gives a decision the daemon can write and store: within [floor, ceiling], a kind that says
which way it moved, one line of reason, inputs that serialise as JSON (SQLite stores them so),
and no growth past the batch job's demand where the gateway reports it (issue 14). Marked
slow, as the other property tests: the CI tier runs 10,000 sequences.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llm_watchdog.control.law import (
    KINDS,
    AllowanceController,
    ControlConfig,
    ControlInput,
    GpuState,
)
from llm_watchdog.nvml.throttle import GPU_IDLE, HW_SLOWDOWN, SW_POWER_CAP, SW_THERMAL_SLOWDOWN

pytestmark = pytest.mark.slow

REASON_BITS = (0, GPU_IDLE, SW_POWER_CAP, SW_THERMAL_SLOWDOWN, HW_SLOWDOWN)


@st.composite
def configs(draw: st.DrawFn) -> ControlConfig:
    ceiling = draw(st.integers(0, 128))
    floor = draw(st.integers(0, min(ceiling, 4)))
    return ControlConfig(
        target_p95_ms=draw(st.sampled_from([50.0, 400.0, 2000.0, 10_000.0])),
        floor=floor,
        ceiling=ceiling,
        default_allowance=draw(st.integers(floor, ceiling)),
        engine_slots=draw(st.sampled_from([0, 1, 4, 32, 256])),
        serving_slots=draw(st.booleans()),
        serving_ramps=draw(st.booleans()),
        slot_peak_s=draw(st.sampled_from([0.0, 60.0])),
        max_grows_per_h=draw(st.sampled_from([0.0, 10.0])),
        surge_level_minutes=draw(st.sampled_from([0, 5])),
        freeze=draw(st.sampled_from(["throttled", "falling", "off"])),
        # Short so that a sequence of a few dozen steps reaches past them.
        drain_time_s=draw(st.sampled_from([0.0, 5.0, 20.0])),
        grow_cooldown_s=draw(st.sampled_from([0.0, 15.0])),
        surge_warmup_s=draw(st.sampled_from([0.0, 60.0])),
        headroom_dwell_s=draw(st.sampled_from([0.0, 10.0])),
        min_samples=draw(st.sampled_from([1, 5])),
        window_min_samples=draw(st.sampled_from([1, 10])),
    )


maybe_mhz = st.none() | st.integers(0, 3000).map(float)  # NVML gives whole MHz
gpu_states = st.none() | st.builds(
    GpuState,
    throttle_reasons=st.none()
    | st.lists(st.sampled_from(REASON_BITS), max_size=3).map(lambda bits: sum(set(bits)))
    | st.integers(0, 2**32 - 1),
    sm_clock_mhz=maybe_mhz,
    sm_clock_max_mhz=maybe_mhz,
    temp_c=st.none() | st.floats(-10.0, 130.0, allow_nan=False),
    temp_slowdown_c=st.none() | st.floats(0.0, 130.0, allow_nan=False),
)
counts = st.none() | st.integers(0, 40) | st.integers(0, 600)


@dataclass(frozen=True)
class Reading:
    dt_s: float
    ttft_shares: tuple[float, ...]  # of the target
    failed: int
    gpu: GpuState | None
    unused: int | None  # batch in flight is the allowance less this; None: not known
    allowance_shift: int | None  # the read-back: the last decision moved by this, or None
    chat_arrivals: int | None
    chat_inflight: int | None
    batch_queued: int | None


def readings(calm: float) -> st.SearchStrategy[Reading]:
    """Chat TTFTs as shares of the target around this sequence's `calm` share (a card far
    under its target, near it or over it), and now and then one far off: rounded to
    nothing, or a first-token timeout's wait."""
    near = st.floats(0.7 * calm, 1.4 * calm, allow_nan=False)
    far = st.sampled_from([0.0, 1e-6, 50.0, 2000.0])
    # Hypothesis favours no branch's odds: a draw of 0-99 keeps the far ones rare.
    shares = st.tuples(st.integers(0, 99), near, far).map(lambda t: t[1] if t[0] < 97 else t[2])
    return st.builds(
        Reading,
        dt_s=st.sampled_from([0.0, 0.5, 2.0, 2.0, 2.0, 30.0, 700.0]),
        ttft_shares=st.lists(shares, max_size=6).map(tuple),
        failed=st.integers(0, 99).map(lambda n: 0 if n < 95 else n % 3 + 1),
        gpu=gpu_states,
        unused=st.none() | st.integers(-2, 3) | st.integers(-600, 600),
        allowance_shift=st.none() | st.sampled_from([0, 0, 0, -3, 1, 500]),
        chat_arrivals=counts,
        chat_inflight=counts,
        batch_queued=counts,
    )


sequences = st.floats(0.05, 1.5).flatmap(
    lambda calm: st.lists(readings(calm), min_size=1, max_size=60)
)


@given(configs(), sequences)
def test_every_decision_is_one_the_daemon_can_write_and_store(
    config: ControlConfig, steps: list[Reading]
) -> None:
    law = AllowanceController(config)
    now, last = 1000.0, config.default_allowance
    for r in steps:
        now += r.dt_s
        read_back = None if r.allowance_shift is None else max(0, last + r.allowance_shift)
        # A job that fills its allowance runs about that much; one with less to do, less.
        inflight = None if r.unused is None else max(0, last - r.unused)
        inp = ControlInput(
            now_s=now,
            chat_ttfts_ms=tuple(share * config.target_p95_ms for share in r.ttft_shares),
            failed_canaries=r.failed,
            gpu=r.gpu,
            batch_inflight=inflight,
            allowance=read_back,
            chat_arrivals=r.chat_arrivals,
            chat_inflight=r.chat_inflight,
            batch_queued=r.batch_queued,
        )
        action = law.step(inp)
        level = min(max(action.allowance_before, config.floor), config.ceiling)
        after = action.allowance_after
        assert config.floor <= after <= config.ceiling, action
        assert action.kind in KINDS
        if action.kind == "grow":
            assert after > level, action
        elif action.kind in ("cut", "halve"):
            assert after < level, action
        else:
            assert after == level, action
        if action.kind == "grow" and inflight is not None and r.batch_queued is not None:
            # Room the batch job does not ask for is never handed out (the floor aside).
            assert after <= max(config.floor, inflight + r.batch_queued), action
        assert action.reason.startswith(action.kind) and "\n" not in action.reason
        assert action.p95_est_ms is None or math.isfinite(action.p95_est_ms)
        json.dumps(action.inputs, allow_nan=False)
        last = after
