"""`llm-watchdog demo` end to end, shortened: heat lab, gateway, batch job, daemon, real HTTP."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from llm_watchdog.demo import DemoOptions, run_demo, summary
from llm_watchdog.nvml.throttle import THERMAL_MASK
from llm_watchdog.store.db import Store


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_demo_runs_the_whole_loop_and_leaves_nothing_running(tmp_path):
    threads_before = {t.name for t in threading.enumerate()}
    said: list[str] = []
    opts = DemoOptions(
        duration_s=110, time_scale=30, baseline_probes=20, db_path=tmp_path / "demo.db"
    )
    result = run_demo(opts, say=said.append)
    lines = summary(result)

    assert len(result.probes) > 50
    assert sum(r.ok for _, r, _, _ in result.probes) >= 0.95 * len(result.probes)
    hot = [
        g
        for _, _, g, _ in result.probes
        if g is not None and g.throttle_reasons and g.throttle_reasons & THERMAL_MASK
    ]
    assert hot, "the fans stop: the card must throttle for heat"
    kinds = {a.kind for a in result.alerts if a.state == "firing"}
    assert kinds & {"heat_warning", "chat_slowed"}, kinds
    assert len({a for _, a in result.allowances}) > 1, "the controller moved the allowance"
    with Store(result.db_path) as store:
        writes = store.rows(
            "SELECT * FROM control_actions WHERE applied = 1 AND "
            "allowance_after != allowance_before"
        )
        verified = store.rows("SELECT * FROM control_actions WHERE verify_kind = 'ok'")
        assert store.rows("SELECT * FROM baselines")
        # Each probe row keeps the batch state it was sent under, for trace export and replay:
        # the allowance the controller held then, in the order the controller moved it. How
        # far it moves (to 0 on a loaded machine, where chat is slower) is the law's to say.
        recorded = [
            r["batch_allowance"]
            for r in store.rows("SELECT batch_allowance FROM probes ORDER BY ts, id")
        ]
        moves = store.rows(
            "SELECT allowance_before, allowance_after FROM control_actions "
            "WHERE applied = 1 ORDER BY ts, id"
        )
    assert recorded == [a for *_, a in result.probes]
    # Only the probes sent before the controller has started carry none.
    first = next(i for i, v in enumerate(recorded) if v is not None)
    held = recorded[first:]
    assert None not in held and first < 0.25 * len(recorded), recorded
    path = [moves[0]["allowance_before"]] + [m["allowance_after"] for m in moves]
    seen = [v for i, v in enumerate(held) if i == 0 or held[i - 1] != v]
    rest = iter(path)
    assert all(v in rest for v in seen), (seen, path)
    assert writes and verified
    assert any("batch allowance" in line for line in lines)
    assert any(str(result.db_path) in line for line in lines)
    (gpu_line,) = [line for line in lines if line.strip().startswith("GPU ")]
    heat = len(hot)  # the probes with a thermal reason: the cap alone is not heat
    assert f"slowed by heat in {heat} of {len(result.probes)} probes" in gpu_line, gpu_line

    # Everything it started is stopped: no server answers, no thread of its own is left.
    url = next(s for s in said if s.startswith("engine ")).split()[1]
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/health", timeout=2)
    time.sleep(0.5)
    leftover = {t.name for t in threading.enumerate()} - threads_before
    assert not {n for n in leftover if not n.startswith(("alerts:", "Thread-"))}, leftover


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
