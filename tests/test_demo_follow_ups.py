"""The demo's closing commands tell the truth about the run: they name its chat target (not
the config's default 2 s) and run as pasted, also where the venv is not activated."""

from __future__ import annotations

import datetime as dt
import os
import shlex
import sys
import time
from pathlib import Path

from click.testing import CliRunner

from llm_watchdog.cli import cli
from llm_watchdog.cli.lab import invoked_as
from llm_watchdog.demo import DemoResult, summary
from llm_watchdog.store.db import Store
from tests.helpers.builders import probe_result


def ran(tmp_path, target_ms: float | None = 400.0) -> DemoResult:
    now = time.time()
    return DemoResult(
        db_path=tmp_path / "demo.db",
        probes=[(1.0, probe_result(ts=now - 60), None, 4)],
        started_at=now - 61,
        target_p95_ms=target_ms,
    )


def command_line(lines: list[str], label: str) -> list[str]:
    (line,) = [x for x in lines if x.strip().startswith(label)]
    return shlex.split(line.strip()[len(label) :])


def test_every_follow_up_that_judges_chat_names_the_demos_target(tmp_path):
    lines = summary(ran(tmp_path), command="llm-watchdog")
    report = command_line(lines, "draw it")
    room = command_line(lines, "headroom")
    assert report[:2] == ["llm-watchdog", "report"]
    assert report[report.index("--target") + 1] == "400ms"
    assert report[report.index("--db") + 1] == str(tmp_path / "demo.db")
    assert room[:2] == ["llm-watchdog", "headroom"]
    assert room[room.index("--db") + 1] == str(tmp_path / "demo.db")
    assert room[room.index("--target") + 1] == "400ms"
    # The target comes from the run, not from the demo scenario's number written down.
    other = summary(ran(tmp_path, 250.0), command="llm-watchdog")
    assert command_line(other, "draw it")[-3:-2] == ["250ms"]


def test_the_headroom_follow_up_runs_as_printed_against_the_demos_target(tmp_path):
    result = ran(tmp_path)
    with Store(result.db_path) as store:
        store.record_probe(result.probes[0][1], None)
    _, *args = command_line(summary(result), "headroom")
    out = CliRunner().invoke(cli, ["--config", os.devnull, *args], env={}, obj={})
    assert out.exit_code == 0, out.output
    assert "chat p95 TTFT target 400 ms" in out.output
    _, *args = command_line(summary(result), "look closer")
    out = CliRunner().invoke(cli, ["--config", os.devnull, *args], env={}, obj={})
    assert out.exit_code == 0 and "no database" not in out.output, out.output
    report = command_line(summary(result), "draw it")[2:]
    assert report[report.index("--since") + 1].startswith(time.strftime("%Y-"))
    # The report ends where the run did, however long after it is pasted.
    until = report[report.index("--until") + 1]
    assert 0 < dt.datetime.fromisoformat(until).timestamp() - result.probes[-1][1].ts <= 2
    out_file = tmp_path / "demo.html"
    report[report.index("--out") + 1] = str(out_file)
    out = CliRunner().invoke(cli, ["--config", os.devnull, "report", *report], env={}, obj={})
    assert out.exit_code == 0, out.output
    assert "1 windows" in out.output  # the one window with the run's probe, none after it


def test_a_run_with_no_probes_offers_only_what_reads_without_them(tmp_path):
    lines = summary(DemoResult(db_path=tmp_path / "demo.db", target_p95_ms=400.0))
    look = command_line(lines, "look closer")
    assert look == ["llm-watchdog", "drift", "--db", str(tmp_path / "demo.db")]
    assert not [x for x in lines if "report" in x or "--target" in x]


def test_the_command_is_a_path_where_path_does_not_find_this_executable(tmp_path, monkeypatch):
    exe = tmp_path / "venv bin" / "llm-watchdog"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setattr(sys, "argv", [str(exe), "demo"])
    monkeypatch.setenv("PATH", str(tmp_path / "elsewhere"))
    assert shlex.split(invoked_as()) == [str(exe)]
    # Another llm-watchdog on PATH is not this one: the path still.
    other = tmp_path / "elsewhere" / "llm-watchdog"
    other.parent.mkdir()
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    assert shlex.split(invoked_as()) == [str(exe)]
    monkeypatch.setenv("PATH", str(exe.parent))
    assert invoked_as() == "llm-watchdog"


def test_the_command_under_python_dash_m_is_python_dash_m(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/x/llm_watchdog/__main__.py", "demo"])
    assert shlex.split(invoked_as()) == [sys.executable, "-m", "llm_watchdog"]


def test_the_demo_screen_tells_a_warning_from_its_page_and_their_resolutions_apart() -> None:
    # A chat slowdown that opens within the target warns, pages once past it (its own key),
    # and both resolve when it ends: four lines, no two the same.
    from llm_watchdog.daemon.judge import Judge
    from llm_watchdog.demo import _ScreenSink
    from llm_watchdog.drift.values import DriftConfig
    from llm_watchdog.store.db import Store
    from tests.daemon.test_chat_severity import latency_event

    said: list[str] = []
    sink = _ScreenSink(said.append, DemoResult(db_path=Path("demo.db")))

    class Alerts:
        def submit(self, alert) -> None:
            sink.send(alert)

    with Store(":memory:") as store:
        judge = Judge(store, DriftConfig(), Alerts(), target_p95_ms=400.0)
        for p95, change in ((300.0, "opened"), (452.0, "updated"), (452.0, "closed")):
            judge._publish([latency_event(p95, change)])
    assert [line.split(":")[0] for line in said] == [
        "  >> ALERT (warning) chat_slowed",
        "  >> ALERT (critical) chat_slowed",
        "  >> RESOLVED chat_slowed",
        "  >> RESOLVED chat_slowed",
    ]
    assert len(set(said)) == 4, said
    # The page's resolution gives its own words and points at the line above, not the
    # warning's resolution a second time.
    assert said[3] == (
        "  >> RESOLVED chat_slowed: The slowdown that passed the 400 ms target has ended (as above)"
    ), said
    # The summary lists the two that fired, each with its severity.
    result = DemoResult(db_path=Path("demo.db"), alerts=sink.result.alerts)
    listed = [line for line in summary(result) if line.startswith("  alert ")]
    assert [line.split(":")[0].split()[-1] for line in listed] == ["warning)", "critical)"]
