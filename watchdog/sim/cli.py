"""`llm-watchdog sim …`: the heat lab from the command line.

    sim serve --scenario consumer-warm-room --time-scale 20     real time, real sockets
    sim run   --scenario consumer-warm-room --duration 2h --controller static:4
    sim sweep --scenario consumer-warm-room                     allowance → chat p95 cool/hot

A thin layer: the work is in server.py (SimLab) and virtual.py (run_virtual).
"""

from __future__ import annotations

import json
import signal
import threading
from typing import Any

import click

from llm_watchdog.durations import format_duration, parse_duration
from llm_watchdog.errors import EX_CONFIG
from llm_watchdog.sim.controllers import ControllerError, controller_names
from llm_watchdog.sim.scenario import Scenario, ScenarioError, available_scenarios, load_scenario
from llm_watchdog.sim.server import LabError, SimLab
from llm_watchdog.sim.virtual import RunResult, run_virtual


def _scenario(name: str) -> Scenario:
    try:
        return load_scenario(name)
    except ScenarioError as exc:
        if "not found" in str(exc):
            raise click.BadParameter(str(exc), param_hint="--scenario") from exc
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(EX_CONFIG) from exc


def _duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


_SCENARIO_HELP = "A bundled scenario name (see `sim --help`) or a .toml path."


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
    type=int,
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
        click.echo(f"error: {exc}", err=True)
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
    "--slo-ms", type=float, default=None, help="Chat p95 TTFT target (default: scenario's)."
)
@click.option(
    "--warmup",
    callback=_duration,
    default="2m",
    show_default=True,
    help="Leave chat of the first minutes out of the figures.",
)
@click.option("--batch-streams", type=int, default=None, help="The batch job's demand.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of text.")
@click.option("--minutes", is_flag=True, help="With --json: add the per-minute rows.")
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
) -> None:
    """Run a scenario in virtual time and print what chat and the batch job got."""
    sc = _scenario(scenario)
    try:
        res = run_virtual(
            sc,
            duration,
            controller,
            seed=seed,
            slo_ttft_ms=slo_ms,
            batch_streams=batch_streams,
            warmup_s=warmup or 0.0,
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


def report_lines(r: RunResult) -> list[str]:
    """The text report of one virtual run."""
    att = "-" if r.slo_attainment is None else f"{100 * r.slo_attainment:.1f} %"
    met = 0 if r.slo_attainment is None else round(r.slo_attainment * r.slo_windows)
    return [
        f"scenario {r.scenario}, controller {r.controller}: {format_duration(r.duration_s)} "
        f"simulated in {r.wall_s:.1f} s (first {format_duration(r.warmup_s)} left out)",
        f"chat TTFT   p50 {_ms(r.chat_ttft_p50_ms)}   p95 {_ms(r.chat_ttft_p95_ms)}   "
        f"p99 {_ms(r.chat_ttft_p99_ms)}   ({r.chat_requests} requests)",
        f"SLO         p95 ≤ {r.slo_ttft_ms:,.0f} ms in {met}/{r.slo_windows} one-minute "
        f"windows ({att})",
        f"batch       {r.batch_tokens_per_s:,.1f} tokens/s ({r.batch_chars_per_s:,.0f} chars/s), "
        f"{r.batch_requests} requests done",
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


def run_sweep(
    sc: Scenario, duration_s: float, allowances: list[int], seed: int = 0
) -> list[dict[str, Any]]:
    """Per static allowance: chat p95 and batch throughput with the card cool and hot.

    Cool: the card held at its starting temperature (first 2 minutes left out). Hot: the
    card's physics on, judged over the second half of the run, once it has heated.
    """
    rows = []
    for n in allowances:
        cool = run_virtual(sc, duration_s, f"static:{n}", seed=seed, thermal=False, warmup_s=120.0)
        hot = run_virtual(sc, duration_s, f"static:{n}", seed=seed, warmup_s=duration_s / 2)
        rows.append(
            {
                "allowance": n,
                "cool_chat_p95_ms": cool.chat_ttft_p95_ms,
                "cool_slo_attainment": cool.slo_attainment,
                "cool_batch_tokens_per_s": round(cool.batch_tokens_per_s, 2),
                "hot_chat_p95_ms": hot.chat_ttft_p95_ms,
                "hot_slo_attainment": hot.slo_attainment,
                "hot_batch_tokens_per_s": round(hot.batch_tokens_per_s, 2),
                "hot_peak_temp_c": hot.peak_temp_c,
                "hot_throttled_s": round(hot.throttled_s, 1),
            }
        )
    return rows


def best_allowance(rows: list[dict[str, Any]], which: str, slo: float) -> int | None:
    ok = [
        r["allowance"]
        for r in rows
        if r[f"{which}_chat_p95_ms"] is not None and r[f"{which}_chat_p95_ms"] <= slo
    ]
    return max(ok) if ok else None


@sim.command()
@click.option("--scenario", "-s", required=True, help=_SCENARIO_HELP)
@click.option(
    "--duration",
    callback=_duration,
    default="30m",
    show_default=True,
    help="Simulated time per run (two runs per allowance).",
)
@click.option(
    "--allowances",
    default=None,
    help="Comma-separated allowances (default: 0, 1, 2, 4 … up to the demand).",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per allowance.")
def sweep(scenario: str, duration: float, allowances: str | None, seed: int, as_json: bool) -> None:
    """How much batch the card can take cool and hot: static allowance → chat p95."""
    sc = _scenario(scenario)
    if allowances:
        try:
            points = sorted({int(x) for x in allowances.split(",") if x.strip()})
        except ValueError as exc:
            raise click.BadParameter(
                "give whole numbers like 0,2,4,8", param_hint="--allowances"
            ) from exc
        if any(p < 0 for p in points):
            raise click.BadParameter("allowances must be ≥ 0", param_hint="--allowances")
    else:
        points = sweep_points(sc.batch.streams)
    rows = run_sweep(sc, duration, points, seed)
    if as_json:
        for row in rows:
            click.echo(json.dumps(row))
        return
    slo = sc.slo_chat_ttft_p95_ms
    click.echo(
        f"scenario {sc.name}: chat p95 TTFT target {slo:,.0f} ms, "
        f"{format_duration(duration)} per run"
    )
    click.echo(
        f"{'allowance':>9}  {'cool p95':>10}  {'hot p95':>10}  {'cool tok/s':>10}  "
        f"{'hot tok/s':>10}  {'hot peak':>8}"
    )
    for r in rows:
        click.echo(
            f"{r['allowance']:>9}  {_ms(r['cool_chat_p95_ms']):>10}  "
            f"{_ms(r['hot_chat_p95_ms']):>10}  "
            f"{r['cool_batch_tokens_per_s']:>10,.1f}  {r['hot_batch_tokens_per_s']:>10,.1f}  "
            f"{r['hot_peak_temp_c']:>6.1f} °C"
        )
    cool, hot = best_allowance(rows, "cool", slo), best_allowance(rows, "hot", slo)
    click.echo(f"largest allowance within the target: cool {cool}, hot {hot}")
    if cool is not None and hot is not None and hot < cool:
        click.echo(f"once hot, this card needs {cool - hot} fewer batch streams to keep chat fast")
    elif cool is not None and hot is not None:
        click.echo("heat does not change the allowance this card can take")


def _scenario_list() -> str:
    return ", ".join(available_scenarios())


sim.help = (
    sim.help or ""
) + f"\n\nBundled scenarios: {_scenario_list()}. Controllers: {', '.join(controller_names())}."
