"""The project's controllers are known to the heat lab by name."""

from __future__ import annotations

import json

from click.testing import CliRunner

from watchdog.sim.cli import sim
from watchdog.sim.controllers import controller_names


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
    from watchdog.sim.scenario import load_scenario
    from watchdog.sim.virtual import run_virtual

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
