"""`llm-watchdog status` shows the control loop's last decision and the allowance's last
change, read from the `control_actions` rows the steering loop writes to a real store."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from llm_watchdog.cli import cli
from llm_watchdog.cli.output import stamp
from llm_watchdog.control.law import ControlAction
from llm_watchdog.store.control import (
    action_row,
    record_action,
    record_verification,
    verification_row,
)
from llm_watchdog.store.db import Store

NONE_LINE = "control      no decisions recorded (control off, or the daemon has not steered yet)"


def status(db: Path, *args: str) -> Any:
    out = CliRunner().invoke(cli, ["status", "--db", str(db), *args], env={}, obj={})
    assert out.exit_code == 0, out.output
    return out


def control_lines(output: str) -> list[str]:
    lines = output.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("control "))
    return [lines[i], *(x for x in lines[i + 1 : i + 2] if x.startswith(" " * 13))]


def decide(
    store: Store, ts: float, kind: str, before: int, after: int, why: str, **row: Any
) -> int:
    head = f"{kind} {before} → {after}" if after != before else f"{kind} {after}"
    action = ControlAction(ts, before, after, f"{head}: {why}", {"n": 20}, 700.0, kind)
    return record_action(store, action_row(action, ts=ts, **row))


def test_no_decisions_is_one_line_saying_why_there_may_be_none(db_path: Path) -> None:
    Store(db_path).close()
    out = status(db_path)
    assert control_lines(out.output) == [NONE_LINE]
    data = json.loads(status(db_path, "--json").output)
    assert data["control"] == {"last": None, "last_change": None}
    assert {"database", "last_probe", "gpus", "headroom"} <= set(data)  # the old keys stay


def test_the_last_decision_and_the_last_written_change(db_path: Path) -> None:
    now = time.time()
    with Store(db_path) as store:
        cut = decide(
            store,
            now - 1200,
            "cut",
            8,
            4,
            "p95≈900 ms over target 600 ms",
            actuator="gateway http://127.0.0.1:8090",
            applied=True,
            apply_detail="ok",
        )
        record_verification(
            store, cut, verification_row(ts=now - 1100, kind="ok", detail="4 in force")
        )
        # A write that failed leaves 4 in force: it is the last decision, not a change.
        decide(
            store,
            now - 600,
            "grow",
            4,
            5,
            "p95≈300 ms low",
            applied=False,
            apply_detail="gateway http://127.0.0.1:8090: connection refused",
        )
        decide(store, now - 60, "hold", 4, 4, "p95≈420 ms in band")
    out = status(db_path)
    assert control_lines(out.output) == [
        f"control      {stamp(now - 60)}  hold 4: p95≈420 ms in band",
        f"             allowance last changed {stamp(now - 1200)} (20 min ago): cut 8 → 4, "
        "read back: ok",
    ]
    control = json.loads(status(db_path, "--json").output)["control"]
    last, change = control["last"], control["last_change"]
    assert (last["kind"], last["allowance_before"], last["allowance_after"]) == ("hold", 4, 4)
    assert last["ts"] == now - 60 and last["dry_run"] is False and last["applied"] is None
    assert (change["kind"], change["allowance_before"], change["allowance_after"]) == ("cut", 8, 4)
    assert change["ts"] == now - 1200 and change["verify_kind"] == "ok"
    assert "inputs" not in last  # the samples behind a decision are history --control's


def test_a_failed_write_says_so_with_its_error(db_path: Path) -> None:
    now = time.time()
    with Store(db_path) as store:
        decide(
            store,
            now - 30,
            "grow",
            4,
            5,
            "p95≈300 ms low",
            applied=False,
            apply_detail="gateway http://127.0.0.1:8090: connection refused",
        )
    first, second = control_lines(status(db_path).output)
    assert first == (
        f"control      {stamp(now - 30)}  grow 4 → 5, write FAILED (gateway "
        "http://127.0.0.1:8090: connection refused): p95≈300 ms low"
    )
    assert second == "             allowance not changed in the stored decisions"


def test_a_dry_run_is_named_and_changes_nothing(db_path: Path) -> None:
    now = time.time()
    with Store(db_path) as store:
        decide(
            store,
            now - 30,
            "halve",
            8,
            4,
            "a canary failed",
            actuator="gateway http://127.0.0.1:8090",
            apply_detail="dry run: not written",
        )
    first, second = control_lines(status(db_path).output)
    assert (
        first
        == f"control      {stamp(now - 30)}  halve 8 → 4, dry run (not written): a canary failed"
    )
    assert second == (
        "             allowance not changed in the stored decisions; a dry run writes nothing"
    )
    control = json.loads(status(db_path, "--json").output)["control"]
    assert control["last"]["dry_run"] is True and control["last_change"] is None


def test_a_long_reason_is_cut_to_one_line(db_path: Path) -> None:
    now = time.time()
    why = "p95≈900 ms over target 600 ms\nfrom 20 samples; " + "the card is hot " * 20
    with Store(db_path) as store:
        decide(store, now - 30, "cut", 8, 6, why, applied=True, apply_detail="ok")
    first, second = control_lines(status(db_path).output)
    assert len(first) == 120 and first.endswith("…")
    assert "p95≈900 ms over target 600 ms from 20 samples; the card is hot" in first
    assert second.endswith("(30 s ago): cut 8 → 6, not read back yet")
    # The JSON keeps the reason whole.
    last = json.loads(status(db_path, "--json").output)["control"]["last"]
    assert last["reason"] == f"cut 8 → 6: {why}"
