"""`llm-watchdog demo`, shortened: the whole loop over real HTTP, and the heat story told in
order and with the right causes."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import httpx
import pytest

from llm_watchdog.alerts.events import AlertEvent
from llm_watchdog.demo import (
    DemoOptions,
    DemoResult,
    _p95,
    _worst_p95,
    run_demo,
    story,
    summary,
)
from llm_watchdog.nvml.throttle import THERMAL_MASK
from llm_watchdog.store.db import Store

ORDER = ("heat_warning", "throttled", "chat_slowed", "cut", "fans_back", "resolved", "regrown")
# The control loop reads chat's p95 every 2 s and may cut a probe or two before the detector
# confirms the slowdown: the cut must follow the warning, not necessarily the alert.
AFTER = {
    "throttled": "heat_warning",
    "chat_slowed": "throttled",
    "cut": "heat_warning",
    "fans_back": "chat_slowed",
    "resolved": "fans_back",
    # The allowance grows back on chat's p95 against its target once the clocks settle, the
    # event ends on chat against its baseline: both after the fans return, in either order.
    "regrown": "fans_back",
}


@dataclass(frozen=True)
class Told:
    opts: DemoOptions
    result: DemoResult
    said: list[str]
    leftover: set[str]  # threads the demo left running


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Told:
    """One shortened demo (three minutes at 25x: over an hour of the card's time) for the
    tests that read it whole; each run takes minutes of wall time."""
    threads_before = {t.name for t in threading.enumerate()}
    said: list[str] = []
    opts = DemoOptions(
        duration_s=180, time_scale=25, db_path=tmp_path_factory.mktemp("demo") / "demo.db"
    )
    result = run_demo(opts, say=said.append)
    time.sleep(0.5)
    leftover = {t.name for t in threading.enumerate()} - threads_before
    return Told(opts, result, said, leftover)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_demo_warns_before_the_throttle_names_heat_cuts_and_grows_back(demo: Told):
    opts, result = demo.opts, demo.result
    told = story(result)
    steps = [step for _, step, _ in told]
    if not all(s in steps for s in ORDER):
        pytest.fail("steps missing from the story:\n" + "\n".join(summary(result)))
    first = {s: next(t for t, step, _ in told if step == s) for s in ORDER}
    for step, before in AFTER.items():
        assert first[before] <= first[step], (before, step, told)
    assert first["cut"] < first["fans_back"], told
    # The warning names the threshold where the clocks fall, and leads the throttle by at
    # least a minute of the card's time (time_scale seconds of it per demo second).
    warn = next(a for a in result.alerts if a.kind == "heat_warning" and a.state == "firing")
    assert "target temperature 83 °C" in warn.message
    assert (first["throttled"] - first["heat_warning"]) * opts.time_scale >= 60.0
    slow = next(a for a in result.alerts if a.kind == "chat_slowed" and a.state == "firing")
    shares = slow.fields["evidence"].get("cause_shares") or {}
    assert slow.cause == "thermal" or max(shares, key=shares.get, default="") == "thermal"
    resolved = next(a for a in result.alerts if a.key == slow.key and a.state == "resolved")
    assert "back to" in resolved.message  # says what ended it
    lines = summary(result)
    assert "  what happened, in order" in lines


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_demo_runs_the_whole_loop_and_leaves_nothing_running(demo: Told):
    result, said = demo.result, demo.said
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
    leftover = demo.leftover
    assert not {n for n in leftover if not n.startswith(("alerts:", "Thread-"))}, leftover


def test_the_cut_line_names_each_change_before_the_allowance_grew_back(tmp_path):
    # The first cut after the warning is 4 → 3 at 68 s; the allowance goes back to 4, then
    # down to 1 at 101 s, and grows 1 → 4 at 149 s, after the fans are back.
    warn = AlertEvent("drift:heat_warning:1", "heat_warning", "firing", 1047.0, "t", "warming")
    allowances = [(0.0, 4), (30.0, 3), (40.0, 4), (68.0, 3), (80.0, 4), (90.0, 2), (101.0, 1)]
    result = DemoResult(
        db_path=tmp_path / "demo.db",
        alerts=[warn],
        allowances=[*allowances, (149.0, 4), (170.0, 0)],
        phases=[("air 32 °C", 0.0, 45.0), ("air 76 °C", 45.0, 120.0), ("air 32 °C", 120.0, 270.0)],
        started_at=1000.0,
    )
    told = {step: (t, detail) for t, step, detail in story(result)}
    # The 30 s cut came before the warning; the 0 at 170 s after the regrowth.
    assert told["cut"] == (68.0, "batch allowance 4 → 3, then 4 at 80s, 2 at 90s, 1 at 101s")
    assert told["regrown"] == (149.0, "batch allowance 1 → 4")
    # A cut that is the lowest point says no more than the cut.
    result.allowances = [(0.0, 4), (68.0, 2), (149.0, 4)]
    told = {step: (t, detail) for t, step, detail in story(result)}
    assert told["cut"] == (68.0, "batch allowance 4 → 2")
    # A raise after the fans are back that comes before the first cut leaves the cut alone.
    result.allowances = [(0.0, 4), (125.0, 5), (130.0, 3), (140.0, 2)]
    told = {step: (t, detail) for t, step, detail in story(result)}
    assert told["regrown"] == (125.0, "batch allowance 4 → 5")
    assert told["cut"] == (130.0, "batch allowance 5 → 3, then 2 at 140s")
    # A probe upward while hot is named, not folded into "down to 0" (it is why chat missed
    # its target after the cut); past four changes, their count and the lowest.
    result.allowances = [(0.0, 4), (54.0, 1), (88.0, 2), (96.0, 1), (114.0, 0), (130.0, 1)]
    told = {step: (t, detail) for t, step, detail in story(result)}
    assert told["cut"] == (54.0, "batch allowance 4 → 1, then 2 at 88s, 1 at 96s, 0 at 114s")
    result.allowances = [(0.0, 4), (54.0, 2), *[(60.0 + i, 1 + i % 2) for i in range(6)]]
    told = {step: (t, detail) for t, step, detail in story(result)}
    assert told["cut"] == (54.0, "batch allowance 4 → 2, then 6 changes, down to 1 at 60s")


def test_the_story_names_the_moment_chat_passed_its_target(tmp_path):
    warn = AlertEvent("drift:heat_warning:1", "heat_warning", "firing", 1047.0, "t", "warming")
    slow = AlertEvent(
        "drift:chat_slowed:9", "chat_slowed", "firing", 1056.0, "t", "slowed, within", "thermal",
        severity="warning",
    )  # fmt: skip
    page = AlertEvent(
        "drift:chat_slowed:9:over_target", "chat_slowed", "firing", 1093.0, "t",
        "p95 477 ms, over the 400 ms target", "thermal", severity="critical",
    )  # fmt: skip
    result = DemoResult(
        db_path=tmp_path / "demo.db",
        alerts=[warn, slow, page],
        allowances=[(0.0, 4), (54.0, 1)],
        phases=[("air 32 °C", 0.0, 45.0), ("air 76 °C", 45.0, 120.0), ("air 32 °C", 120.0, 210.0)],
        started_at=1000.0,
    )
    told = [(t, step) for t, step, _ in story(result)]
    assert (93.0, "over_target") in told
    assert told.index((56.0, "chat_slowed")) < told.index((93.0, "over_target"))
    details = {step: detail for _, step, detail in story(result)}
    assert details["over_target"] == "(thermal) p95 477 ms, over the 400 ms target"
    # A slowdown that opens over its target pages at once: one step, not two.
    result.alerts = [warn, page]
    assert [step for _, step, _ in story(result)].count("over_target") == 0


def test_the_regrown_line_says_how_far_the_allowance_grew_back(tmp_path):
    warn = AlertEvent("drift:heat_warning:1", "heat_warning", "firing", 1046.0, "t", "warming")
    result = DemoResult(
        db_path=tmp_path / "demo.db",
        alerts=[warn],
        allowances=[(0.0, 4), (54.0, 1), (68.0, 0), (124.0, 1), (140.0, 4), (150.0, 3)],
        phases=[("air 32 °C", 0.0, 45.0), ("air 76 °C", 45.0, 120.0), ("air 32 °C", 120.0, 210.0)],
        started_at=1000.0,
    )
    told = {step: (t, detail) for t, step, detail in story(result)}
    # "4 → 1 → 0 → 1 → 4": the story said "regrown 0 → 1" and stopped there.
    assert told["regrown"] == (124.0, "batch allowance 0 → 1, up to 4 at 140s")


def test_a_phase_row_names_its_worst_ten_seconds_beside_its_p95():
    # Heat slows chat for the seconds before the cut, then batch at 0 makes it fast: the
    # phase's p95 alone reads as a fast phase.
    slow = [(45.0 + i, 400.0) for i in range(5)]
    fast = [(53.0 + i * 0.5, 60.0) for i in range(120)]
    assert _p95([ms for _, ms in slow + fast]) == 60.0
    assert _worst_p95(slow + fast) == 400.0
    assert _worst_p95([(0.0, 30.0), (1.0, 50.0), (12.0, 40.0)]) == 50.0  # windows from 0 s


def test_a_phase_row_names_the_median_the_slower_clock_moves(tmp_path):
    from tests.helpers.builders import probe_result

    cool = [(float(t), probe_result(1000.0 + t, ttft_ms=40.0), None, 4) for t in range(0, 45)]
    hot = [(float(t), probe_result(1000.0 + t, ttft_ms=80.0), None, 0) for t in range(45, 120)]
    result = DemoResult(
        db_path=tmp_path / "demo.db",
        probes=[*cool, *hot],
        phases=[("air 32 °C", 0.0, 45.0), ("air 76 °C", 45.0, 120.0)],
        started_at=1000.0,
    )
    rows = [line for line in summary(result) if "chat p50" in line]
    assert len(rows) == 2
    assert "chat p50   40 ms, p95   40 ms (worst 10 s   40 ms)" in rows[0]
    assert "chat p50   80 ms" in rows[1] and "SM clock median     - MHz" in rows[1]


def test_a_phase_row_reads_the_clock_chat_ran_at_not_an_idle_cards_floor(tmp_path):
    from llm_watchdog.demo import _line as probe_line
    from llm_watchdog.models import GpuSample
    from tests.helpers.builders import probe_result

    def hot(clock: float, reasons: int) -> GpuSample:
        return GpuSample(
            ts=0.0, gpu_index=0, temp_c=84.0, sm_clock_mhz=clock, sm_clock_max_mhz=1950.0,
            power_w=30.0, throttle_reasons=reasons,
        )  # fmt: skip

    # The batch cut to 0: between canaries the hot card idles at its floor, thermal bit on.
    busy, idle = hot(600.0, 0x20), hot(210.0, 0x1 | 0x20)  # SW_THERMAL, + GPU_IDLE
    probes = [
        (float(t), probe_result(1000.0 + t, ttft_ms=60.0), idle if t % 3 else busy, 0)
        for t in range(45, 120)
    ]
    result = DemoResult(
        db_path=tmp_path / "demo.db",
        probes=probes,
        phases=[("air 76 °C", 45.0, 120.0)],
        started_at=1000.0,
    )
    (row,) = [line for line in summary(result) if "chat p50" in line]
    assert "SM clock median   600 MHz" in row, row
    # Each live row says why its clock reads the floor.
    assert "SM  210/1950 MHz" in probe_line(50.0, probes[1][1], idle, 0)
    assert "idle,sw_thermal_slowdown" in probe_line(50.0, probes[1][1], idle, 0)
    assert "idle" not in probe_line(45.0, probes[0][1], busy, 0)
