"""tests/benchmarks/bench_hindsight.py: the schedule made in hindsight, the ×best ceiling."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

import pytest

from llm_watchdog.sim.scenario import load_scenario
from llm_watchdog.sim.virtual import MinuteRow, RunResult


@pytest.fixture
def hs(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("bench_hindsight")


SLO = 1000.0


def result(p95s: Sequence[float | None], tokens: Sequence[int]) -> RunResult:
    """A run of one-minute windows: chat p95 and batch tokens per minute."""
    minutes = tuple(
        MinuteRow(60.0 * i, 10, p, 60.0, 1500.0, 0, None, 0, n)
        for i, (p, n) in enumerate(zip(p95s, tokens, strict=True))
    )
    judged = [m for m in minutes if m.t_s >= 120.0 and m.chat_p95_ms is not None]
    met = sum(1 for m in judged if m.chat_p95_ms is not None and m.chat_p95_ms <= SLO)
    return RunResult(
        scenario="s",
        controller="c",
        duration_s=60.0 * len(minutes),
        warmup_s=120.0,
        slo_ttft_ms=SLO,
        chat_requests=10 * len(minutes),
        chat_ttft_p50_ms=None,
        chat_ttft_p95_ms=None,
        chat_ttft_p99_ms=None,
        slo_windows=len(judged),
        slo_attainment=met / len(judged) if judged else None,
        batch_requests=0,
        batch_tokens_per_s=sum(tokens) / (60.0 * len(minutes)),
        batch_chars_per_s=0.0,
        allowance_changes=0,
        final_allowance=None,
        peak_temp_c=60.0,
        throttled_s=0.0,
        thermal_violation_s=0.0,
        power_violation_s=0.0,
        wall_s=0.0,
        minutes=minutes,
    )


def met_everywhere(rungs: Sequence[int], minutes: int) -> dict[int, RunResult]:
    """Static runs that met every window, each rung's tokens a minute its own number."""
    return {n: result([100.0] * minutes, [n] * minutes) for n in rungs}


def as_run(levels: Sequence[int], per_segment: int, p95s: Sequence[float]) -> RunResult:
    """A schedule's run: each minute's tokens the level of its segment."""
    n = len(p95s)
    return result(p95s, [levels[min(i // per_segment, len(levels) - 1)] for i in range(n)])


def test_segments_count_each_window_once_and_leave_the_warmup_out(hs: ModuleType) -> None:
    # Six minutes in two segments of three; the first two minutes are warmup.
    r = result([2000, 2000, 500, 2000, None, 500], [1, 2, 3, 4, 5, 6])
    segs = hs.segments(r, 2, 180.0)
    assert segs == [hs.Segment(missed=0, tokens=6), hs.Segment(missed=1, tokens=15)]


def test_choose_takes_the_most_batch_at_the_fewest_misses_the_segment_allows(
    hs: ModuleType,
) -> None:
    S = hs.Segment
    table = {
        0: [S(0, 0), S(1, 0)],  # chat alone misses a window in the second segment
        4: [S(0, 40), S(1, 30)],
        8: [S(0, 80), S(2, 70)],
        16: [S(1, 160), S(1, 90)],
    }
    levels, floors = hs.choose(table, 2)
    # First: 16 has more batch but misses where 8 does not. Second: the floor is chat
    # alone's one miss, and 16 takes the most batch at it.
    assert levels == [8, 16]
    assert floors == [0, 1]


def test_lower_steps_one_rung_down_and_stops_at_chat_alone(hs: ModuleType) -> None:
    levels = [8, 0]
    assert hs.lower(levels, 0, [0, 2, 4, 8]) and levels == [4, 0]
    assert not hs.lower(levels, 1, [0, 2, 4, 8]) and levels == [4, 0]


def test_the_schedule_holds_each_level_for_its_segment(hs: ModuleType) -> None:
    sched = hs.Schedule([3, 7], 600.0)
    assert [sched.decide(t, None) for t in (0.0, 599.0, 600.0, 9999.0)] == [3, 3, 7, 7]


def test_a_missed_window_lowers_its_segment_and_the_run_goes_again(
    hs: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Statics over four 3-minute segments: 8 met everywhere on its own runs.
    statics = met_everywhere([0, 4, 8], 12)
    tried: list[list[int]] = []

    def fake(s: object, seed: int, levels: Sequence[int], segment_s: float) -> RunResult:
        tried.append(list(levels))
        # Run as a schedule, 8 in the third segment misses its second minute (the heat the
        # segments before left); at 4 it holds.
        p95 = [100.0] * 12
        if levels[2] == 8:
            p95[7] = 5000.0
        return as_run(levels, 3, p95)

    monkeypatch.setattr(hs, "run_schedule", fake)
    s = dataclasses.replace(load_scenario("workstation"), duration_s=720.0)
    r, levels, rounds = hs.hindsight(s, 0, statics, 180.0, 8)
    assert tried == [[8, 8, 8, 8], [8, 8, 4, 8]]
    assert levels == [8, 8, 4, 8] and rounds == 2
    assert r.slo_attainment == 1.0


def test_a_miss_in_a_segments_first_minutes_lowers_the_one_before(
    hs: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The static 8 misses in the third segment, where 4 meets: the plan is 8, 8, 4, 8.
    statics = met_everywhere([0, 4], 12)
    statics[8] = result([100.0] * 7 + [5000.0] + [100.0] * 4, [8] * 12)
    tried: list[list[int]] = []

    def fake(s: object, seed: int, levels: Sequence[int], segment_s: float) -> RunResult:
        tried.append(list(levels))
        # A step down from 8 misses its first minute while the segment before's requests
        # still run.
        p95 = [100.0] * 12
        if levels[1] > levels[2]:
            p95[6] = 5000.0
        return as_run(levels, 3, p95)

    monkeypatch.setattr(hs, "run_schedule", fake)
    s = dataclasses.replace(load_scenario("workstation"), duration_s=720.0)
    r, levels, rounds = hs.hindsight(s, 0, statics, 180.0, 8)
    assert tried == [[8, 8, 4, 8], [8, 4, 4, 8]]
    assert levels == [8, 4, 4, 8] and rounds == 2 and r.slo_attainment == 1.0


def test_the_rounds_run_out_and_the_try_that_met_most_is_kept(
    hs: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    statics = met_everywhere([0, 4, 8], 8)

    def fake(s: object, seed: int, levels: Sequence[int], segment_s: float) -> RunResult:
        # Misses whatever it does: two windows at 8, one below it.
        bad = 2 if levels[0] == 8 else 1
        return as_run(levels, 8, [100.0] * (8 - bad) + [5000.0] * bad)

    monkeypatch.setattr(hs, "run_schedule", fake)
    s = dataclasses.replace(load_scenario("workstation"), duration_s=480.0)
    r, levels, rounds = hs.hindsight(s, 0, statics, 480.0, 3)
    # 8, then 4, then 0, none at 99 %: the first try at one miss is kept over more batch.
    assert levels == [4] and rounds == 2
    assert r.slo_attainment == pytest.approx(5 / 6)


def test_a_real_schedule_runs_in_the_lab_and_changes_once_a_segment(hs: ModuleType) -> None:
    s = dataclasses.replace(load_scenario("workstation"), duration_s=900.0)
    r = hs.run_schedule(s, 0, [2, 6, 2], 300.0)
    assert r.allowance_changes == 2
    seen = [m.allowance for m in r.minutes]
    assert seen[0] == 2 and seen[6] == 6 and seen[-1] == 2
    more = hs.run_schedule(s, 0, [6, 6, 6], 300.0)
    assert more.batch_tokens_per_s > r.batch_tokens_per_s


def row(name: str, seed: int, best: int | None, h: tuple[float, float], o: tuple[float, float]):
    return {
        "scenario": name,
        "seed": seed,
        "best": best,
        "best_tok_s": None if best is None else 100.0,
        "uncapped_att": 0.9,
        "uncapped_x_best": None if best is None else h[1] + 0.05,
        "hindsight_att": h[0],
        "hindsight_x_best": None if best is None else h[1],
        "hindsight_changes_per_h": 3.0,
        "hindsight_rounds": 1,
        "ours_att": o[0],
        "ours_x_best": None if best is None else o[1],
    }


def test_the_summary_counts_the_target_only_where_a_static_meets_it(hs: ModuleType) -> None:
    rows = [
        row("a", 0, 8, (1.0, 1.20), (1.0, 1.05)),
        row("b", 0, 4, (0.995, 1.02), (0.98, 1.30)),
        row("c", 0, None, (0.9, 0.0), (0.93, 0.0)),
    ]
    out = hs.summary(rows)
    # Every stream all the time: a at 1.25, b at 1.07, under the target's 1.10.
    assert out[0].startswith("runs with a best static: 2 of 3;") and out[0].endswith(": 1")
    assert "at ≥ 99 %:   2   ×best mean 1.11, median 1.11   ≥ 1.10 at 99 %:   1" in out[1]
    # ours's 1.30 on b came at 98 %: it does not count towards the target.
    assert "at ≥ 99 %:   1   ×best mean 1.18, median 1.18   ≥ 1.10 at 99 %:   0" in out[2]
    assert out[1].startswith("hindsight") and out[2].startswith("ours")
    assert out[3] == "ours under 0.95 × where the schedule took ≥ 0.95 × at 99 %: 0"
    rows.append(row("d", 1, 6, (0.995, 1.0), (1.0, 0.9)))  # a schedule at 1.0, ours at 0.9
    rows.append(row("e", 1, 6, (0.98, 1.0), (1.0, 0.9)))  # the schedule missed 99 % here
    out = hs.summary(rows)
    assert "under 0.95:   2" in out[2]
    assert out[3] == "ours under 0.95 × where the schedule took ≥ 0.95 × at 99 %: 1 (d)"
    text = "\n".join(hs.table(rows))
    assert "none" in text and "—" in text


def test_rows_kept_by_jsonl_print_again(
    hs: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "rows.jsonl"
    f.write_text(json.dumps(row("a", 0, 8, (1.0, 1.2), (1.0, 1.0))) + "\n")
    hs.main(["--from", str(f)])
    out = capsys.readouterr().out
    assert "a" in out and "runs with a best static: 1 of 1" in out


def test_rows_of_another_benchmark_are_named_not_a_traceback(
    hs: ModuleType, tmp_path: Path
) -> None:
    f = tmp_path / "forms.jsonl"
    f.write_text(json.dumps({"form": "ours", "scenario": "a", "seed": 0, "att": 1.0}) + "\n")
    with pytest.raises(SystemExit) as e:
        hs.main(["--from", str(f)])
    assert str(e.value).startswith("error: ") and "not a row of this benchmark" in str(e.value)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--seeds", "x"], "error: --seeds takes whole numbers"),
        (["--segment-s", "30"], "error: --segment-s is at least 60"),
        (["--rounds", "0"], "error: --rounds is at least 1"),
        (["--scenarios", "no-such-card"], "error: "),
    ],
)
def test_bad_arguments_are_one_line_before_any_run(
    hs: ModuleType, argv: list[str], says: str
) -> None:
    with pytest.raises(SystemExit) as e:
        hs.main(argv)
    msg = str(e.value)
    assert msg.startswith(says) and "\n" not in msg
