"""`sim sweep`: judged on one-minute windows over the whole scenario, up to the peak demand,
and its answer, run as a static allowance with `sim run`, meets the SLO in ≥ 99 % of windows."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from llm_watchdog.sim.cli import find_static, peak_demand, sim, sweep_points
from llm_watchdog.sim.scenario import ScheduleEvent, available_scenarios, load_scenario


def invoke(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(sim, list(args))
    return res.exit_code, res.output


def test_a_batch_job_that_starts_late_is_swept_up_to_what_it_grows_to() -> None:
    sc = load_scenario("workstation")
    late = sc.__class__(
        **{**sc.__dict__, "schedule": (ScheduleEvent(at_s=600.0, batch_streams=24),)}
    )
    assert peak_demand(sc) == sc.batch.streams
    assert peak_demand(late) == 24 and sweep_points(peak_demand(late))[-1] == 24


def test_sweep_json_gives_every_run_then_the_answer_per_state() -> None:
    code, out = invoke("sweep", "-s", "llamacpp-cpu", "--json")
    assert code == 0, out
    lines = [json.loads(line) for line in out.splitlines()]
    runs, answer = lines[:-1], lines[-1]
    assert [r["allowance"] for r in runs][0] == 0
    assert answer["static_allowance"] == 0  # one batch stream already slows chat past 500 ms
    assert answer["states"] and all(
        "allowance" in s and "confidence" in s for s in answer["states"]
    )


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", available_scenarios())
def test_the_sweeps_static_answer_meets_the_slo_in_99_percent_of_windows(name: str) -> None:
    sc = load_scenario(name)
    answer, runs = find_static(sc, sweep_points(peak_demand(sc)))
    assert answer is not None, f"{name}: chat misses the target even without batch"
    code, out = invoke("run", "-s", name, "-c", f"static:{answer}", "--json")
    assert code == 0, out
    got = json.loads(out)
    assert got["duration_s"] == sc.duration_s
    if got["slo_windows"]:
        assert got["slo_attainment"] >= 0.99, (name, answer, got["slo_attainment"])
    else:  # no chat of its own to judge (the demo's chat comes from outside)
        assert sc.chat.arrivals_per_s == 0
