"""`replay`: CSV traces in the replay-trace contract (README), checked whole before replaying."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llm_watchdog.drift import DriftConfig, DriftMonitor
from llm_watchdog.drift.replay import (
    ReplayError,
    events_to_jsonl,
    parse_trace,
    replay_file,
    replay_observations,
)
from tests.helpers.builders import DRIFT_EVENT_KEYS

TRACES = Path(__file__).resolve().parents[2] / "data" / "traces"
HEADER = "ts,ttft_ms,ok,cold,quality_pass,gpu_temp_c,throttle_reasons"


def write(tmp_path: Path, text: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def good_rows(n: int, start: float = 1_700_000_000.0) -> list[str]:
    # A deterministic wobble around 800 ms: no noise generator needed to parse rows.
    return [f"{start + 10 * i:.0f},{800 + (i * 37) % 50},1,0,1,65,0" for i in range(n)]


def test_shipped_heat_soak_trace_replays_to_a_thermal_event_and_a_warning() -> None:
    events = replay_file(TRACES / "heat_soak.csv")
    kinds = {e.kind: e for e in events}
    assert set(kinds) == {"latency", "heat_warning"}
    lat = kinds["latency"]
    assert lat.cause == "thermal" and lat.end_ts is not None
    assert lat.evidence["cause_at_open"] == "thermal"
    assert kinds["heat_warning"].start_ts < lat.start_ts


def test_replay_gives_what_the_daemon_monitor_gives(tmp_path: Path) -> None:
    path = TRACES / "batch_load.csv"
    observations = parse_trace(path)
    mon = DriftMonitor(DriftConfig(), fingerprint_id="replay")
    live = {}
    for o in observations:
        for e in mon.observe(o):
            live[e.id] = e
    replayed = replay_file(path)
    assert [e.to_json() for e in replayed] == [e.to_json() for e in live.values()]
    assert replayed[0].cause == "load"


def test_jsonl_output_is_one_contract_object_per_event(tmp_path: Path) -> None:
    # Baseline, then a step that is still open when the trace ends: end_ts is null.
    rows = good_rows(400)
    last = 1_700_000_000.0 + 10 * 400
    rows += [f"{last + 10 * i:.0f},{1600 + (i * 37) % 50},1,0,1,65,0" for i in range(60)]
    events = replay_file(write(tmp_path, HEADER + "\n" + "\n".join(rows) + "\n"))
    text = events_to_jsonl(events)
    lines = text.splitlines()
    assert text.endswith("\n") and len(lines) == len(events) == 1
    doc = json.loads(lines[0])
    assert tuple(doc) == DRIFT_EVENT_KEYS
    assert doc["kind"] == "latency" and doc["end_ts"] is None and doc["cause"] == "unknown"
    assert doc["peak_p95_ms"] > 1.5 * doc["baseline_p95_ms"]
    assert events_to_jsonl([]) == ""


@pytest.mark.parametrize(
    ("row", "says"),
    [
        ("1700009999,abc,1,0,1,65,0", "ttft_ms 'abc' is not a number"),
        ("1700009999,800,yes please,0,1,65,0", "ok 'yes please' is not 0 or 1"),
        (",800,1,0,1,65,0", "ts is empty"),
        ("1700009999,800,1,0", "expected 7 fields, found 4"),
        ("1600000000,800,1,0,1,65,0", "ts 1600000000 is earlier than the row before (1700004490)"),
        ("1700009999,800,1,0,1,65,0x2G", "throttle_reasons '0x2G' is not an integer bitmask"),
        ("1700009999,-5,1,0,1,65,0", "ttft_ms '-5' is below 0"),
        ("1700009999,nan,1,0,1,65,0", "ttft_ms 'nan' is not a finite number"),
    ],
)
def test_a_bad_row_is_named_by_line_and_nothing_is_replayed(
    tmp_path: Path, row: str, says: str
) -> None:
    rows = good_rows(500)
    rows.insert(450, row)  # after the baseline: a streaming replay would have printed events
    path = write(tmp_path, HEADER + "\n" + "\n".join(rows) + "\n")
    with pytest.raises(ReplayError) as err:
        replay_file(path)
    assert err.value.line == 452  # header is line 1, the 450 good rows lines 2..451
    message = str(err.value)
    assert f"{path}: 1 bad row, nothing replayed: line 452: {says}" in message
    assert message.endswith("fix the rows and run replay again")
    assert "\n" not in message


def test_many_bad_rows_are_listed_together(tmp_path: Path) -> None:
    rows = good_rows(20)
    for at in (3, 6, 9, 12, 15, 18, 19):
        rows[at] = rows[at].replace(",1,0,1,", ",1,x,1,")
    with pytest.raises(ReplayError) as err:
        parse_trace(write(tmp_path, HEADER + "\n" + "\n".join(rows) + "\n"))
    assert err.value.lines == [5, 8, 11, 14, 17, 20, 21]
    assert "7 bad rows" in str(err.value) and "(and 2 more)" in str(err.value)
    assert "line 5: cold 'x' is not 0 or 1" in str(err.value)


@pytest.mark.parametrize(
    ("text", "says", "line"),
    [
        ("", "empty file; a trace starts with a header row", None),
        ("ts,latency\n1,2\n", "line 1: header lacks ttft_ms", 1),
        ("ts,ttft_ms,ts\n1,2,3\n", "column ts appears twice", 1),
    ],
)
def test_a_bad_header_is_one_line(tmp_path: Path, text: str, says: str, line: int | None) -> None:
    with pytest.raises(ReplayError, match=says) as err:
        parse_trace(write(tmp_path, text))
    assert err.value.line == line


def test_missing_file_and_binary_file(tmp_path: Path) -> None:
    with pytest.raises(ReplayError, match="no such file; check the path"):
        parse_trace(tmp_path / "nope.csv")
    bad = tmp_path / "bin.csv"
    bad.write_bytes(b"ts,ttft_ms\n\xff\xfe,1\n")
    with pytest.raises(ReplayError, match="not UTF-8 text"):
        parse_trace(bad)


def test_optional_columns_may_be_missing_or_empty(tmp_path: Path) -> None:
    text = (
        "\ufeffts,ttft_ms,throttle_reasons,extra_note\n"  # BOM, an unknown column: ignored
        "1700000000,900,0x20,hello\n"
        "\n"
        "1700000010,,,\n"  # failed probe, no telemetry
        "1700000020,800,4,\n"
        "1700001000,810,,\n"  # after 16 min idle
    )
    obs = parse_trace(write(tmp_path, text))
    assert [o.ok for o in obs] == [True, False, True, True]
    assert obs[0].throttle_reasons == 0x20 and obs[2].throttle_reasons == 4
    assert obs[1].ttft_ms is None and obs[1].gpu_temp_c is None
    # No `cold` column: cold starts are classified the daemon's way.
    assert [o.cold for o in obs] == [True, False, False, True]


def test_replay_observations_reports_every_snapshot(tmp_path: Path) -> None:
    seen = []
    obs = parse_trace(TRACES / "batch_load.csv")
    final = replay_observations(obs, on_event=seen.append)
    assert seen[0].change == "opened" and seen[-1].change == "closed"
    assert len(final) == 1 and final[0].id == seen[0].id


def test_a_trace_with_the_waits_of_timed_out_canaries_replays_them_as_slow(tmp_path: Path) -> None:
    # Baseline, then every canary waits out a 30 s first-token timeout: without the column
    # these are failures only; with it, chat slowed too.
    answered = [f"{r}," for r in good_rows(300)]
    waited = [f"{1_700_000_000 + 10 * i},,0,0,,65,0,30000" for i in range(300, 330)]
    rows = [f"{HEADER},ttft_over_ms", *answered, *waited]
    with_waits = write(tmp_path, "\n".join(rows) + "\n")
    assert {e.kind for e in replay_file(with_waits)} == {"latency", "probes_failing"}
    cut = [r.rsplit(",", 1)[0] for r in rows]
    without = write(tmp_path, "\n".join(cut) + "\n", "old.csv")
    assert {e.kind for e in replay_file(without)} == {"probes_failing"}
