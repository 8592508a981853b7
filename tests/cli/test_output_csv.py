"""`--csv` cells: JSON for structured values, 1/0 for flags, as pandas and spreadsheets read."""

from __future__ import annotations

import csv
import io
import json
import time

from click.testing import CliRunner

from llm_watchdog.cli import cli
from llm_watchdog.cli.output import emit
from llm_watchdog.drift.values import DriftEvent
from llm_watchdog.store.db import Store
from llm_watchdog.store.records import save_event

EVIDENCE = {
    "baseline_batch_inflight": 4.0,
    "clock_load_split": None,
    "throttled": True,
    "reasons": ["sw_thermal", "hw_slowdown"],
}


def csv_rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_drift_csv_writes_the_evidence_as_json_that_reads_back(db_path):
    start = time.time() - 600
    with Store(db_path) as store:
        save_event(
            store,
            DriftEvent(
                id=f"latency-{int(start * 1000)}",
                serial=1,
                kind="latency",
                change="opened",
                start_ts=start,
                end_ts=None,
                cause="thermal",
                baseline_p95_ms=800.0,
                peak_p95_ms=2400.0,
                evidence=EVIDENCE,
                message="chat slowed",
                ts=start,
            ),
            "fp",
        )
    out = CliRunner().invoke(cli, ["drift", "--db", str(db_path), "--since", "1h", "--csv"], obj={})
    assert out.exit_code == 0, out.output
    (row,) = csv_rows(out.output)
    assert json.loads(row["evidence"]) == EVIDENCE
    assert "None" not in row["evidence"] and "True" not in row["evidence"]


def test_csv_flags_are_1_and_0_as_history_writes_them():
    out = io.StringIO()
    emit(
        [{"ok": True, "cold": False, "n": 3, "tags": ["a"], "name": "x"}],
        ["ok", "cold", "n", "tags", "name"],
        "csv",
        out,
    )
    assert out.getvalue().splitlines() == ["ok,cold,n,tags,name", '1,0,3,"[""a""]",x']


def test_the_table_keeps_yes_and_no():
    out = io.StringIO()
    emit([{"ok": True, "cold": False}], ["ok", "cold"], "table", out)
    assert out.getvalue().splitlines()[1].split() == ["yes", "no"]
