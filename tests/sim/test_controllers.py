"""The project's controllers are known to the heat lab by name."""

from __future__ import annotations

import json

from click.testing import CliRunner

from llm_watchdog.sim.cli import sim
from llm_watchdog.sim.controllers import controller_names


def test_lab_knows_the_project_controllers():
    assert {"ours", "aimd", "gradient2", "static", "none"} <= set(controller_names())


def test_sim_run_with_our_controller_changes_the_allowance():
    out = CliRunner().invoke(
        sim,
        [
            "run",
            "--scenario",
            "consumer-warm-room",
            "--duration",
            "20m",
            "--controller",
            "ours",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["allowance_changes"] > 0


def test_the_lab_shows_chat_arrivals_and_chat_in_flight_as_a_gateway_would():
    from llm_watchdog.sim.scenario import load_scenario
    from llm_watchdog.sim.virtual import run_virtual

    class Watch:
        interval_s = 1.0

        def __init__(self):
            self.seen = []

        def decide(self, now_s, obs):
            self.seen.append(obs)
            return 4

    watch = Watch()
    scenario = load_scenario("chat-burst")
    result = run_virtual(scenario, 900.0, watch, seed=3)
    arrivals = [o.chat_arrivals for o in watch.seen]
    inflight = [o.chat_inflight for o in watch.seen]
    ttfts = sum(len(o.chat_ttfts_ms) for o in watch.seen)
    # every chat request counted as it came; those answered all had a first token by then
    assert sum(arrivals) >= ttfts >= result.chat_requests > 0
    assert sum(arrivals) - ttfts <= max(inflight)
    assert min(inflight) >= 0
    # the burst at 600 s (4x for 2 minutes) shows in the arrivals and the chat in flight
    calm = sum(arrivals[300:420]) / 120
    burst = sum(arrivals[610:730]) / 120
    assert burst > 2.5 * calm
    assert sum(inflight[610:730]) / 120 > 1.5 * sum(inflight[300:420]) / 120


class _Fixed:
    """A controller that holds one allowance, or raises it from `low` to `high` at `at_s`."""

    interval_s = 1.0

    def __init__(self, low, high=None, at_s=None):
        self.low, self.high, self.at_s = low, high, at_s
        self.seen = []

    def decide(self, now_s, obs):
        self.seen.append(obs)
        if self.at_s is not None and now_s >= self.at_s:
            return self.high
        return self.low


def test_every_controller_meets_the_same_chat_with_the_same_seed():
    # Common random numbers: a controller that lets in more batch draws more batch lengths,
    # and that must not move a single chat arrival.
    from llm_watchdog.sim.scenario import load_scenario
    from llm_watchdog.sim.virtual import run_virtual

    scenario = load_scenario("chat-burst")
    few, many = _Fixed(2), _Fixed(16)
    run_virtual(scenario, 600.0, few, seed=5)
    run_virtual(scenario, 600.0, many, seed=5)
    assert [o.chat_arrivals for o in few.seen] == [o.chat_arrivals for o in many.seen]
    assert sum(o.batch_inflight for o in many.seen) > 4 * sum(o.batch_inflight for o in few.seen)
    other = _Fixed(2)
    run_virtual(scenario, 600.0, other, seed=6)
    assert [o.chat_arrivals for o in other.seen] != [o.chat_arrivals for o in few.seen]


def test_the_labs_gateway_ramps_a_raise_as_the_real_one_does():
    from llm_watchdog.gateway.config import DEFAULT_BATCH_RAMP_PER_S
    from llm_watchdog.sim.scenario import load_scenario
    from llm_watchdog.sim.virtual import run_virtual

    scenario = load_scenario("workstation")  # 18 batch streams, 48 slots

    def inflight_after_raise(ramp_per_s):
        ctl = _Fixed(2, 14, at_s=300.0)
        run_virtual(scenario, 330.0, ctl, seed=1, ramp_per_s=ramp_per_s)
        return [o.batch_inflight for o in ctl.seen[300:330]]

    ramped = inflight_after_raise(None)  # the gateway's default
    assert DEFAULT_BATCH_RAMP_PER_S == 0.5
    # the raise is seen at 300 s: one more at once, then one every 2 s
    assert ramped[1] <= 4 and ramped[11] <= 9 and max(ramped) >= 13
    assert all(b - a <= 2 for a, b in zip(ramped, ramped[1:], strict=False))
    at_once = inflight_after_raise(0.0)
    assert at_once[1] >= 12


def test_the_labs_gateway_ramps_a_job_that_starts_into_an_unused_allowance():
    from llm_watchdog.sim.scenario import load_scenario
    from llm_watchdog.sim.virtual import run_virtual

    # No batch for 20 minutes, then a job of 24 streams against an allowance of 12 that
    # stood unused all along: let in as a raise is, not twelve prefills at once.
    scenario = load_scenario("hr-night-cooling-late-batch")

    def inflight_after_start(ramp_idle_s):
        ctl = _Fixed(12)
        run_virtual(scenario, 1230.0, ctl, seed=1, ramp_idle_s=ramp_idle_s)
        return [o.batch_inflight for o in ctl.seen[1199:1230]]

    ramped = inflight_after_start(None)  # the gateway's default
    assert ramped[0] == 0
    assert ramped[2] <= 3 and ramped[11] <= 7 and max(ramped) == 12
    assert all(b - a <= 2 for a, b in zip(ramped, ramped[1:], strict=False))
    at_once = inflight_after_start(0.0)
    assert at_once[0] == 0 and max(at_once[:3]) == 12
