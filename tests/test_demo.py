"""`llm-watchdog demo` end to end, shortened: heat lab, gateway, batch job, daemon, real HTTP."""

from __future__ import annotations

import pytest

from llm_watchdog.demo import DemoOptions, run_demo, summary


def test_the_summary_says_the_heat_runs_faster_than_the_wall_clock(tmp_path):
    from llm_watchdog.demo import DemoResult

    fast = summary(DemoResult(db_path=tmp_path / "demo.db", time_scale=20))
    real = summary(DemoResult(db_path=tmp_path / "demo.db"))
    (note,) = [line for line in fast if line.strip().startswith("time ")]
    assert "20x fast" in note and "per demo minute" in note
    assert not [line for line in real if line.strip().startswith("time ")]


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_without_control_every_line_shows_the_static_allowance(tmp_path):
    said: list[str] = []
    opts = DemoOptions(
        duration_s=60,
        time_scale=30,
        baseline_probes=20,
        control=False,
        db_path=tmp_path / "demo.db",
    )
    result = run_demo(opts, say=said.append)
    rows = [s for s in said if "batch allowance" in s and "TTFT" in s]
    assert rows and all(s.endswith("batch allowance 4") for s in rows), rows[:3]
    lines = summary(result)
    assert any("batch allowance  4 throughout (--no-control" in line for line in lines), lines
    phases = [line for line in lines if "chat p50" in line]
    assert phases and all(line.endswith("allowance 4..4") for line in phases), phases
