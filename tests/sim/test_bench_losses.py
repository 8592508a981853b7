"""tests/benchmarks/bench_losses.py: where the law leaves batch behind a static, by cause."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

import pytest

from llm_watchdog.sim.scenario import load_scenario
from llm_watchdog.sim.virtual import MinuteRow


@pytest.fixture
def bl(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("bench_losses")


def minutes(tokens: Sequence[int]) -> list[MinuteRow]:
    return [
        MinuteRow(60.0 * i, 10, 500.0, 60.0, 1500.0, 0, None, 0, n) for i, n in enumerate(tokens)
    ]


def test_a_reason_reads_the_same_at_every_level(bl: ModuleType) -> None:
    a = "hold 13: p95≈537 ms low, held at the engine's slots a chat burst needs"
    b = "grow 9 → 11: p95≈600 ms low, held at the engine's slots a chat burst needs"
    assert bl.cause(a) == bl.cause(b) == "held at the engine's slots a chat burst needs"
    assert bl.cause("hold 12: p95≈696 ms low, in cooldown after the last change") == (
        "low, in cooldown after the last change"
    )
    assert bl.cause("cut 14 → 5: p95≈1395 ms > 0.9×T; cut from the 6 batch running") == (
        "> N×T; cut from the N batch running"
    )


def test_each_minute_goes_to_the_burst_or_the_decision_in_force_at_its_end(
    bl: ModuleType,
) -> None:
    static = minutes([600, 600, 600, 600, 600, 600])
    law = minutes([600, 300, 0, 300, 480, 660])
    decisions = [
        (10.0, "hold 8: p95≈400 ms low, held at the engine's slots a chat burst needs"),
        (125.0, "cut 8 → 2: chat arriving at 3.0× its usual rate: shed batch"),
        (190.0, "grow 2 → 5: p95≈300 ms < 0.7×T"),
        (300.0, "grow 5 → 11: p95≈300 ms < 0.7×T"),
    ]
    by = bl.losses(static, law, decisions, [(120.0, 180.0)], 360.0)
    # minute 0 (0-60 s): held at the slots, nothing lost; minute 1 (60-120 s): 300 lost under
    # the same hold; minute 2 (120-180 s) starts in the burst: 600; minute 3 (180-240 s):
    # grown at 190 s, 300; minute 4: the grow at 190 s still in force, 120; minute 5 (300-360 s):
    # the law took 60 above the static there
    assert by == pytest.approx(
        {
            "held at the engine's slots a chat burst needs": 300 / 360,
            bl.BURST: 600 / 360,
            "< N×T": (300 + 120 - 60) / 360,
        }
    )
    # every token of the gap is put somewhere
    gap = sum(m.batch_tokens for m in static) - sum(m.batch_tokens for m in law)
    assert sum(by.values()) == pytest.approx(gap / 360)


def test_a_minute_before_any_decision_says_so(bl: ModuleType) -> None:
    by = bl.losses(minutes([100]), minutes([40]), [(90.0, "hold 1: waiting")], [], 60.0)
    assert by == {"before the first decision": 1.0}


def test_bursts_cover_each_burst_and_the_two_minutes_after(bl: ModuleType) -> None:
    s = load_scenario("consumer-warm-room")  # every 900 s for 60 s, 7200 s long
    spans = bl.bursts(s)
    assert spans[0] == (900.0, 900.0 + 60.0 + 120.0)
    assert len(spans) == 7 and spans[-1][0] == 6300.0
    assert bl.bursts(load_scenario("sunny-window-job-grows")) == []  # no bursts there


def test_the_runs_it_takes_from_bench_hindsight_rows(bl: ModuleType, tmp_path: Path) -> None:
    keys = {k: 1.0 for k in ("best_tok_s", "uncapped_x_best", "hindsight_att")}
    keys |= {"hindsight_x_best": 1.0, "hindsight_changes_per_h": 2.0, "hindsight_rounds": 1}
    rows = [
        {"scenario": "a", "seed": 0, "best": 16, "ours_att": 1.0, "ours_x_best": 0.85, **keys},
        {"scenario": "b", "seed": 1, "best": 8, "ours_att": 1.0, "ours_x_best": 0.97, **keys},
        {"scenario": "c", "seed": 2, "best": None, "ours_att": 1.0, "ours_x_best": None, **keys},
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert bl.from_hindsight(path, 0.95) == [("a", 0, 16)]
    assert bl.from_hindsight(path, 1.0) == [("a", 0, 16), ("b", 1, 8)]
    assert bl.by_path("attic-summer").endswith("heldout/attic-summer.toml")
    assert bl.by_path("consumer-warm-room") == "consumer-warm-room"


def test_a_real_run_puts_the_whole_gap_on_its_causes(bl: ModuleType) -> None:
    row = bl.one(("chat-burst", 0, 8, "ours"))
    gap = row["static_tok_s"] - row["law_tok_s"]
    assert sum(row["causes"].values()) == pytest.approx(gap, abs=1e-6)
    assert bl.BURST in row["causes"]  # chat-burst has bursts, and the law sheds in them
    lines = bl.report(row)
    assert lines[0].startswith("chat-burst seed 0: ours ")
    assert "static:8" in lines[0]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["consumer-warm-room"], "give a scenario and --static N"),
        (["consumer-warm-room", "--static", "-1"], "--static is 0 or more"),
        (["consumer-warm-room", "--static", "4", "--form", "aimd"], "--form is ours"),
        (["nope", "--static", "4"], "scenario 'nope' not found"),
    ],
)
def test_bad_input_is_one_line_that_says_what_to_do(
    bl: ModuleType, argv: list[str], says: str
) -> None:
    with pytest.raises(SystemExit) as e:
        bl.main(argv)
    assert str(e.value).startswith("error: ") and says in str(e.value)
    assert "\n" not in str(e.value)


def test_from_rows_with_no_run_under_the_bar_says_so(bl: ModuleType, tmp_path: Path) -> None:
    keys = {k: 1.0 for k in ("best_tok_s", "uncapped_x_best", "hindsight_att", "ours_att")}
    keys |= {"hindsight_x_best": 1.0, "hindsight_changes_per_h": 2.0, "hindsight_rounds": 1}
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"scenario": "a", "seed": 0, "best": 4, "ours_x_best": 1.2, **keys}))
    with pytest.raises(SystemExit, match="no run in .* has ours under 0.95"):
        bl.main(["--from", str(path)])
    with pytest.raises(SystemExit, match="not both"):
        bl.main(["chat-burst", "--from", str(path)])
