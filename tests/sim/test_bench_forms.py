"""tests/benchmarks/bench_forms.py: forms of the law side by side, as docs/control.md's tables."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture
def forms(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("bench_forms")


def row(form: str, scenario: str, seed: int, missed: int, tok: float, chg: float) -> dict:
    att = 1.0 - missed / 100.0
    return {
        "form": form,
        "scenario": scenario,
        "seed": seed,
        "att": att,
        "missed": missed,
        "tok_s": tok,
        "changes_per_h": chg,
    }


def test_every_scenario_with_chat_of_its_own_held_out_ones_too(forms: ModuleType) -> None:
    names = forms.scenarios()
    assert len(names) == 22
    assert names[0] == "consumer-warm-room"
    held = [n for n in names if n.endswith(".toml")]
    assert [forms.short(n) for n in held] == [
        "attic-summer",
        "case-door-closed",
        "closet-ac-fails",
        "office-tight-target",
        "rack-fan-wall-fails",
    ]


def test_the_summary_counts_against_the_first_form_run_by_run(forms: ModuleType) -> None:
    rows = [
        row("ours", "a", 0, 0, 100.0, 10.0),
        row("ours", "a", 1, 2, 100.0, 40.0),
        row("ours:x=1", "a", 0, 0, 100.0, 10.0),  # the same run
        row("ours:x=1", "a", 1, 0, 150.0, 20.0),  # one missed less, half as much batch again
    ]
    head, base, other = forms.summary(rows)
    assert head.split()[:4] == ["form", "runs", "≥99%", "missed"]
    # runs, met 99 %, missed, mean changes/h, runs over 30, mean tok/s, same, ratio lo / hi
    assert base.split() == ["ours", "2", "1", "2", "25.0", "1", "100.0", "2", "1.00", "/", "1.00"]
    assert other.split() == [
        "ours:x=1",
        "2",
        "2",
        "0",
        "15.0",
        "0",
        "125.0",
        "1",
        "1.00",
        "/",
        "1.50",
    ]
    lines = forms.per_scenario(rows)
    assert lines[1].split() == ["a", "2;", "100.0;", "40", "|", "0;", "125.0;", "20"]


def test_rows_kept_by_jsonl_are_summarized_again_and_a_bad_line_named(
    forms: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kept = tmp_path / "rows.jsonl"
    kept.write_text(json.dumps(row("ours", "a", 0, 2, 90.0, 5.0)) + "\n\n")
    forms.main(["--from", str(kept)])
    assert capsys.readouterr().out.splitlines()[1].split()[:4] == ["ours", "1", "0", "2"]
    kept.write_text(json.dumps(row("ours", "a", 0, 1, 90.0, 5.0)) + "\n{not json\n")
    with pytest.raises(SystemExit, match=r"^error: .*rows.jsonl:2: not a JSON row"):
        forms.main(["--from", str(kept)])


def test_a_file_that_cannot_be_read_or_holds_other_rows_is_one_line(
    forms: ModuleType, tmp_path: Path
) -> None:
    with pytest.raises(SystemExit) as e:
        forms.main(["--from", str(tmp_path / "none.jsonl")])
    assert str(e.value).startswith("error: cannot read ") and "\n" not in str(e.value)
    with pytest.raises(SystemExit, match=r"^error: cannot write .*nodir"):
        forms.collect(iter([{"a": 1}]), tmp_path / "nodir" / "rows.jsonl")
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"scenario": "a", "seed": 0}) + "\n")
    with pytest.raises(SystemExit, match=r"^error: .*other.jsonl:1: not a row of this benchmark"):
        forms.main(["--from", str(other)])


def test_a_wrong_form_or_scenario_is_one_line_before_any_run(forms: ModuleType) -> None:
    with pytest.raises(SystemExit, match="forms are of the law"):
        forms.main(["aimd", "--scenarios", "workstation"])
    with pytest.raises(SystemExit, match="expected key=value pairs of ControlConfig fields"):
        forms.main(["ours|ours:nokey=1", "--scenarios", "workstation"])
    with pytest.raises(SystemExit, match="scenario 'nosuch' not found"):
        forms.main(["ours", "--scenarios", "nosuch"])
    with pytest.raises(SystemExit, match="--seeds takes whole numbers"):
        forms.main(["ours", "--seeds", "0,x"])
    with pytest.raises(SystemExit):  # neither forms nor --from
        forms.main([])
