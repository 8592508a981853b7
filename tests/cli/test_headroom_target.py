"""`llm-watchdog headroom --target` reads a duration (400ms, 1.5s) as `report --target` does,
and a plain number as milliseconds."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from llm_watchdog.cli import cli
from llm_watchdog.store.db import Store
from tests.helpers.history import fill_headroom_history as fill


def targets(db_path, *args: str) -> set[float]:
    out = CliRunner().invoke(
        cli,
        ["headroom", "--since", "3h", "--json", *args],
        env={"LLM_WATCHDOG__STORAGE__PATH": str(db_path)},
        obj={},
    )
    assert out.exit_code == 0, out.output
    return {json.loads(line)["target_ms"] for line in out.output.splitlines()}


@pytest.mark.parametrize(
    ("given", "ms"), [("400ms", 400.0), ("1.5s", 1500.0), ("1000", 1000.0), ("250.5", 250.5)]
)
def test_headroom_target_takes_a_duration_or_plain_milliseconds(db_path, given, ms):
    with Store(db_path) as store:
        fill(store, time.time())
    assert targets(db_path, "--target", given) == {ms}


@pytest.mark.parametrize("given", ["0.5", "0ms", "soon", "-3s"])
def test_headroom_target_below_a_millisecond_or_unreadable_is_a_usage_error(db_path, given):
    with Store(db_path):
        pass
    out = CliRunner().invoke(
        cli,
        ["headroom", "--target", given],
        env={"LLM_WATCHDOG__STORAGE__PATH": str(db_path)},
        obj={},
    )
    assert out.exit_code == 2, out.output
    assert "--target" in out.output and "Traceback" not in out.output


def test_without_target_the_daemons_own_target_is_used_and_named(db_path):
    """A database from a daemon steering by 400 ms, read where the config says 2 s (the
    demo's, another box's): the map is judged by 400 ms, and both commands say whose."""
    from llm_watchdog.control.law import ControlAction
    from llm_watchdog.store.control import action_row, record_action

    now = time.time()
    with Store(db_path) as store:
        fill(store, now)
        assert targets(db_path) == {2000.0}  # no decision stored: the config's
        for i, target in enumerate((1000.0, 400.0)):
            action = ControlAction(now - 60 + i, 4, 4, "hold 4", {"target_p95_ms": target})
            record_action(store, action_row(action, ts=now - 60 + i))
    assert targets(db_path) == {400.0}  # the newest decision's
    assert targets(db_path, "--target", "1.5s") == {1500.0}

    def say(*args: str) -> str:
        out = CliRunner().invoke(
            cli, list(args), env={"LLM_WATCHDOG__STORAGE__PATH": str(db_path)}, obj={}
        )
        assert out.exit_code == 0, out.output
        return out.output

    assert "target 400 ms (the daemon's)" in say("headroom", "--since", "3h")
    row = next(line for line in say("status").splitlines() if line.startswith("headroom"))
    assert row.endswith("; against the 400 ms target (the daemon's)"), row
    row = next(line for line in say("status", "--target", "2s").splitlines() if "headroom" in line)
    assert row.endswith("; against the 2.0 s target (given)"), row
    status = json.loads(say("status", "--json"))["headroom"]
    assert (status["target_ms"], status["target_from"]) == (400.0, "the daemon's")
    # report too: its target line and its misses are the daemon's 400 ms, not 2 s.
    from llm_watchdog.cli.report import _from_store

    class Ctx:
        obj: dict[str, object] = {}

    rep = _from_store(Ctx(), str(db_path), now - 3 * 3600, now, None, None, 2000.0)  # type: ignore[arg-type]
    assert rep.target_p95_ms == 400.0
    rep = _from_store(Ctx(), str(db_path), now - 3 * 3600, now, None, 1500.0, 2000.0)  # type: ignore[arg-type]
    assert rep.target_p95_ms == 1500.0


def test_the_table_says_what_puts_a_probe_in_each_state(db_path):
    # The bands of a row are its probes' and overlap (warm at 46 °C, held under 0.97 of its
    # clock): the rule is printed above the rows.
    from llm_watchdog.control.headroom import HOT_CLOCK_RATIO, STATE_RULE, WARM_CLOCK_RATIO

    with Store(db_path) as store:
        fill(store, time.time())
    out = CliRunner().invoke(
        cli,
        ["headroom", "--since", "3h"],
        env={"LLM_WATCHDOG__STORAGE__PATH": str(db_path)},
        obj={},
    )
    assert out.exit_code == 0, out.output
    assert f"states: {STATE_RULE}" in out.output.splitlines()
    assert (
        f"under {HOT_CLOCK_RATIO:.2f}" in STATE_RULE
        and f"under {WARM_CLOCK_RATIO:.2f}" in STATE_RULE
    )


def test_headroom_lists_as_csv_and_stops_at_until(db_path):
    import csv
    import io

    now = time.time()
    with Store(db_path) as store:
        fill(store, now)

    def run(*args: str) -> str:
        out = CliRunner().invoke(
            cli, ["headroom", *args], env={"LLM_WATCHDOG__STORAGE__PATH": str(db_path)}, obj={}
        )
        assert out.exit_code == 0, out.output
        return out.output

    listed = [json.loads(line) for line in run("--since", "3h", "--json").splitlines()]
    rows = list(csv.DictReader(io.StringIO(run("--since", "3h", "--csv"))))
    assert [r["state"] for r in rows] == [d["state"] for d in listed] and rows
    assert [int(r["n"]) for r in rows] == [d["n"] for d in listed]
    assert json.loads(rows[0]["groups"]) == listed[0]["groups"]  # a JSON cell
    # --until before every probe: nothing to judge, and the span says so.
    early = run("--since", "3h", "--until", "179m")
    assert "until 179m" in early.splitlines()[0]
    assert "not enough data yet" in early
