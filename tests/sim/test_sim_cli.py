"""`sim run`, `sim sweep` and `sim serve` from the command line."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from llm_watchdog.gateway.config import slot_line
from llm_watchdog.sim.cli import held_points, share_text, sim, sweep_points
from llm_watchdog.sim.controllers import (
    ControllerContext,
    Observation,
    StaticAllowance,
    controller_names,
    register_controller,
)
from llm_watchdog.sim.scenario import PLAYED_LIVE, available_scenarios, load_scenario
from llm_watchdog.sim.virtual import run_virtual


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(sim, list(args))
    return result.exit_code, result.output


def test_run_prints_the_figures_a_person_asks_for() -> None:
    code, out = invoke(
        "run", "--scenario", "workstation", "--duration", "10m", "--controller", "static:4"
    )
    assert code == 0, out
    assert "scenario workstation, controller static:4: 10m simulated" in out
    assert "chat TTFT   p50 " in out and " p95 " in out and " p99 " in out
    assert "SLO         p95 ≤ 1,500 ms in " in out
    assert "tokens/s" in out and "allowance   0 changes, final 4" in out
    assert "GPU         peak " in out and "throttled" in out


def test_a_share_just_short_of_99_percent_never_prints_as_99() -> None:
    # Static 2 on hr-fans-stall-twice, seed 0, meets 97 of its 98 windows: 98.98 %, which
    # rounded to the nearest 0.1 % read "99.0 %" next to a target it misses.
    args = ("run", "-s", "hr-fans-stall-twice", "-c", "static:2", "--no-hold-slots")
    code, out = invoke(*args, "--json")
    assert code == 0, out
    doc = json.loads(out)
    assert (doc["slo_windows"], round(doc["slo_attainment"] * doc["slo_windows"])) == (98, 97)
    code, out = invoke(*args)
    assert code == 0, out
    assert "in 97/98 one-minute windows (98.9 %)" in out


@pytest.mark.parametrize(
    ("share", "text"),
    [(None, "-"), (0.0, "0.0 %"), (96 / 97, "98.9 %"), (0.99, "99.0 %"), (1.0, "100.0 %")],
)
def test_share_text_rounds_down(share: float | None, text: str) -> None:
    assert share_text(share) == text


def test_run_json_is_one_object_with_every_figure() -> None:
    code, out = invoke("run", "-s", "workstation", "--duration", "5m", "--json", "--minutes")
    assert code == 0, out
    doc = json.loads(out)
    for key in (
        "chat_ttft_p50_ms",
        "chat_ttft_p95_ms",
        "chat_ttft_p99_ms",
        "slo_attainment",
        "batch_tokens_per_s",
        "allowance_changes",
        "peak_temp_c",
        "throttled_s",
    ):
        assert key in doc
    assert doc["duration_s"] == 300 and len(doc["minutes"]) == 5  # the 5th ends as the run does


def test_run_with_the_slot_line_keeps_batch_off_the_slots_chat_needs() -> None:
    # 32 batch streams on 32 slots: without the line chat waits for a slot behind batch.
    def run(*extra: str) -> dict[str, Any]:
        code, out = invoke(
            "run", "-s", "team-arrives-long-outputs", "--duration", "5m", "-c", "static:32",
            "--json", "--minutes", *extra,
        )  # fmt: skip
        assert code == 0, out
        return json.loads(out)  # type: ignore[no-any-return]

    free, held = run("--no-hold-slots"), run()  # the line is the default, as shipped
    assert (free["slot_line"], held["slot_line"]) == (None, 28)  # 32 - min(4, 32/8)
    assert max(m["batch_inflight"] for m in free["minutes"]) == 32
    assert max(m["batch_inflight"] for m in held["minutes"]) <= 28
    assert held["chat_ttft_p95_ms"] < free["chat_ttft_p95_ms"] / 4
    again = run("--hold-slots")
    assert (again["slot_line"], again["batch_tokens_per_s"]) == (28, held["batch_tokens_per_s"])


def test_the_run_report_says_which_gateway_it_ran_behind() -> None:
    args = ("run", "-s", "workstation", "--duration", "4m", "-c", "static:2")
    code, held = invoke(*args)
    assert code == 0, held
    code, free = invoke(*args, "--no-hold-slots")
    assert code == 0, free
    line = slot_line(load_scenario("workstation").engine.max_running_seqs)
    assert f"batch held under the gateway's slot line {line}" in held.splitlines()[0]
    assert "no slot line at the gateway (--no-hold-slots)" in free.splitlines()[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("run", "-s", "no-such"), "scenario 'no-such' not found"),
        (
            ("run", "-s", "workstation", "--controller", "static:x"),
            "controller 'static' needs a whole number",
        ),
        (("run", "-s", "workstation", "--controller", "magic"), "unknown controller 'magic'"),
        (("run", "-s", "workstation", "--duration", "soon"), "expected a duration like"),
        (("sweep", "-s", "workstation", "--allowances", "a,b"), "give whole numbers"),
    ],
)
def test_usage_errors_exit_2_with_one_line(args: tuple[str, ...], message: str) -> None:
    code, out = invoke(*args)
    assert code == 2
    assert message in out


def test_a_broken_scenario_file_exits_78(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "bad"\n[gpu]\nambient_c = "warm"\n', encoding="utf-8")
    code, out = invoke("run", "-s", str(bad))
    assert code == 78
    assert "bad.toml: key 'gpu.ambient_c': expected a number (°C)" in out


class HalfOnHeat:
    """A plug-in controller: halves the allowance while the card reports thermal slowdown."""

    interval_s = 30.0

    def __init__(self, ceiling: int) -> None:
        self.ceiling = ceiling

    def decide(self, now_s: float, obs: Observation) -> int | None:
        hot = bool((obs.gpu.throttle_reasons or 0) & 0x60)
        return self.ceiling // 2 if hot else self.ceiling


def test_a_registered_controller_runs_by_name() -> None:
    register_controller("half-on-heat", lambda arg, ctx: HalfOnHeat(ctx.max_allowance))
    assert "half-on-heat" in controller_names()
    code, out = invoke("run", "-s", "consumer-warm-room", "--duration", "20m", "-c", "half-on-heat")
    assert code == 0, out
    assert "controller half-on-heat" in out
    assert "final 8" in out  # the card is hot by then: 16 streams halved


def test_a_controller_can_be_named_by_import_path() -> None:
    code, out = invoke(
        "run", "-s", "workstation", "--duration", "5m", "-c", "tests.sim.test_sim_cli:make_fixed:3"
    )
    assert code == 0, out
    assert "controller tests.sim.test_sim_cli:make_fixed:3" in out and "final 3" in out


def make_fixed(arg: str | None, ctx: ControllerContext) -> StaticAllowance:
    return StaticAllowance(int(arg or "1"))


def test_sweep_shows_cool_and_hot_per_allowance() -> None:
    code, out = invoke(
        "sweep", "-s", "consumer-warm-room", "--duration", "20m", "--allowances", "0,8"
    )
    assert code == 0, out
    lines = out.splitlines()
    assert "holds batch under the slot line" in lines[1]
    assert "cool p95" in lines[2] and "hot p95" in lines[2]
    assert lines[3].split()[0] == "0" and lines[4].split()[0] == "8"
    assert "largest allowance within the target: cool " in out


def test_behind_the_line_the_line_stands_in_for_the_points_over_it() -> None:
    points = sweep_points(32)
    assert held_points(points, 28) == [0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 28]
    assert held_points(points, None) == points
    assert held_points(sweep_points(6), 7) == sweep_points(6)  # the demand is under the line
    assert held_points([0, 8], 7) == [0, 7]


def test_sweep_points_cover_the_demand() -> None:
    assert sweep_points(16) == [0, 1, 2, 3, 4, 6, 8, 12, 16]
    assert sweep_points(0) == [0]


@pytest.mark.slow
def test_serve_prints_the_url_and_config_and_stops_on_ctrl_c() -> None:
    code = "from llm_watchdog.sim.cli import sim; sim()"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "serve", "--scenario", "workstation", "--batch-streams", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("heat lab: workstation at http://127.0.0.1:")
        url = first.split(" at ")[1].split()[0]
        lines = [proc.stdout.readline() for _ in range(4)]
        assert lines[0].startswith("point the daemon at it")
        assert lines[2].strip() == f'url = "{url}"'
        assert httpx.get(f"{url}/v1/models", timeout=5).status_code == 200
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=15)
        assert proc.returncode == 0, err
        assert "heat lab stopped" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize(
    "args",
    [
        ("run", "-s", "workstation", "--duration", "0"),
        ("run", "-s", "workstation", "--duration", "0", "--json"),
        ("run", "-s", "workstation", "--duration", "1m"),
        ("run", "-s", "workstation", "--duration", "2m59s"),
        ("sweep", "-s", "workstation", "--duration", "0"),
        ("sweep", "-s", "workstation", "--duration", "1m"),
        ("sweep", "-s", "workstation", "--duration", "2m59s", "--allowances", "0,40"),
        ("sweep", "-s", "workstation", "--duration", "2m59s", "--json"),
    ],
    ids=" ".join,
)
def test_a_run_with_no_window_after_the_warmup_is_a_usage_error(args: tuple[str, ...]) -> None:
    code, out = invoke(*args)
    assert code == 2, out
    assert "leaves no one-minute window after the 2m warm-up" in out
    assert "give --duration 3m or more" in out
    assert "static:" not in out and "note:" not in out and "{" not in out


def test_the_smallest_duration_named_judges_a_window() -> None:
    # The window that ends as the run ends is judged: 3m after a 2m warm-up judges one.
    code, out = invoke("run", "-s", "workstation", "--duration", "3m", "--json")
    assert code == 0, out
    assert json.loads(out)["slo_windows"] == 1
    code, out = invoke("run", "-s", "workstation", "--duration", "59s", "--warmup", "0")
    assert code == 2 and "give --duration 1m or more" in out


def test_every_whole_minute_after_the_warmup_is_judged_the_last_one_too() -> None:
    code, out = invoke("run", "-s", "workstation", "--duration", "10m", "--json", "--minutes")
    assert code == 0, out
    doc = json.loads(out)
    assert doc["slo_windows"] == 8  # minutes 2-3 … 9-10
    assert [m["t_s"] for m in doc["minutes"]][-1] == 540.0
    code, out = invoke("run", "-s", "workstation", "--duration", "10m30s", "--json", "--minutes")
    assert json.loads(out)["slo_windows"] == 8  # the part minute is not judged


def test_run_virtual_refuses_a_zero_duration() -> None:
    with pytest.raises(ValueError, match="duration must be above 0 s"):
        run_virtual(load_scenario("workstation"), 0.0)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("run", "-s", "workstation", "--batch-streams", "-4"), "--batch-streams"),
        (("serve", "-s", "workstation", "--batch-streams", "-1"), "--batch-streams"),
        (("run", "-s", "workstation", "--slo-ms", "-1"), "milliseconds above 0, got -1"),
        (("run", "-s", "workstation", "--slo-ms", "0"), "milliseconds above 0, got 0"),
        (("run", "-s", "workstation", "--slo-ms", "nan"), "milliseconds above 0, got nan"),
        (("run", "-s", "workstation", "--minutes"), "--minutes adds per-minute rows"),
    ],
)
def test_run_refuses_values_that_make_no_run(args: tuple[str, ...], message: str) -> None:
    code, out = invoke(*args)
    assert code == 2, out
    assert message in out and "Traceback" not in out


def test_minutes_with_json_still_adds_the_rows() -> None:
    code, out = invoke("run", "-s", "workstation", "--duration", "4m", "--json", "--minutes")
    assert code == 0, out
    assert len(json.loads(out)["minutes"]) == 4


@pytest.mark.parametrize("text", ["", 'name = "idle"\n[gpu]\nambient_c = 30\n'])
@pytest.mark.parametrize("command", ["run", "sweep"])
def test_a_scenario_file_with_no_base_and_no_traffic_is_refused(
    tmp_path: Path, text: str, command: str
) -> None:
    path = tmp_path / "idle.toml"
    path.write_text(text, encoding="utf-8")
    code, out = invoke(command, "-s", str(path), "--duration", "5m")
    assert code == 78, out
    line = out.strip()
    assert "\n" not in line
    assert line.startswith("llm-watchdog: idle.toml: no traffic: give base = ")
    assert "[traffic.chat] arrivals_per_s and [traffic.batch] streams" in line


@pytest.mark.parametrize("command", ["run", "sweep"])
@pytest.mark.parametrize("name", PLAYED_LIVE)
def test_a_card_the_demo_plays_live_says_so_and_how_to_run_it_here(
    tmp_path: Path, command: str, name: str
) -> None:
    code, out = invoke(command, "-s", name, "--duration", "10m")
    assert code == 78 and "\n" not in out.strip(), out
    assert out.startswith(f"llm-watchdog: {name}: no chat of its own: ")
    assert f"llm-watchdog demo --scenario {name}" in out
    # What the line says to write runs.
    path = tmp_path / "mine.toml"
    path.write_text(
        f'base = "{name}"\n[traffic.chat]\narrivals_per_s = 0.2\n[traffic.batch]\nstreams = 4\n'
    )
    code, out = invoke("run", "-s", str(path), "--duration", "5m", "--json")
    assert code == 0 and json.loads(out)["slo_windows"] == 3, out


def test_only_the_cards_played_live_lack_chat_of_their_own() -> None:
    no_chat = [
        n
        for n in available_scenarios()
        if not load_scenario(n).chat.arrivals_per_s
        and not any(e.chat_arrivals_per_s for e in load_scenario(n).schedule)
    ]
    assert no_chat == sorted(PLAYED_LIVE)
    code, out = invoke("run", "-s", "heat-and-load", "--duration", "10m")
    assert "0/0" not in out


def test_a_file_with_batch_and_no_chat_has_no_chat_to_judge(tmp_path: Path) -> None:
    path = tmp_path / "batch.toml"
    path.write_text('name = "b"\n[traffic.batch]\nstreams = 4\n', encoding="utf-8")
    code, out = invoke("run", "-s", str(path), "--duration", "5m")
    assert code == 78
    assert out.strip() == (
        'llm-watchdog: batch.toml: no chat to judge: give base = "workstation" (or another '
        "bundled scenario) to start from, or [traffic.chat] arrivals_per_s"
    )


def test_a_scenario_file_with_only_a_base_runs_the_bases_traffic(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text('base = "workstation"\n', encoding="utf-8")
    code, out = invoke("run", "-s", str(path), "--duration", "4m")
    assert code == 0, out
    assert "(0 requests)" not in out


def test_demo_help_points_where_the_scenarios_are_listed() -> None:
    from llm_watchdog.cli import cli

    demo_help = CliRunner().invoke(cli, ["demo", "--help"]).output
    assert "`llm-watchdog sim --help` lists them" in " ".join(demo_help.split())
    assert "workstation" in CliRunner().invoke(sim, ["--help"]).output


def test_a_sweep_cell_from_too_few_windows_is_marked_and_never_contradicts_the_answer() -> None:
    # consumer-warm-room spends a few warm minutes at 12 and 16 (the card heats fast): their
    # warm p95 is shown, but cannot count; unmarked, it read as warm holding 16 while the
    # answer said warm ≥ 8.
    code, out = invoke("sweep", "-s", "consumer-warm-room")
    assert code == 0, out
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.lstrip().startswith("allowance"))
    rows = []
    for line in lines[head + 1 :]:
        if not line[:9].strip().isdigit():
            break
        cells = re.split(r"\s{2,}", line.strip())
        rows.append((int(cells[0]), cells[3]))  # allowance, warm p95
    answer = next(line for line in lines if line.startswith("warm "))
    assert answer.startswith("warm    ≥ 8"), answer
    above = [warm for n, warm in rows if n > 8]
    assert above and all(w.startswith("(") and w.endswith(")") for w in above), rows
    assert any("in brackets: from fewer than 5 windows" in line for line in lines)


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_a_duration_past_a_week_is_refused_at_once(command: str) -> None:
    code, out = invoke(command, "-s", "workstation", "--duration", "1000d")
    assert code == 2 and "1000d is longer than the lab runs (7d" in out, out
