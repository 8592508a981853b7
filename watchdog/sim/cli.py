"""`llm-watchdog sim …`: the heat lab from the command line.

    sim serve --scenario consumer-warm-room --time-scale 20     real time, real sockets
    sim run   --scenario consumer-warm-room --duration 2h --controller static:4
    sim sweep --scenario consumer-warm-room                     static allowance, per state

A thin layer: the work is in server.py (SimLab) and virtual.py (run_virtual).
"""

from __future__ import annotations

import dataclasses
import json
import math
import signal
import threading
from typing import NoReturn

import click

from llm_watchdog.control.headroom import (
    STATES,
    Group,
    StateRow,
    decide_row,
    describe,
    thermal_state,
)
from llm_watchdog.durations import format_duration, parse_duration
from llm_watchdog.errors import EX_CONFIG
from llm_watchdog.gateway.config import slot_line
from llm_watchdog.nvml.throttle import GPU_IDLE
from llm_watchdog.sim.controllers import ControllerError, controller_names
from llm_watchdog.sim.scenario import (
    PLAYED_LIVE,
    Scenario,
    ScenarioError,
    available_scenarios,
    load_scenario,
)
from llm_watchdog.sim.server import LabError, SimLab
from llm_watchdog.sim.virtual import WINDOW_S, MinuteRow, RunResult, run_virtual
from llm_watchdog.stats import quantile


def _scenario(name: str) -> Scenario:
    try:
        return load_scenario(name)
    except ScenarioError as exc:
        if "not found" in str(exc):
            raise click.BadParameter(str(exc), param_hint="--scenario") from exc
        _config_error(str(exc))


# The longest simulated time one run takes: a day of virtual time is 15-40 s of wall time on
# 2 cores (1000d ran for hours, silent), and past a scenario's last event (hours in) the card
# repeats its last state.
MAX_DURATION_S = 7 * 86400.0


def _duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    if seconds > MAX_DURATION_S and param.name == "duration":
        raise click.BadParameter(
            f"{value} is longer than the lab runs ({format_duration(MAX_DURATION_S)}, minutes "
            "of wall time); after its last event a scenario repeats its last state",
        )
    return seconds


def first_window_end(warmup_s: float) -> float:
    """Where the first one-minute window judged after `warmup_s` ends: windows start on whole
    minutes, and one is judged only when it starts at or after the warm-up."""
    return math.ceil(warmup_s / WINDOW_S) * WINDOW_S + WINDOW_S


def need_a_window(duration_s: float, warmup_s: float, given: bool) -> None:
    """A usage error for a run too short to judge one window after the warm-up: its figures
    would be empty, and a sweep of empty runs would name an allowance it never judged."""
    if duration_s >= first_window_end(warmup_s):
        return
    least = format_duration(first_window_end(warmup_s))
    shown = format_duration(duration_s)
    what = f"--duration {shown}" if given else f"the scenario's {shown}"
    raise click.UsageError(
        f"{what} leaves no one-minute window after the {format_duration(warmup_s)} warm-up "
        f"to judge chat in; give --duration {least} or more"
    )


def need_traffic(sc: Scenario) -> None:
    """`sim run` and `sim sweep` judge chat's TTFT: a scenario with no chat at any time has
    nothing to judge (its figures read "0/0 windows"), and an empty file has no traffic at
    all (the loader's defaults are none). Say what the file lacks, as the loader's errors
    do, and exit as they do."""
    if sc.chat.arrivals_per_s > 0 or any(e.chat_arrivals_per_s for e in sc.schedule):
        return
    where = sc.path.name if sc.path is not None else sc.name
    batch = any(e.batch_streams for e in sc.schedule) or sc.batch.streams > 0
    if sc.name in PLAYED_LIVE:
        _config_error(
            f"{sc.name}: no chat of its own: `llm-watchdog demo --scenario {sc.name}` plays "
            "this card with real chat and batch through a live gateway; to run it here, write "
            f'a file with base = "{sc.name}" and [traffic.chat] arrivals_per_s = 0.2'
            + ("" if batch else ", [traffic.batch] streams = 4")
        )
    what = "no chat to judge" if batch else "no traffic"
    _config_error(
        f'{where}: {what}: give base = "workstation" (or another bundled scenario) to start '
        "from, or [traffic.chat] arrivals_per_s" + ("" if batch else " and [traffic.batch] streams")
    )


def _config_error(message: str) -> NoReturn:
    """A scenario file that cannot be run: one line, exit 78, as every config error."""
    click.echo(f"llm-watchdog: {message}", err=True)
    raise SystemExit(EX_CONFIG)


def _finite_above_zero(
    ctx: click.Context, param: click.Parameter, value: float | None
) -> float | None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise click.BadParameter(f"expected a number of milliseconds above 0, got {value:g}")
    return value


_SCENARIO_HELP = "A bundled scenario name (see `sim --help`) or a .toml path."

# The shipped gateway holds its slot line wherever it knows the engine's slots, and the demo's
# and the benchmark's gateways hold it: the lab runs behind it unless told otherwise.
_hold_slots = click.option(
    "--hold-slots/--no-hold-slots",
    default=True,
    show_default=True,
    help="The lab's gateway holds batch under the engine's slots less a few kept for chat, as "
    "the shipped gateway does (its --engine-slots). --no-hold-slots: no line, as behind "
    "HAProxy or a command actuator.",
)


def line_text(r: RunResult) -> str:
    """Which gateway the run had: the report says so, since the answers differ."""
    if r.slot_line is None:
        return "no slot line at the gateway (--no-hold-slots)"
    return f"batch held under the gateway's slot line {r.slot_line}"


@click.group(name="sim")
def sim() -> None:
    """The heat lab: a simulated GPU and engine, in real or virtual time."""


@sim.command()
@click.option("--scenario", "-s", required=True, help=_SCENARIO_HELP)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=0, show_default=True, type=int, help="Port; 0 picks a free one.")
@click.option(
    "--time-scale",
    default=1.0,
    show_default=True,
    type=float,
    help="Make the card heat (and the schedule run) this many times faster than real time.",
)
@click.option(
    "--batch-streams",
    type=click.IntRange(min=0),
    default=None,
    help="Streams of the lab's own batch job (default: the scenario's).",
)
def serve(
    scenario: str, host: str, port: int, time_scale: float, batch_streams: int | None
) -> None:
    """Serve the simulated engine over HTTP until Ctrl-C."""

    sc = _scenario(scenario)
    if time_scale <= 0:
        raise click.BadParameter("must be > 0", param_hint="--time-scale")
    lab = SimLab(sc, time_scale=time_scale, batch_streams=batch_streams, host=host, port=port)
    try:
        lab.start()
    except LabError as exc:
        click.echo(f"llm-watchdog: {exc}", err=True)
        raise SystemExit(1) from exc
    stop = threading.Event()
    old = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        url = lab.url
        engine = sc.engine.engine
        click.echo(
            f"heat lab: {sc.name} at {url} (time ×{time_scale:g}, "
            f"batch streams {lab.world.batch_streams}, model {sc.engine.model})"
        )
        click.echo("point the daemon at it with these config lines:")
        click.echo("  [server]")
        click.echo(f'  url = "{url}"')
        click.echo(f'  engine = "{engine}"')
        click.echo(f"the simulated card's state: {url}/sim/state  (metrics: {url}/metrics)")
        click.echo(
            "its NVML, for a daemon in another process: "
            f'llm_watchdog.sim.remote.remote_nvml("{url}")'
        )
        click.echo("Ctrl-C stops it.")
        while not stop.wait(0.5):
            pass
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        lab.stop()
        click.echo("heat lab stopped")


@sim.command()
@click.option("--scenario", "-s", required=True, help=_SCENARIO_HELP)
@click.option("--duration", callback=_duration, default=None, help="Simulated time, e.g. 2h.")
@click.option(
    "--controller",
    "-c",
    default="none",
    show_default=True,
    help="none, static:N, a registered name, or package.module:factory[:ARG].",
)
@click.option(
    "--slo-ms",
    type=float,
    default=None,
    callback=_finite_above_zero,
    help="Chat p95 TTFT target (default: scenario's).",
)
@click.option(
    "--warmup",
    callback=_duration,
    default="2m",
    show_default=True,
    help="Leave chat of the first minutes out of the figures.",
)
@click.option(
    "--batch-streams",
    type=click.IntRange(min=0),
    default=None,
    help="The batch job's demand (0: no batch).",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of text.")
@click.option("--minutes", is_flag=True, help="With --json: add the per-minute rows.")
@click.option(
    "--preempt",
    is_flag=True,
    help="The gateway pre-empts the newest batch requests over a lowered allowance.",
)
@_hold_slots
def run(
    scenario: str,
    duration: float | None,
    controller: str,
    slo_ms: float | None,
    warmup: float,
    batch_streams: int | None,
    seed: int,
    as_json: bool,
    minutes: bool,
    preempt: bool,
    hold_slots: bool,
) -> None:
    """Run a scenario in virtual time and print what chat and the batch job got."""
    if minutes and not as_json:
        raise click.UsageError("--minutes adds per-minute rows to the JSON object: add --json")
    sc = _scenario(scenario)
    need_traffic(sc)
    need_a_window(duration if duration is not None else sc.duration_s, warmup, duration is not None)
    try:
        res = run_virtual(
            sc,
            duration,
            controller,
            seed=seed,
            slo_ttft_ms=slo_ms,
            batch_streams=batch_streams,
            warmup_s=warmup or 0.0,
            preempt=preempt,
            hold_slots=hold_slots,
        )
    except ControllerError as exc:
        raise click.BadParameter(str(exc), param_hint="--controller") from exc
    if as_json:
        click.echo(json.dumps(res.to_dict(minutes=minutes)))
        return
    for line in report_lines(res):
        click.echo(line)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f} ms"


def share_text(share: float | None) -> str:
    """A share of windows, rounded down to 0.1 %: 96 of 97 windows (98.97 %) is "98.9 %", not
    a "99.0 %" that reads as meeting the 99 % target it misses."""
    if share is None:
        return "-"
    return f"{math.floor(1000 * share + 1e-9) / 10:.1f} %"


def report_lines(r: RunResult) -> list[str]:
    """The text report of one virtual run."""
    att = share_text(r.slo_attainment)
    met = 0 if r.slo_attainment is None else round(r.slo_attainment * r.slo_windows)
    return [
        f"scenario {r.scenario}, controller {r.controller}: {format_duration(r.duration_s)} "
        f"simulated in {r.wall_s:.1f} s (first {format_duration(r.warmup_s)} left out); "
        f"{line_text(r)}",
        f"chat TTFT   p50 {_ms(r.chat_ttft_p50_ms)}   p95 {_ms(r.chat_ttft_p95_ms)}   "
        f"p99 {_ms(r.chat_ttft_p99_ms)}   ({r.chat_requests} requests)",
        f"SLO         p95 ≤ {r.slo_ttft_ms:,.0f} ms in {met}/{r.slo_windows} one-minute "
        f"windows ({att})",
        f"batch       {r.batch_tokens_per_s:,.1f} tokens/s ({r.batch_chars_per_s:,.0f} chars/s), "
        f"{r.batch_requests} requests done"
        + (f", {r.batch_preempted} pre-empted (their tokens lost)" if r.batch_preempted else ""),
        f"allowance   {r.allowance_changes} changes, final "
        f"{'none' if r.final_allowance is None else r.final_allowance}",
        f"GPU         peak {r.peak_temp_c:.1f} °C, throttled {format_duration(r.throttled_s)} "
        f"(thermal {format_duration(r.thermal_violation_s)}, "
        f"power {format_duration(r.power_violation_s)})",
    ]


def sweep_points(streams: int) -> list[int]:
    """0, 1, 2, 3, 4, 6, 8, 12 … up to the batch job's demand, which is always included."""
    points, n = {0, streams}, 1
    while n < streams:
        points.update(p for p in (n, n + n // 2) if p < streams)
        n *= 2
    return sorted(points)


def peak_demand(sc: Scenario) -> int:
    """The most batch streams the job wants at any time of the scenario: a job that starts
    late, or grows, is swept up to what it grows to, not what it starts with."""
    later = [e.batch_streams for e in sc.schedule if e.batch_streams is not None]
    return max([sc.batch.streams, *later])


SWEEP_WARMUP_S = 120.0
SWEEP_ATTAINMENT = 0.99  # the SLO: chat p95 within target in this share of one-minute windows
MIN_STATE_WINDOWS = 5  # windows a state needs in a run before that run says anything of it


def window_state(m: MinuteRow, sc: Scenario) -> str:
    """The thermal state of one lab window, read as the daemon reads a probe's GPU sample."""
    return thermal_state(
        sm_clock_mhz=m.sm_clock_mhz,
        sm_clock_max_mhz=sc.gpu.sm_clock_max_mhz,
        temp_c=m.temp_c,
        temp_slowdown_c=sc.gpu.temp_slowdown_c,
        reasons=m.reasons & ~GPU_IDLE,  # the window's clock is the one a kernel got
    )


def meets(r: RunResult) -> bool:
    """The run met the SLO in its judged windows. A run that judged none met nothing: counted
    as met, it made a sweep name an allowance from no evidence at all."""
    return r.slo_attainment is not None and r.slo_attainment >= SWEEP_ATTAINMENT


def judged(runs: dict[int, list[RunResult]]) -> int:
    """The one-minute windows the sweep's runs judged, all runs together."""
    return sum(r.slo_windows for rs in runs.values() for r in rs)


def worst(rs: list[RunResult]) -> RunResult:
    """The seed's run with the lowest attainment; one that judged no window comes first, so
    the table shows "-" rather than a share from the other seeds."""
    return min(rs, key=lambda r: -1.0 if r.slo_attainment is None else r.slo_attainment)


def run_static(
    sc: Scenario, allowance: int, duration_s: float | None, seed: int, hold_slots: bool = True
) -> RunResult:
    """One static allowance over the scenario, judged on one-minute windows as `sim run` and
    the benchmark judge it."""
    return run_virtual(
        sc,
        duration_s,
        f"static:{allowance}",
        seed=seed,
        warmup_s=SWEEP_WARMUP_S,
        hold_slots=hold_slots,
    )


def held_points(points: list[int], line: int | None) -> list[int]:
    """Behind a slot line an allowance at or over it lets in what the line lets in: the
    points over it are runs of the line, so the line stands in for them."""
    if line is None or not points or points[-1] <= line:
        return points
    return sorted({p for p in points if p < line} | {line})


def find_static(
    sc: Scenario,
    points: list[int],
    duration_s: float | None = None,
    seed: int = 0,
    *,
    bisect: bool = True,
    hold_slots: bool = True,
    seeds: int = 1,
) -> tuple[int | None, dict[int, list[RunResult]]]:
    """The largest of `points` whose static run meets the SLO in ≥ 99 % of windows at every
    one of `seeds` seeds from `seed`, and every run made (per point, one per seed tried: the
    seeds stop at the first that misses). bisect: assume more batch never helps chat and
    halve the interval (about log2(len(points)) + 2 points); the answer is always one that
    met it. None: chat misses the target even with the smallest point."""
    runs: dict[int, list[RunResult]] = {}

    def ok(i: int) -> bool:
        n = points[i]
        if n not in runs:
            runs[n] = []
            for k in range(seeds):
                runs[n].append(run_static(sc, n, duration_s, seed + k, hold_slots))
                if not meets(runs[n][-1]):
                    break
        return len(runs[n]) == seeds and all(meets(r) for r in runs[n])

    if not bisect:
        good = [p for i, p in enumerate(points) if ok(i)]
        return (max(good) if good else None), runs
    lo, hi = 0, len(points) - 1
    if ok(hi):
        return points[hi], runs
    if not ok(lo):
        return None, runs
    while hi - lo > 1:  # points[lo] meets it, points[hi] does not
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return points[lo], runs


def state_groups(sc: Scenario, runs: dict[int, list[RunResult]]) -> dict[str, list[Group]]:
    """Per thermal state, one group per static allowance: the windows its runs (every seed's)
    spent in that state and how many of them met the target (a group holds at ≥ 99 %)."""
    out: dict[str, list[Group]] = {}
    for allowance, rs in sorted(runs.items()):
        by: dict[str, list[float]] = {}
        for r in rs:
            for m in r.minutes:
                if m.t_s < r.warmup_s or m.chat_p95_ms is None:
                    continue
                by.setdefault(window_state(m, sc), []).append(m.chat_p95_ms)
        slo = rs[0].slo_ttft_ms
        for state, p95s in by.items():
            over = sum(1 for v in p95s if v > slo)
            n = len(p95s)
            if n < MIN_STATE_WINDOWS:
                verdict = "unsure"
            else:
                verdict = "holds" if over <= (1 - SWEEP_ATTAINMENT) * n else "fails"
            group = Group(allowance, allowance, n, over, quantile(p95s, 0.99), verdict, True)
            out.setdefault(state, []).append(group)
    return out


def sweep_rows(sc: Scenario, runs: dict[int, list[RunResult]]) -> list[StateRow]:
    """The sweep's answer in `headroom`'s form: per thermal state, the static allowance whose
    windows in that state met the target, with the windows behind it."""
    groups = state_groups(sc, runs)
    rows = []
    for state in STATES:
        if state in groups:
            row = decide_row(
                state,
                groups[state],
                "windows",
                "at static allowance {}",
                share=1 - SWEEP_ATTAINMENT,
            )
            rows.append(dataclasses.replace(row, groups=tuple(groups[state])))
    return rows


@sim.command()
@click.option("--scenario", "-s", required=True, help=_SCENARIO_HELP)
@click.option(
    "--duration",
    callback=_duration,
    default=None,
    help="Simulated time per run (default: the scenario's, through every event).",
)
@click.option(
    "--allowances",
    default=None,
    help="Comma-separated allowances, each run (default: 0, 1, 2, 4 … up to the peak "
    "demand, bisected).",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--seeds",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Judge each allowance on this many seeds from --seed: it holds only where every one "
    "meets the target (a static at the edge can hold on one seed and miss on the next).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per run, then the answer.")
@_hold_slots
def sweep(
    scenario: str,
    duration: float | None,
    allowances: str | None,
    seed: int,
    seeds: int,
    as_json: bool,
    hold_slots: bool,
) -> None:
    """The static allowance this card holds the SLO at, and per thermal state what it takes.

    Each allowance runs as static over the whole scenario with the card's physics on and is
    judged on one-minute windows, as the SLO is.
    """
    sc = _scenario(scenario)
    need_traffic(sc)
    need_a_window(
        duration if duration is not None else sc.duration_s, SWEEP_WARMUP_S, duration is not None
    )
    line = slot_line(sc.engine.max_running_seqs) if hold_slots else None
    if allowances:
        try:
            points = sorted({int(x) for x in allowances.split(",") if x.strip()})
        except ValueError as exc:
            raise click.BadParameter(
                "give whole numbers like 0,2,4,8", param_hint="--allowances"
            ) from exc
        if any(p < 0 for p in points) or not points:
            raise click.BadParameter("allowances must be ≥ 0", param_hint="--allowances")
    else:
        points = held_points(sweep_points(peak_demand(sc)), line)
    if duration is not None:
        last = max((e.at_s for e in sc.schedule), default=0.0)
        if duration <= last:
            click.echo(
                f"note: --duration {format_duration(duration)} ends before the schedule's "
                f"last event at {format_duration(last)}; the answer does not cover it",
                err=True,
            )
    answer, runs = find_static(
        sc, points, duration, seed, bisect=not allowances, hold_slots=hold_slots, seeds=seeds
    )
    windows = judged(runs)
    if not windows:
        answer = None  # no window judged, no verdict; find_static gives None here already
    rows = sweep_rows(sc, runs)
    slo = sc.slo_chat_ttft_p95_ms
    if as_json:
        for n, rs in sorted(runs.items()):
            for k, r in enumerate(rs):
                click.echo(
                    json.dumps(
                        {
                            "allowance": n,
                            "seed": seed + k,
                            "slo_attainment": r.slo_attainment,
                            "slo_windows": r.slo_windows,
                            "chat_p95_ms": r.chat_ttft_p95_ms,
                            "batch_tokens_per_s": round(r.batch_tokens_per_s, 2),
                            "peak_temp_c": r.peak_temp_c,
                            "throttled_s": round(r.throttled_s, 1),
                        }
                    )
                )
        click.echo(
            json.dumps(
                {
                    "static_allowance": answer,
                    "windows_judged": windows,
                    "states": [row.to_dict() for row in rows],
                    "target_ms": slo,
                    "slot_line": line,
                    "seeds": list(range(seed, seed + seeds)),
                }
            )
        )
        return
    span = duration if duration is not None else sc.duration_s
    click.echo(
        f"scenario {sc.name}: chat p95 TTFT target {slo:,.0f} ms in ≥ 99 % of one-minute "
        f"windows, {format_duration(span)} per run, batch demand up to {peak_demand(sc)}"
    )
    click.echo(
        f"the lab's gateway holds batch under the slot line {line} of the engine's "
        f"{sc.engine.max_running_seqs} slots, as the shipped gateway does (--no-hold-slots: "
        "no line)"
        if line is not None
        else "no slot line at the gateway (--no-hold-slots): as behind HAProxy or a command "
        "actuator"
    )
    if seeds > 1:
        click.echo(
            f"each allowance judged on seeds {seed}-{seed + seeds - 1}: it holds only where "
            "every seed meets the target (the seeds stop at the first that misses; windows: "
            "the worst seed's, tok/s: their mean; per state: every seed's windows together)"
        )
    click.echo(
        f"{'allowance':>9}  {'windows':>8}  {'cool p95':>10}  {'warm p95':>10}  "
        f"{'hot p95':>10}  {'tok/s':>8}  {'peak':>8}"
    )
    groups = state_groups(sc, runs)

    few = False

    def p99(state: str, n: int) -> str:
        nonlocal few
        g = next((g for g in groups.get(state, []) if g.lo == n), None)
        if g is None:
            return "-"
        if g.n < MIN_STATE_WINDOWS:  # shown, but too few to count for or against
            few = True
            return f"({_ms(g.p95_ms)})"
        return _ms(g.p95_ms)

    for n, rs in sorted(runs.items()):
        att = share_text(worst(rs).slo_attainment)
        tok = sum(r.batch_tokens_per_s for r in rs) / len(rs)
        peak = max(r.peak_temp_c for r in rs)
        click.echo(
            f"{n:>9}  {att:>8}  {p99('cool', n):>10}  {p99('warm', n):>10}  {p99('hot', n):>10}"
            f"  {tok:>8,.1f}  {peak:>5.1f} °C"
        )
    click.echo("(per state: the chat p95 that 99 % of its one-minute windows stayed under)")
    if few:
        click.echo(
            f"(in brackets: from fewer than {MIN_STATE_WINDOWS} windows in that state, too few "
            "to count for or against the allowance)"
        )
    click.echo("state   allowance  (confidence, windows, bands)")
    for row in rows:
        click.echo(describe(row))
    said = {r.state: r.allowance for r in rows}
    states = ", ".join(
        f"{st} {'-' if said.get(st) is None else said[st]}"
        for st in STATES
        if st != "no-gpu" or st in said
    )
    if not rows:
        states += " (no chat windows to judge in this scenario)"
    click.echo(f"largest allowance within the target: {states}")
    if not windows:
        click.echo(
            "static: no answer; no run had a one-minute window with chat after the "
            f"{format_duration(SWEEP_WARMUP_S)} warm-up to judge"
        )
    elif answer is None:
        click.echo("static: none; chat misses the target in over 1 % of windows even with no batch")
    else:
        above = (
            f"; behind the slot line {line} any larger allowance lets in the same"
            if line is not None and answer >= line
            else ""
        )
        at = "" if seeds == 1 else f" at every seed {seed}-{seed + seeds - 1}"
        click.echo(
            f"static: {answer} holds the target in ≥ 99 % of windows over the whole scenario"
            + at
            + above
        )


def _scenario_list() -> str:
    judged = [n for n in available_scenarios() if n not in PLAYED_LIVE]
    live = [n for n in available_scenarios() if n in PLAYED_LIVE]
    return (
        f"{', '.join(judged)}; and {', '.join(live)}, which `llm-watchdog demo --scenario` "
        "plays with real clients (no chat of their own to run or sweep here)"
    )


sim.help = (
    sim.help or ""
) + f"\n\nBundled scenarios: {_scenario_list()}. Controllers: {', '.join(controller_names())}."
